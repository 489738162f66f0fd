"""Protocols: ``LL`` (one shared segment per host, :mod:`ringtree.transports.shm_ll`) and
``Simple`` (the schedule IR run by the executor), chosen per call by size.

``RINGTREE_PROTO`` takes NCCL_PROTO's syntax (``tuning.cc::parseList``): semicolon-separated
entries, only the first may omit its ``collective:`` prefix (it then applies to every
collective), a list starting with ``^`` disables the listed protocols instead of enabling
only them; names are case-insensitive. ``LL``, ``Simple``, ``^LL``,
``Simple;allreduce:LL``, ``LL;broadcast:^LL`` are all valid. Unknown names are errors.

LL serves all_reduce, reduce, reduce_scatter, broadcast, all_gather and barrier when every
rank of the communicator is on one host and the shared-memory transport is in use; a
forced ``LL`` falls back to Simple where LL cannot run (other collectives, send/recv,
contributions larger than a cell — except all_reduce, which streams through the cells).

The default choice (:func:`choose_protocol`) is a size threshold per collective and
rank count, measured with ``benchmarks/ll_threshold.py`` on the development host (see the
table's comments). Every input to the choice is the same on every rank, so all ranks pick
the same protocol for the same call.
"""

from __future__ import annotations

from ringtree.ir.collectives import parse_list
from ringtree.ir.program import Collective

LL, SIMPLE = "ll", "simple"
PROTOCOLS = {"ll": LL, "simple": SIMPLE}
LL_COLLECTIVES = frozenset({Collective.ALL_REDUCE, Collective.REDUCE,
                            Collective.REDUCE_SCATTER, Collective.BROADCAST,
                            Collective.ALL_GATHER, Collective.BARRIER})

# Largest call (bytes of the whole buffer: input for reductions and broadcast, output for
# all_gather) that LL carries by default, per collective: (2 ranks, more ranks). Measured
# with benchmarks/ll_threshold.py on the 2-core development host (LL against the
# executor's best schedule, same run): with 4 ranks LL wins all_reduce and reduce up to
# 16 KiB (0.5-0.7x at 64 KiB), reduce_scatter up to 64 KiB, broadcast and all_gather at
# every size a cell holds (5-20x at 1 MiB); with 2 ranks every collective up to the cell
# (1 MiB) except broadcast (0.7x at 1 MiB), and all_reduce, which streams through the
# cells, up to 16 MiB (1.1x; 0.9x at 64 MiB).
THRESHOLDS: dict[Collective, tuple[int, int]] = {
    Collective.ALL_REDUCE: (16 << 20, 16 << 10),
    Collective.REDUCE: (1 << 20, 16 << 10),
    Collective.REDUCE_SCATTER: (1 << 20, 64 << 10),
    Collective.BROADCAST: (256 << 10, 1 << 20),
    Collective.ALL_GATHER: (1 << 20, 1 << 20),
    Collective.BARRIER: (1 << 62, 1 << 62),
}


def parse_proto_spec(spec: str) -> dict[Collective, set[str]]:
    """Enabled protocols per collective after applying ``spec`` (both enabled initially)."""
    enabled = {c: {LL, SIMPLE} for c in Collective}
    for colls, negate, names, _ in parse_list(spec, "RINGTREE_PROTO"):
        unknown = [n for n in names if n not in PROTOCOLS]
        if unknown or not names:
            raise ValueError(f"RINGTREE_PROTO: unknown protocol(s) {unknown or names} in "
                             f"{spec!r}; known: LL, Simple")
        chosen = {PROTOCOLS[n] for n in names}
        for c in colls:
            enabled[c] = {LL, SIMPLE} - chosen if negate else chosen
            if not enabled[c]:
                raise ValueError(f"RINGTREE_PROTO={spec!r} leaves no protocol for {c.value}")
    return enabled


def choose_protocol(coll: Collective | None, nbytes: int, nranks: int,
                    enabled: set[str] | None, ll_ok: bool) -> str:
    """LL or Simple for a call moving ``nbytes`` (see :data:`THRESHOLDS`).

    ``ll_ok``: LL can run this call here (one host, shm, fits the cells). ``enabled``:
    the protocols RINGTREE_PROTO leaves for the collective (None: both)."""
    if coll not in LL_COLLECTIVES or not ll_ok:
        return SIMPLE
    if enabled is not None and SIMPLE not in enabled:
        return LL
    if enabled is not None and LL not in enabled:
        return SIMPLE
    two, more = THRESHOLDS[coll]
    return LL if nbytes <= (two if nranks <= 2 else more) else SIMPLE
