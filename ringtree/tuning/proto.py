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
contributions larger than a cell — except all_reduce and all_gather, which stream through
the cells).

The default choice (:func:`choose_protocol`) is the tuner's, over (algorithm, protocol)
pairs as NCCL's one cost table (``src/graph/tuning.cc``, ``ncclTopoTuneModel``):
:func:`rank_pairs` prices every enabled Simple algorithm with the tuner's model
(:func:`ringtree.tuning.tuner.ranking`) and the one-round Program LL runs with LL's
coefficients (:func:`ll_cost`: a latency per call, one synchronisation, and a cost per
byte). The per-byte cost is calibrated on the crossovers measured with
``benchmarks/ll_threshold.py`` (:data:`THRESHOLDS`): it puts LL's cost equal to the best
Simple estimate half a byte above each measured threshold, so the priced choice is LL at
every size up to the threshold and Simple from the next power of two on (LL's cost is a
line below Simple's at zero bytes; Simple's estimate steps where its slices are added, so
the exact crossing lies in between; ``tests/test_proto_priced.py`` checks every power of
two). Every input to the choice is the same on every rank, so all ranks pick
the same protocol for the same call.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ringtree.ir.collectives import parse_list
from ringtree.ir.program import Collective

LL, SIMPLE = "ll", "simple"
PROTOCOLS = {"ll": LL, "simple": SIMPLE}
LL_COLLECTIVES = frozenset({Collective.ALL_REDUCE, Collective.REDUCE,
                            Collective.REDUCE_SCATTER, Collective.BROADCAST,
                            Collective.ALL_GATHER, Collective.BARRIER})

# LL's latency: one call that publishes and waits, through Communicator.all_reduce of 8
# bytes on the 2-core development host (benchmarks/allreduce_peers.py): 0.9 us on one
# rank, 2.4-4 us on two; LL_RANK per further rank is this module's estimate from the
# polling (a look at every peer's line), not a fit.
LL_CALL = 1.0e-6
LL_RANK = 2.0e-6

# Largest call (bytes of the whole buffer: input for reductions and broadcast, output for
# all_gather) that LL carried in the measurements, per collective: (2 ranks, more ranks);
# ll_cost's per-byte term is calibrated on them. Measured with benchmarks/ll_threshold.py
# on the 2-core development host (LL against the executor's best schedule, same run).
# Since LL's round runs compiled (transports/_llc.c), with 3, 4 and 8 ranks LL wins
# all_reduce up to 2 MiB (1.1x at 2 MiB on 8 ranks, 0.9x at 4 MiB; 4 ranks 1.1x at
# 4 MiB), reduce and reduce_scatter at every size a cell holds (2.5-3.2x at 1 MiB on 4
# and 8 ranks); before, in Python, only to 16 KiB (all_reduce, reduce) and 64 KiB
# (reduce_scatter). Broadcast and all_gather: every size a cell holds (5-20x at 1 MiB);
# with 2 ranks every collective up to the cell (1 MiB) except broadcast (0.7x at 1 MiB),
# and all_reduce, which streams through the cells, up to 16 MiB (1.1x; 0.9x at 64 MiB).
# all_gather streams too (runtime/protocols/ll_gather.py): through the communicator, 2
# ranks pinned, against the ring in the same job, LL won to 4 MiB (1.7x at 1 MiB, 1.3x at
# 4 MiB) and tied or lost from 8 MiB (0.86-1.02x to 64 MiB); 4 ranks: 6.6x at 1 MiB, 1.9x
# at 4 MiB, 0.96x at 16 MiB (loaded machine, load 4-5). all_reduce from 256 KiB runs as
# a reduce-scatter and an all-gather through the segment (runtime/protocols/ll_split.py);
# benchmarks/ll_split.py, LL forced against the ring in alternated jobs through the
# communicator (load 3.4-5.3): 4 ranks 2.5-5.2x faster from 1 to 64 MiB, 8 ranks
# 1.5-2.6x from 2 to 64 MiB, 2 ranks 1.08x at 8 MiB and 1.02x at 16 MiB but 0.78x at
# 64 MiB (0.67-0.79x from 16 MiB in a slow phase of the machine). Above 8 ranks (64 KiB
# cells) not measured. Where peers may read and write each other's memory, the planner
# takes LL's single-copy all-reduce from its own crossover whatever these say
# (runtime/protocols/ll_direct_fold.py, MIN_BYTES: ahead of the split and the ring from
# 4 MiB on 2 ranks); these thresholds are the choice without it (RINGTREE_CMA=0).
THRESHOLDS: dict[Collective, tuple[int, int]] = {
    Collective.ALL_REDUCE: (16 << 20, 64 << 20),
    Collective.REDUCE: (1 << 20, 1 << 20),
    Collective.REDUCE_SCATTER: (1 << 20, 1 << 20),
    Collective.BROADCAST: (256 << 10, 1 << 20),
    Collective.ALL_GATHER: (4 << 20, 4 << 20),
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


def ll_latency(nranks: int) -> float:
    """Seconds of one LL call that moves nothing (a publication and a wait)."""
    return LL_CALL + LL_RANK * (max(nranks, 2) - 1)


def ll_cost(coll: Collective, nbytes: int, nranks: int, model) -> float:
    """Predicted seconds of LL's one-round Program for ``coll`` on ``nbytes``, next to
    ``model`` (the tuner's :class:`~ringtree.tuning.tuner.LinkModel` the Simple
    estimates come from): latency + bytes × the calibrated per-byte cost. One rank is
    priced as two (the model's Simple estimate is 0 there). The simulator may call this
    to price an LL call."""
    return ll_latency(nranks) + _ll_beta(coll, max(nranks, 2), model) * nbytes


@lru_cache(maxsize=1024)
def _ll_beta(coll: Collective, nranks: int, model) -> float:
    """Seconds per byte that make LL and the best Simple estimate cross half a byte above
    the measured threshold (none: LL was measured faster at every size)."""
    two, more = THRESHOLDS[coll]
    limit = two if nranks <= 2 else more
    if limit >= 1 << 62:
        return 0.0
    x = limit + 0.5
    return max(0.0, (_simple_best(coll, x, nranks, None, model) - ll_latency(nranks)) / x)


def _simple_best(coll: Collective, nbytes: float, nranks: int, enabled, model) -> float:
    from ringtree.tuning.tuner import ranking

    ranked = ranking(coll, int(nbytes), max(nranks, 2), enabled, model)
    return ranked[0][1] if ranked else math.inf


def rank_pairs(coll: Collective, nbytes: int, nranks: int, enabled_algos: set[str] | None,
               model, ll_algo: str | None) -> list[tuple[tuple[str, str], float]]:
    """Every (algorithm, protocol) pair that can run a call of ``nbytes``, with its
    predicted seconds, best first: the enabled Simple algorithms, and ``ll_algo`` on LL
    when it is not None (LL serves the call here and it fits the cells)."""
    from ringtree.tuning.tuner import ranking

    pairs = [((a, SIMPLE), t) for a, t in ranking(coll, nbytes, max(nranks, 2),
                                                   enabled_algos, model)]
    if ll_algo is not None:
        pairs.append(((ll_algo, LL), ll_cost(coll, nbytes, nranks, model)))
    return sorted(pairs, key=lambda p: p[1])


def choose_protocol(coll: Collective | None, nbytes: int, nranks: int,
                    enabled: set[str] | None, ll_ok: bool, model=None,
                    enabled_algos: set[str] | None = None) -> str:
    """LL or Simple for a call moving ``nbytes``: the protocol of the cheapest pair
    (:func:`rank_pairs`) under ``model`` (default: the shared-memory one).

    ``ll_ok``: LL can run this call here (one host, shm, fits the cells). ``enabled``:
    the protocols RINGTREE_PROTO leaves for the collective (None: both)."""
    if coll not in LL_COLLECTIVES or not ll_ok:
        return SIMPLE
    if enabled is not None and SIMPLE not in enabled:
        return LL
    if enabled is not None and LL not in enabled:
        return SIMPLE
    if model is None:
        from ringtree.tuning.tuner import MODELS

        model = MODELS["shm"]
    simple = _simple_best(coll, nbytes, nranks, enabled_algos, model)
    return LL if ll_cost(coll, nbytes, nranks, model) < simple else SIMPLE
