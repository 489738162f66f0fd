"""The core: the schedule IR and the readers that run, check and choose it.

- :mod:`~ringtree.core.ir` — Programs, Steps, chunk references (what an algorithm is);
- :mod:`~ringtree.core.plan` — compiling a Program for one call (regions, slices, deps);
- :mod:`~ringtree.core.executor` — running compiled calls over the transports;
- :mod:`~ringtree.core.check` — the symbolic checker (postconditions, bitwise agreement);
- :mod:`~ringtree.core.tuner` — ``RINGTREE_ALGO`` and the cost model that picks an algorithm.
"""
