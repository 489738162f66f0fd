"""Choosing how a call runs: the cost model over the schedules' statistics
(:mod:`~ringtree.tuning.tuner`), the protocol choice (:mod:`~ringtree.tuning.proto`),
the measured links between hosts (:mod:`~ringtree.tuning.links`), the online choice
(:mod:`~ringtree.tuning.autotune`) and the proof it may choose by timing
(:mod:`~ringtree.tuning.same_bits`)."""
