"""Buffer sizes and bandwidth of each collective, exactly as nccl-tests computes them.

One :class:`CollSpec` per test, transcribing ``src/<coll>.cu`` of nccl-tests from the
collective's record (:mod:`ringtree.ir.collectives`):

- ``counts`` is ``<Coll>GetCollByteCount``: from the swept size in bytes it gives the
  per-rank element counts of the send and receive buffers, the ``count`` argument of the
  call ("paramcount", printed in the ``count`` column) and where in-place operands sit
  inside the receive buffer.
- ``bw`` is ``<Coll>GetBw``: ``algbw = bytes / 1e9 / sec`` (GB = 1e9) and
  ``busbw = algbw · factor``, the factor being what makes busbw comparable with the
  hardware's peak (``doc/PERFORMANCE.md``): ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for
  all_gather, reduce_scatter, alltoall, gather and scatter, 1 for broadcast, reduce and
  sendrecv.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ringtree.ir.collectives import Collective


@dataclass(frozen=True)
class Counts:
    """Element counts of one row (``setupArgs`` in ``common.cu``)."""

    send: int          # elements in each rank's send buffer
    recv: int          # elements checked in each rank's receive buffer ("expected")
    param: int         # the ``count`` argument of the collective
    send_inplace: int  # in-place: send operand = recvbuff + send_inplace·rank elements
    recv_inplace: int  # in-place: recv operand = recvbuff + recv_inplace·rank elements

    def nbytes(self, itemsize: int) -> int:
        """The ``size`` column: ``max(sendBytes, expectedBytes)``."""
        return max(self.send, self.recv) * itemsize


def _aligned(count: int, eltsize: int, nranks: int) -> int:
    """``(count/nranks) & -(16/eltSize)``: per-rank blocks of whole 16-byte units."""
    return (count // nranks) & -(16 // eltsize) if eltsize <= 16 else count // nranks


def _same(count: int, eltsize: int, nranks: int) -> Counts:
    return Counts(count, count, count, 0, 0)


def _counts_of(coll: Collective) -> Callable[[int, int, int], Counts]:
    """``<Coll>GetCollByteCount`` from the collective's record: a buffer with a block per
    rank splits the size into per-rank blocks of whole 16-byte units; in-place operands
    sit where the record's aliasing puts them."""
    spec = coll.spec

    def counts(count: int, eltsize: int, nranks: int) -> Counts:
        nin, nout = spec.blocks(nranks)
        c = _aligned(count, eltsize, nranks) if spec.per_rank else count
        send_off, recv_off = spec.inplace_offsets(c)
        return Counts(c * nin, c * nout, c, send_off, recv_off)
    return counts


@dataclass(frozen=True)
class CollSpec:
    """What the harness needs to know about one collective test."""

    name: str             # ringtree perf's name (all_reduce ...), program "<name>_perf"
    counts_fn: Callable[[int, int, int], Counts]
    volume: Callable[[int], int]        # algbw bytes = count · typesize · volume(nranks)
    factor: Callable[[int], float]      # busbw = algbw · factor(nranks)
    rooted: bool = False  # iterates over roots (-r); root column shows the root, else -1
    reduces: bool = False  # takes a reduction op (-o); else the redop column says "none"
    op_loop: bool = False  # iterates over -o although it does not reduce (sendrecv)

    def counts(self, nbytes: int, eltsize: int, nranks: int) -> Counts:
        return self.counts_fn(nbytes // eltsize, eltsize, nranks)

    def bw(self, count: int, typesize: int, sec: float, nranks: int) -> tuple[float, float]:
        """(algbw, busbw) in GB/s for ``count`` elements in ``sec`` seconds."""
        nbytes = float(count * typesize * self.volume(nranks))
        algbw = nbytes / 1.0e9 / sec if sec > 0 else (float("inf") if nbytes else 0.0)
        return algbw, algbw * self.factor(nranks)


def _test(coll: Collective) -> CollSpec:
    spec = coll.spec
    return CollSpec(spec.perf_name, _counts_of(coll), spec.volume, spec.busbw,
                    rooted=spec.rooted, reduces=spec.reduces)


_ORDER = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
          Collective.BROADCAST, Collective.REDUCE, Collective.ALL_TO_ALL, Collective.GATHER,
          Collective.SCATTER)
COLLECTIVES: dict[str, CollSpec] = {c.spec.perf_name: _test(c) for c in _ORDER}
COLLECTIVES["sendrecv"] = CollSpec("sendrecv", _same, lambda n: 1, lambda n: 1.0, op_loop=True)

ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather",
           "reducescatter": "reduce_scatter", "all_to_all": "alltoall", "bcast": "broadcast",
           "send_recv": "sendrecv", "alltoall_perf": "alltoall"}


def spec(name: str) -> CollSpec:
    """The CollSpec for ``name`` (also accepts ``all_reduce_perf`` and torch spellings)."""
    key = name.strip().lower().replace("-", "_")
    key = key[:-5] if key.endswith("_perf") else key
    key = ALIASES.get(key, key)
    if key not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; expected one of "
                         f"{', '.join(COLLECTIVES)}")
    return COLLECTIVES[key]


def get_bw(coll: str, count: int, typesize: int, sec: float, nranks: int
           ) -> tuple[float, float]:
    """``<Coll>GetBw``: (algbw, busbw) in GB/s."""
    return spec(coll).bw(count, typesize, sec, nranks)
