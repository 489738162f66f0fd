"""One record per collective: every fact about it that more than one reader needs.

nccl-tests keeps one ``testColl`` table per collective (``src/all_reduce.cu``: buffer
sizes, in-place offsets, bus bandwidth) and msccl-tools one class per collective
(``init_buffers``, ``check``). ringtree's :class:`CollectiveSpec` is that table for the
whole package, read by:

- the IR (:mod:`ringtree.ir.program`): blocks per buffer, in-place storage aliasing;
- the checker (:mod:`ringtree.ir.check`): the postcondition, and whether every rank
  must hold the same bits;
- the API (:mod:`ringtree.api`): whether and where the operands alias in place;
- ``ringtree perf`` (:mod:`ringtree.perf.bw`): nccl-tests' counts, in-place offsets and
  bus-bandwidth factor;
- the tuner (:mod:`ringtree.tuning.tuner`): the default algorithm;
- the wire decoder (:mod:`ringtree.ir.wire`): the collective's code in message headers.

Blocks: a buffer of a collective with ``count`` elements per block holds 1 block, or one
per rank (:data:`PER_RANK`), or none (the barrier). Aliasing in place follows torch and
NCCL: the same array (``SAME``), the input being this rank's block of the output
(``IN_OUTPUT``: all-gather, gather), or the output this rank's block of the input
(``OUT_INPUT``: reduce-scatter, scatter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

PER_RANK = -1                                     # a block per rank
SAME, IN_OUTPUT, OUT_INPUT = "same", "input in output", "output in input"
Sources = Callable[[int, int, int, int, int, int], "set[tuple[int, int]] | None"]


class Collective(str, Enum):
    """Collectives the IR can express. Values are the nccl-tests / NCCL names."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    ALL_TO_ALL = "all_to_all"
    BARRIER = "barrier"

    @property
    def spec(self) -> CollectiveSpec:
        return SPECS[self]

    @property
    def code(self) -> int:
        """Position in the enumeration (the wire code in message headers)."""
        return SPECS[self].code

    @property
    def reduces(self) -> bool:
        return SPECS[self].reduces

    def blocks(self, nranks: int) -> tuple[int, int]:
        """(input blocks, output blocks): how many ``count``-element blocks each buffer has."""
        return SPECS[self].blocks(nranks)


@dataclass(frozen=True)
class CollectiveSpec:
    """The facts of one collective (see the module docstring for who reads which)."""

    coll: Collective
    code: int                   # wire code in message headers
    in_blocks: int              # 1, 0 or PER_RANK
    out_blocks: int
    reduces: bool = False
    rooted: bool = False
    alias: str | None = None    # how the operands sit when in place (SAME, IN_OUTPUT, ...)
    in_place: bool = True       # ringtree runs it in place when the operands alias
    agree: bool = False         # every rank's output must be the same bits
    busbw: Callable[[int], float] = lambda n: 1.0   # nccl-tests' busbw / algbw factor
    perf_name: str = ""         # ringtree perf's (nccl-tests') name
    default_algo: str = "ring"  # the tuner's choice when nothing else applies
    sources: Sources | None = None  # the postcondition (see :meth:`expected`)

    def blocks(self, nranks: int) -> tuple[int, int]:
        return (nranks if self.in_blocks == PER_RANK else self.in_blocks,
                nranks if self.out_blocks == PER_RANK else self.out_blocks)

    @property
    def per_rank(self) -> bool:
        """Is some buffer a block per rank (nccl-tests then splits the size by ranks)?"""
        return PER_RANK in (self.in_blocks, self.out_blocks)

    def volume(self, nranks: int) -> int:
        """nccl-tests' algbw bytes per ``count · typesize``."""
        return nranks if self.per_rank else 1

    def inplace_offsets(self, count: int) -> tuple[int, int]:
        """nccl-tests' (send, recv) in-place offsets per rank, in elements: the operand
        sits at ``recvbuff + offset · rank``."""
        return (count if self.alias == IN_OUTPUT else 0, count if self.alias == OUT_INPUT else 0)

    def output_alias(self, rank: int, chunks: int, j: int) -> int | None:
        """In place, the input chunk that stores output chunk ``j`` (None: its own)."""
        if self.alias == SAME:
            return j
        if self.alias == IN_OUTPUT and self.in_place:
            return j % chunks if j // chunks == rank else None
        if self.alias == OUT_INPUT and self.in_place:
            return rank * chunks + j
        return None

    def output_alias_runs(self, rank: int, chunks: int, lo: int, hi: int
                          ) -> list[tuple[int | None, int, int]]:
        """:meth:`output_alias` of output chunks ``lo``..``hi``−1 as runs ``(first, a,
        b)``: chunks a..b−1 are stored at input chunks first.. (None: their own)."""
        if self.alias == SAME:
            return [(lo, lo, hi)]
        if self.alias == OUT_INPUT and self.in_place:
            return [(rank * chunks + lo, lo, hi)]
        if self.alias == IN_OUTPUT and self.in_place:
            a, b = max(lo, rank * chunks), min(hi, (rank + 1) * chunks)
            if a >= b:
                return [(None, lo, hi)]
            runs = [(None, lo, a)] if lo < a else []
            runs.append((a - rank * chunks, a, b))
            return runs + ([(None, b, hi)] if b < hi else [])
        return [(None, lo, hi)]

    def expected(self, nranks: int, rank: int, root: int, chunks: int, j: int
                 ) -> set[tuple[int, int]] | None:
        """The postcondition: the (rank, input chunk) contributions output chunk ``j`` of
        ``rank`` must hold, or None if that chunk is not defined on that rank."""
        if self.sources is None:
            return None
        return self.sources(nranks, rank, root, chunks, j // chunks, j % chunks)


def _ring(n: int) -> float:
    return (n - 1) / n


def _spec(coll: Collective, in_blocks: int, out_blocks: int, sources: Sources | None,
          **kw) -> CollectiveSpec:
    return CollectiveSpec(coll, list(Collective).index(coll), in_blocks, out_blocks,
                          sources=sources, perf_name=kw.pop("perf_name", coll.value), **kw)


N = PER_RANK
SPECS: dict[Collective, CollectiveSpec] = {s.coll: s for s in (
    _spec(Collective.ALL_REDUCE, 1, 1, lambda n, r, root, c, b, s: {(q, s) for q in range(n)},
          reduces=True, alias=SAME, agree=True, busbw=lambda n: 2 * (n - 1) / n),
    _spec(Collective.ALL_GATHER, 1, N, lambda n, r, root, c, b, s: {(b, s)},
          alias=IN_OUTPUT, busbw=_ring),
    _spec(Collective.REDUCE_SCATTER, N, 1,
          lambda n, r, root, c, b, s: {(q, r * c + s) for q in range(n)},
          reduces=True, alias=OUT_INPUT, busbw=_ring),
    _spec(Collective.BROADCAST, 1, 1, lambda n, r, root, c, b, s: {(root, s)},
          rooted=True, alias=SAME),
    _spec(Collective.REDUCE, 1, 1,
          lambda n, r, root, c, b, s: {(q, s) for q in range(n)} if r == root else None,
          reduces=True, rooted=True, alias=SAME),
    _spec(Collective.GATHER, 1, N, lambda n, r, root, c, b, s: {(b, s)} if r == root else None,
          rooted=True, alias=IN_OUTPUT, in_place=False, busbw=_ring, default_algo="direct"),
    _spec(Collective.SCATTER, N, 1, lambda n, r, root, c, b, s: {(root, r * c + s)},
          rooted=True, alias=OUT_INPUT, in_place=False, busbw=_ring, default_algo="direct"),
    _spec(Collective.ALL_TO_ALL, N, N, lambda n, r, root, c, b, s: {(b, r * c + s)},
          alias=SAME, busbw=_ring, perf_name="alltoall", default_algo="pairwise"),
    _spec(Collective.BARRIER, 0, 0, None, in_place=False, default_algo="dissemination"),
)}

BY_CODE: tuple[Collective, ...] = tuple(Collective)

COLLECTIVE_ALIASES = {
    "allreduce": Collective.ALL_REDUCE,
    "allgather": Collective.ALL_GATHER,
    "reducescatter": Collective.REDUCE_SCATTER,
    "alltoall": Collective.ALL_TO_ALL,
    "bcast": Collective.BROADCAST,
}


def parse_collective(name: str | Collective) -> Collective:
    """Accept ``all_reduce``, ``allreduce``, ``AllReduce`` ... ; raise ValueError otherwise."""
    if isinstance(name, Collective):
        return name
    key = name.strip().lower().replace("-", "_")
    try:
        return Collective(key)
    except ValueError:
        pass
    flat = key.replace("_", "")
    if flat in COLLECTIVE_ALIASES:
        return COLLECTIVE_ALIASES[flat]
    for c in Collective:
        if c.value.replace("_", "") == flat:
            return c
    raise ValueError(f"unknown collective {name!r}; expected one of {[c.value for c in Collective]}")




def parse_list(spec: str, var: str) -> list[tuple[list[Collective], bool, list[str], bool]]:
    """NCCL's ``parseList`` syntax (``NCCL_ALGO``, ``NCCL_PROTO``): semicolon-separated
    entries ``[collective:][^]name,name``; only the first may omit the prefix and then
    applies to every collective. Per entry: (collectives, negated, lower-case names,
    prefixed). ``var`` names the variable in errors."""
    out = []
    entries = [e.strip() for e in spec.split(";") if e.strip()]
    for i, entry in enumerate(entries):
        if ":" in entry:
            prefix, _, body = entry.partition(":")
            colls = [parse_collective(prefix.strip())]
        elif i == 0:
            colls, body = list(Collective), entry
        else:
            raise ValueError(f"{var}: all entries except the first must have a "
                             f"'collective:' prefix (got {entry!r})")
        body = body.strip()
        names = [n.strip().lower() for n in body.lstrip("^").split(",") if n.strip()]
        out.append((colls, body.startswith("^"), names, ":" in entry))
    return out
