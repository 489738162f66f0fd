"""Where the single-copy all-reduce takes over from the segment's split, measured on the
communicator that runs them.

Two LL paths serve a large all-reduce on one host: the split through the segment
(:mod:`~ringtree.runtime.protocols.ll_split`: every rank copies its part in and the
folded blocks out, 4 S of passes on 2 ranks) and the single copy
(:mod:`~ringtree.runtime.protocols.ll_direct_fold`: the kernel reads each peer's row
where it lies, ``process_vm_readv``, 2.5 S). Fewer passes win once the kernel's cost per
move is paid off, and that point is the host's: on 2 ranks (``benchmarks/ll_direct.py``,
alternated in one job) 768 KiB-1 MiB on an AMD EPYC Zen 2, 4 MiB on an Intel host and
8 MiB on a Zen 3, where the kernel copied at 9 GB/s against 23 for a user-space copy.
:data:`~ringtree.runtime.protocols.ll_direct_fold.MIN_BYTES` is the constant that loses
least on the worst of those hosts; it loses up to 1.25x on each of them somewhere.

Since the single copy's whole call became one C entry
(:mod:`~ringtree.runtime.protocols.ll_direct_entry`) it also wins far below: from 12-16
KiB on 2 ranks on an Intel Xeon host, where the segment's one-entry fold round wins
below. The all-gather (:data:`GATHER_BAND`), the reduce-scatter (:data:`SCATTER_BAND`:
the single copy or the segment's fold round) and the broadcast (:data:`BCAST_BAND`) are
measured alike.

So inside :data:`BAND` (the sizes where the hosts measured so far disagreed), the first
all-reduce of each power-of-two octave of bytes (``2^(k-1) <= bytes < 2^k``) times both
paths on the communicator (:func:`~ringtree.runtime.protocols.ll_timing.compare`): on
zero scratch buffers of the call's dtype and count, in place when the call is, with the
call's operator, each path prepared as the planner would and run through the runner
(what a call pays but the planning). The single copy replaces the split below
:data:`~ringtree.runtime.protocols.ll_direct_fold.MIN_BYTES` (or the split the single
copy above it) only when it was faster by the margin on every rank.

Both paths give the bits of the rank-order fold (the split folds every element from
the same operands in the same order as the fold round, and so does the single copy):
the timing picks a speed, never a result. Later calls in the octave cost one dictionary
look-up (:attr:`~ringtree.runtime.protocols.ll_direct.Direct.measured`); planned shapes
keep their plan. ``RINGTREE_TUNE=model`` or ``RINGTREE_CMA_MIN`` turn the measuring
off (the constant, or the caller's threshold, decides); ``RINGTREE_DEBUG=INFO`` prints
each measurement (rank 0).
"""

from __future__ import annotations

import weakref

import numpy as np

from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp
from ringtree.runtime.protocols import ll_direct, ll_direct_entry, ll_direct_fold
from ringtree.runtime.protocols.ll import LLOp
from ringtree.runtime.protocols.ll_timing import ROUNDS, Timed, compare, scratch, scratch_run
from ringtree.transports import shm_cma as cma

__all__ = ["BAND", "BCAST_BAND", "GATHER_BAND", "SCATTER_BAND", "Crossover"]

# bytes of an all-reduce, [low, high), by "more than 2 ranks", where the measured
# crossovers of the hosts above fell. 2 ranks 768 KiB-8 MiB (the split won below 768 KiB
# on every host, the single copy from 16 MiB by 1.16-1.9x). More ranks: on the Zen 2
# host the single copy trailed to 4-8 MiB (4 ranks on 2 cores 0.76x at 2 MiB, 3 ranks
# 0.77x at 1 MiB), on the Zen 3 one it led from 256 KiB, where the split starts (4 ranks
# 1.2-1.8x at 256 KiB-32 MiB; 3 ranks level at 1-2 MiB), and below 256 KiB the fold
# round won by 2-3x on both; LL's own range ends at 64 MiB there
# (ringtree.tuning.proto.THRESHOLDS)
# From the single copy's one C entry (ll_direct_entry) the band reaches down to where
# the segment's one-entry fold round wins again: on the Intel Xeon host, 2 ranks
# (alternated jobs, single copy ÷ segment) 0.90-1.02 at 8 KiB, 0.70-0.81 at 12 KiB,
# 0.51-0.54 at 64 KiB, 0.62-0.72 at 256 KiB, 1.41-1.49 at 4 KiB; 4 ranks on 2 cores
# 1.13-1.25 at 16 KiB, 0.79-0.84 at 64 KiB
BAND: dict[bool, tuple[int, int]] = {False: (8 << 10, 16 << 20), True: (32 << 10, 64 << 20)}
# an all-gather's output bytes, [low, high), where its single copy and the segment's
# streamed gather (ll_gather) are measured against each other: from where the single
# copy takes over (ll_direct.MIN_BYTES, above LL's own range). benchmarks/ll_direct.py
# with RINGTREE_PROTO=allgather:LL (the segment, "staged"), staged ÷ single copy, on the
# AMD EPYC Zen 3 host: 2 ranks 8 MiB 0.78-0.85, 16 MiB 0.90-1.06, 64 MiB 0.96-1.09; 4
# ranks on 2 cores 4 MiB 0.61-0.72, 16 MiB 0.72-0.78, 64 MiB 0.88; the single copy had
# led on the Zen 2 host (2 ranks 0.82x and 1.08x the segment's time at 16 and 64 MiB).
# On 2 ranks the band starts below LL's 4 MiB, where the single copy pushes
# (DirectOp._push) and the segment is the default: on an Intel Xeon host the segment
# took 1.2-1.4x Open MPI's time at 1 MiB, on the Zen 3 one it led the single copy's
# reads there (0.74-0.79x its time). At 256 KiB, where the push measured faster on
# scratch, it was slower than the segment on the callers' buffers (22 against 19 µs)
# With the C entry the band on 2 ranks starts at 8 KiB: there (alternated jobs) the
# single copy took 1.27-1.40x the segment's time at 8 KiB, 0.90-1.01 at 16 KiB, 0.53-0.55
# at 64 KiB, 0.59-0.62 at 256 KiB; on 4 ranks on 2 cores 1.25-1.37 at 64 KiB
GATHER_BAND: dict[bool, tuple[int, int]] = {
    False: (8 << 10, 256 << 20),
    True: (ll_direct.MIN_BYTES[(Collective.ALL_GATHER, True)], 256 << 20)}
# a reduce-scatter's input bytes where its single copy (from its C entry) and the
# segment's fold round are measured: on 2 ranks below the single copy's constant (above
# LL's range), where on the Intel Xeon host the single copy took 1.47-1.49x the
# segment's time at 4 KiB, 0.86-0.96 at 16 KiB, 0.45-0.54 at 64 KiB, 0.44-0.83 at 1 MiB;
# on 4 ranks on 2 cores 1.2-1.6x at 16 KiB, 0.80-1.43 at 64 KiB, 1.05-1.09 at 1 MiB: not
# measured there
SCATTER_BAND: dict[bool, tuple[int, int]] = {
    False: (8 << 10, ll_direct.MIN_BYTES[(Collective.REDUCE_SCATTER, False)]), True: (0, 0)}

# a broadcast's bytes where its single copy (from its C entry) and the segment's round
# (the root's copy into its cell, every other rank's copy out) are measured: LL's range
# from 8 KiB. On 2 ranks on the Intel Xeon host, alternated jobs, µs: 8 KiB 2.69 against
# 1.97, 64 KiB 4.58 against 8.44, 256 KiB 10.5 against 14.3; on 4 ranks on 2 cores not
# measured (the single copy's two synchronisations need every rank scheduled)
BCAST_BAND: dict[bool, tuple[int, int]] = {
    False: (8 << 10, ll_direct.MIN_BYTES[(Collective.BROADCAST, False)]), True: (0, 0)}

# an all-gather's input bytes from which its measuring runs on the call's own buffers
# (_own_buffers), not on scratch: glibc maps every array this large on its own (its
# dynamic mmap threshold stops at 32 MiB), so the next call's buffers lie as this one's
GATHER_OWN = 32 << 20


class Crossover:
    """One communicator's measured crossover (``LLRunner.crossover``)."""

    def __init__(self, comm, runner):
        self._comm = weakref.ref(comm)  # the communicator owns the runner, which owns this
        self.runner = runner
        self.log: list[Timed] = []  # first arm: the single copy; second: the split
        self.modes: list[Timed] = []  # the all-gather's single copy: shared; straight

    def settle(self, spec) -> None:
        """Measure both paths for ``spec`` (a :class:`~ringtree.runtime.callspec.CallSpec`
        the planner is about to plan) if it is an all-reduce in :data:`BAND` or an
        all-gather in :data:`GATHER_BAND` whose octave has not been measured; collective:
        every rank plans the same call."""
        direct = self.runner.direct
        if direct is None or direct.min_bytes is not None:
            return
        n, block = direct.ll.n, spec.count * spec.dtype.itemsize
        if spec.coll is Collective.ALL_REDUCE and spec.op is not ReduceOp.PREMUL_SUM:
            nbytes, (lo, hi), table = block, BAND[n > 2], direct.measured
        elif spec.coll is Collective.ALL_GATHER:
            nbytes, (lo, hi), table = block * n, GATHER_BAND[n > 2], direct.measured_gather
        elif spec.coll is Collective.REDUCE_SCATTER and spec.op is not ReduceOp.PREMUL_SUM:
            nbytes, (lo, hi), table = block * n, SCATTER_BAND[n > 2], direct.measured_scatter
        elif spec.coll is Collective.BROADCAST:
            nbytes, (lo, hi), table = block, BCAST_BAND[n > 2], direct.measured_bcast
        else:
            return
        comm = self._comm()
        if spec.coll is Collective.ALL_GATHER and n == 2 and direct.push_large is None and \
                nbytes >= ll_direct.MIN_BYTES[(spec.coll, False)] and comm is not None:
            if self.runner.pending:
                self.runner.drain()  # (as the measuring: after the queued calls)
            direct.push_large = self._agree_push(comm)
        if not lo <= nbytes < hi or nbytes.bit_length() in table or comm is None:
            return
        self.runner.settle_stores(block)  # the segment's speed depends on it
        if self.runner.pending:
            self.runner.drain()  # the scratch calls take the next numbers after queued calls
        table[nbytes.bit_length()] = self._measure(comm, spec, nbytes)

    @staticmethod
    def _agree_push(comm) -> bool:
        """Whether a 2-rank all-gather's single copy pushes above LL's range too (each
        rank writes its input into the peer's output, ``DirectOp.push``): where no rank
        measured that offsets in a cache line slow the kernel's copy
        (:func:`~ringtree.transports.shm_cma.offsets_matter`; the push has no bounce),
        agreed by a MIN all-reduce, since a rank that pushes and one that reads would
        leave a block unwritten. On an Intel Xeon host, where they do not, six
        alternated pairs: 16 MiB 1,318-1,383 µs against the reads' 1,377-1,518, 64 MiB
        6,694-7,276 against 7,092-7,754."""
        flag = np.array([0 if cma.offsets_matter() else 1], np.int64)
        comm.all_reduce(flag, ReduceOp.MIN)
        return bool(flag[0])

    def _measure(self, comm, spec, nbytes: int) -> bool:
        """Time the single copy against the segment's path for ``spec``: whether the
        single copy is kept (or taken) for its octave."""
        direct, runner, coll = self.runner.direct, self.runner, spec.coll
        prog = comm.planner.ll_program(coll, spec.root, nbytes)
        dt, count, root = spec.dtype, spec.count, spec.root
        code = spec.reducer.code if spec.reducer is not None else 0
        if coll is Collective.ALL_GATHER:  # on the call's own buffers: see _own_buffers
            x, out = _own_buffers(spec, count, direct.ll.n)
            default = nbytes >= ll_direct.MIN_BYTES[(coll, direct.ll.n > 2)]
            other = "segment"
        elif coll is Collective.REDUCE_SCATTER:
            x, out = scratch(count * direct.ll.n, dt.storage), scratch(count, dt.storage)
            default = nbytes >= ll_direct.MIN_BYTES[(coll, direct.ll.n > 2)]
            other = "segment"
        elif coll is Collective.BROADCAST:  # in place, as the hot path's calls
            x = out = scratch(count, dt.storage)
            default, other = nbytes >= ll_direct.MIN_BYTES[(coll, direct.ll.n > 2)], "segment"
        else:
            x = scratch(count, dt.storage)
            out = x if spec.in_place else scratch(count, dt.storage)
            default, other = nbytes >= ll_direct_fold.MIN_BYTES[direct.ll.n > 2], "segment"
        arms = tuple(scratch_run(comm, runner, op, x, out, spec.reducer) for op in (
            ll_direct_entry.op_for(direct.ll, direct, prog, dt, count, code, root),
            LLOp(direct.ll, prog, dt, count, code, root)))
        if coll is Collective.ALL_GATHER and x is spec.inp:  # the call's own buffers
            self._gather_mode(comm, arms[0], nbytes)
        m = compare(comm, arms, nbytes, default)
        self.log.append(m)
        if comm.debug in ("INFO", "TRACE") and comm.rank == 0:
            k = nbytes.bit_length()
            print(f"ringtree: {coll.value} {nbytes} B: measured us (slowest rank, median of "
                  f"{ROUNDS}): single copy {m.first * 1e6:,.0f}, {other} "
                  f"{m.second * 1e6:,.0f}, ratio by rank {m.ratios[0]:.2f}-{m.ratios[1]:.2f}; "
                  f"chose {'single copy' if m.chose_first else other} for {1 << (k - 1)}-"
                  f"{(1 << k) - 1} B (default: {'single copy' if default else other}); "
                  f"took {m.seconds * 1e3:,.1f} ms", flush=True)
        return m.chose_first

    def _gather_mode(self, comm, single, nbytes: int) -> None:
        """Which single copy the all-gather's octave takes, timed on the call's own
        buffers before it races the segment: pieces shared by the ranks and bounced
        through L2 from ``STREAM_MIN`` (the default on more than 2 ranks, where an early
        rank takes over a late one's pieces), or straight reads, one ``process_vm_readv``
        of each peer's block into the output (the default on 2). On a Zen 2 host the
        bounce led by 1.06-1.20x at 8-64 MiB; on a Zen 3 host, 2 ranks, 64 MiB arrays in
        huge pages, the straight reads took 0.89x the shared pieces' time (7,481 against
        8,392 µs, nine blocks alternated in one job, twice alike). Only from
        :data:`GATHER_OWN`: on scratch the straight reads came close to the segment at
        16 MiB (2.8-3.4 against 2.1-2.7 ms) and won it in one job of four, whose heap
        arrays then took 6.2 ms a call; the shared pieces on scratch (7.2 ms) never do."""
        table, k = self.runner.direct.straight_gather, nbytes.bit_length()

        def mode(straight: bool):
            def arm() -> None:
                table[k] = straight
                single()
            return arm

        m = compare(comm, (mode(False), mode(True)), nbytes, self.runner.direct.ll.n > 2)
        table[k] = not m.chose_first
        self.modes.append(m)
        if comm.debug in ("INFO", "TRACE") and comm.rank == 0:
            print(f"ringtree: all_gather {nbytes} B: measured us (slowest rank, median of "
                  f"{ROUNDS}): pieces {m.first * 1e6:,.0f}, straight reads "
                  f"{m.second * 1e6:,.0f}; chose "
                  f"{'pieces' if m.chose_first else 'straight reads'}", flush=True)


def _own_buffers(spec, count: int, n: int):
    """The all-gather's input and output for its measuring: the call's own from
    :data:`GATHER_OWN` bytes of input (what the kernel reads), shared scratch below.

    The kernel's copy costs what the pages it reads cost to pin, and those are the
    caller's: an 8 MiB ``process_vm_readv`` of a source in 4 KiB pages took 1.8-2.1 ms,
    of one in 2 MiB pages 1.0-1.1 ms (AMD EPYC Zen 3). NumPy advises huge pages for an
    array from 4 MiB, which the kernel gives where the memory was not touched before (a
    mapping of its own, the heap's fresh end); reused heap memory keeps its 4 KiB pages,
    and torch advises none. (A 16 MiB all-gather's straight reads of heap arrays took
    5.6-7.5 ms in some jobs: their offsets in a cache line differed, which
    ``DirectOp._gather`` now bounces.) Shared scratch
    (4 KiB pages of shared memory) is a slow case: on it the single copy took 2.8-3.5x
    the segment's time at 16 and 64 MiB. Below 32 MiB an array may lie on the heap or in
    its own mapping depending on what was freed before, so the first call's buffers say
    nothing of the next's; from 32 MiB they do. An all-gather's arms only write the
    output, which the call overwrites anyway, and read the input, which no arm writes."""
    x, out = spec.inp, spec.out
    if count * spec.dtype.itemsize < GATHER_OWN or x is None or out is None or \
            x.size != count or out.size != count * n:
        return scratch(count, spec.dtype.storage), scratch(count * n, spec.dtype.storage)
    return x, out
