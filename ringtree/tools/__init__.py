"""Tools: ``ringtree algo`` and the schedule drawings that read the schedule library, and
``figure``, the one place matplotlib is imported."""
