"""The semantics every other layer reads: what a collective is and what an algorithm is.

- :mod:`~ringtree.ir.collectives` — one :class:`CollectiveSpec` per collective (blocks,
  postcondition, counts, wire codes);
- :mod:`~ringtree.ir.program` — Programs, Steps, chunk references (the schedule IR);
- :mod:`~ringtree.ir.check` — the symbolic checker (postconditions, bitwise agreement),
  which runs Programs on paper with :mod:`~ringtree.ir.walk`;
- :mod:`~ringtree.ir.wire` — the call's identity (:class:`WireHeader`), on every message.

Nothing here imports a schedule, a transport or the runtime.
"""
