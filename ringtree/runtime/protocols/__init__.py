"""Protocols: which runner serves which (collective, algorithm).

A plan is a Program × a protocol, as in NCCL, where the protocol is a template parameter
of every algorithm's kernel (``runRing<T, RedOp, ProtoLL>``, ``src/device/all_reduce.h``)
and one cost table ranks (algorithm, protocol) pairs (``src/graph/tuning.cc``):

- *Simple* runs every Program: the executor, over the transports' framed messages.
- *LL* (:mod:`ringtree.runtime.protocols.ll`) runs one-round Programs through one shared
  segment on a host; it registers here the schedules whose semantics it implements
  (the ``direct`` schedules of :mod:`ringtree.schedules.direct`) and builds its prepared
  op from the Program (the order in which a rank folds the contributions, which block of
  each it reads), refusing a Program of another form.

The tuner prices the pairs (:func:`ringtree.tuning.proto.rank_pairs`); the planner asks
:func:`algorithm` which Program a protocol would run for a collective.
"""

from __future__ import annotations

from ringtree.ir.program import Collective
from ringtree.tuning.proto import LL, SIMPLE

__all__ = ["LL", "SIMPLE", "algorithm", "register", "serves"]

_SERVES: dict[str, dict[Collective, str]] = {}


def register(protocol: str, coll: Collective, algo: str) -> None:
    """``protocol``'s runner runs ``coll``'s ``algo`` Programs (one algorithm per
    collective and protocol besides Simple, which runs them all)."""
    table = _SERVES.setdefault(protocol, {})
    if table.get(coll, algo) != algo:
        raise ValueError(f"{protocol} already runs {table[coll]} for {coll.value}")
    table[coll] = algo


def algorithm(protocol: str, coll: Collective | None) -> str | None:
    """The algorithm ``protocol`` runs for ``coll`` (None: it serves no such call)."""
    return _SERVES.get(protocol, {}).get(coll)  # type: ignore[arg-type]


def serves(protocol: str, coll: Collective, algo: str) -> bool:
    return protocol == SIMPLE or algorithm(protocol, coll) == algo


from ringtree.runtime.protocols import ll as _ll  # noqa: E402,F401 - registers LL
