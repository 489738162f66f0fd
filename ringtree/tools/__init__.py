"""Tools that read the schedule library: ``ringtree algo`` and the schedule drawings."""
