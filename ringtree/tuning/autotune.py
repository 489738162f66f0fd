"""The online choice: when the cost model cannot tell its best algorithms apart, time them
on the communicator itself, agree on the numbers, and keep the winner.

Across hosts the model's small-message terms (per-message software cost, wake-ups, the
host-crossing latency) are the machine's state more than its constants: on the 2×2
testbed at 8 B–8 KiB recursive doubling and the hierarchical all-gather swapped places by
up to ±25% within minutes (``docs/multihost.md``), so no fixed constant keeps the model's
choice within 10% of the best. NCCL answers the same problem with a static model plus
``NCCL_ALGO``; MPI libraries such as Open MPI's ``coll/tuned`` with measured decision
tables made offline. This module measures online, once per (collective, bytes), the way
FFTW's planner measures its candidate plans (Frigo & Johnson, "The design and
implementation of FFTW3", Proc. IEEE 93(2), 2005), on the communicator that will run them.

The rule, for a call whose algorithm the caller did not name:

1. *Whether to measure* comes from the model alone (:func:`candidates`): the algorithms
   predicted within :data:`MARGIN` of the best (at most :data:`MAX_CANDIDATES`, the
   model's own choice always among them), if there are two or more and the best is
   predicted under :data:`MAX_PREDICTED`. The model is a pure function of the topology,
   which rank 0 measured and broadcast, and of ``RINGTREE_ALGO``, so every rank makes the
   same decision at the same call and no message is needed to agree on it.
2. *Bits*: a reduction's candidates are only those that reduce every element by the same
   expression tree as the model's choice (:func:`ringtree.tuning.same_bits.same_bits`), so a
   result never depends on which one the timing picked; data movement always qualifies,
   and so do integer sums, products, minima, maxima and bitwise operators, exact in any
   order (:func:`exact_in_any_order`).
3. *Timing*: on scratch buffers of the call's dtype and shape (never the caller's),
   through the public methods (so each call pays what a caller's pays), one untimed
   call of each candidate, then :data:`ROUNDS` rounds that run each candidate ``iters``
   times back to back in a rotated order (``iters`` from the model's estimate, about
   :data:`SAMPLE_SECONDS` per sample, after :data:`SETTLE` untimed calls), so machine
   noise hits all alike. Samples of a few calls (4 ms) ranked the 2×2 all-gathers
   otherwise than the benchmark's 50 ms loops did; 20 ms samples agreed.
4. *Agreement*: each rank's per-candidate medians are all-reduced with MAX (ring
   all-reduce of float64, exact under any order), so every rank holds the same numbers;
   the winner is the least time, ties broken by name.
5. The decision is cached with the model's choices per (collective, bytes): later calls
   cost one dictionary look-up. A size first seen within the same power-of-two octave
   as a measured one (``2^(k-1) <= bytes < 2^k``, :func:`octave`) takes that
   measurement's winner without measuring again, when the winner is among its own
   candidates: a job calling many nearby sizes pays the measuring once per octave, not
   once per size. Every rank has issued the same calls, so every rank holds the same
   winners. A reduction of another shape (dtype, root, blocks) with
   the same bytes uses the measured winner only where it is proven bit-identical for that
   shape too, else the model's choice.

The tuning calls run on the caller's thread inside the call that needed them, under the
call's deadline (``timeout=`` / ``RINGTREE_TIMEOUT``): a dead peer raises the same
error a normal call would. The ranks first agree on the least time their calls have
left (a MIN all-reduce); when that is less than the measuring needs
(:data:`MEASURE_SAFETY` × its estimate, at least :data:`MEASURE_MIN_SECONDS`), the model's
choice is kept for that (collective, size), so a short ``timeout=`` never fails because
of the measuring. ``RINGTREE_TUNE=model`` turns this off; ``RINGTREE_DEBUG=INFO``
prints each measurement (rank 0).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ringtree.dtypes import as_flat
from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp, resolve
from ringtree.schedules import needs_switch

# how far above the model's best a candidate may be predicted and still be measured: the
# model's error on the close pairs. On testbed hosts with their own CPUs the 2x2
# hierarchical all-reduce at 8-256 B and 200 Mbit/s ran 14% faster than recursive
# doubling where the model put it 36% slower (with shared CPUs swings reached 1.31x)
MARGIN = 0.40
MAX_CANDIDATES = 3
MAX_PREDICTED = 0.02  # s: the model's best estimate above which it is trusted as is
ROUNDS = 5
SAMPLE_SECONDS = 0.02  # back-to-back calls per sample: a caller's loop, not one call
MAX_ITERS = 64
SETTLE = 1            # untimed calls before a sample of several, after another algorithm's
AGREE_ALGO = "ring"   # the fixed all-reduce the medians are agreed with
# a call whose deadline leaves less than this (the measuring's estimate times the safety
# factor, at least the minimum; measuring took 0.16-0.66 s on the 2x2 testbed) keeps the
# model's choice for its (collective, size) instead of failing as a timeout
MEASURE_SAFETY = 4.0
MEASURE_MIN_SECONDS = 1.0
TUNED = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
         Collective.BROADCAST, Collective.REDUCE)
REDUCTIONS = (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE)


@dataclass(frozen=True)
class Decision:
    """One online choice: the model's, the candidates measured with their agreed medians
    (seconds per call, slowest rank), the winner and what the measuring cost this rank."""

    coll: Collective
    nbytes: int
    model: str
    candidates: tuple[str, ...]
    times: tuple[float, ...]
    choice: str
    seconds: float
    excluded: tuple[str, ...] = ()  # within the margin but not the model's bits
    measured_at: int = 0            # the bytes measured: ``nbytes``, or an octave-mate's


def octave(nbytes: int) -> int:
    """The power-of-two octave of a size: k with ``2^(k-1) <= nbytes < 2^k`` (0 for 0)."""
    return int(nbytes).bit_length()


def candidates(ranked: list[tuple[str, float]], model_choice: str,
               margin: float = MARGIN) -> list[tuple[str, float]]:
    """The algorithms worth measuring, best estimate first (the model's choice always
    kept): those predicted within ``margin`` of the best, at most
    :data:`MAX_CANDIDATES`; fewer than two, or a best above :data:`MAX_PREDICTED`, means
    none (the model decides)."""
    if not ranked or ranked[0][1] > MAX_PREDICTED:
        return []
    bound = ranked[0][1] * (1 + margin)
    near = [(a, t) for a, t in ranked if t <= bound]
    keep = [x for x in near if x[0] == model_choice]
    keep += [x for x in near if x[0] != model_choice][:MAX_CANDIDATES - len(keep)]
    keep.sort(key=lambda x: (x[1], x[0]))
    return keep if len(keep) > 1 else []


def _blocks(coll: Collective, spec, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if spec.blocks is not None:
        return tuple(spec.blocks[0]), tuple(spec.blocks[1])
    nin, nout = coll.blocks(n)
    return (spec.count,) * nin, (spec.count,) * nout


def _timing_op(spec) -> ReduceOp | None:
    """The operator the scratch calls reduce with (a user's operator, or a scaled sum, is
    timed as a sum); None when the scratch buffers' dtype cannot take it."""
    op = spec.op if isinstance(spec.op, ReduceOp) and spec.op is not ReduceOp.PREMUL_SUM \
        else ReduceOp.SUM
    if spec.coll not in REDUCTIONS:
        return op
    try:
        resolve(op, as_flat(np.zeros(1, spec.dtype.storage), "scratch")[1])
    except (TypeError, ValueError):
        return None
    return op


# Integer reductions whose result is one value whatever the association: two's-complement
# addition and multiplication wrap (a commutative ring modulo 2^w), min and max on a
# total order, and the bitwise operators are associative and commutative, so every
# checked schedule (each output element reduced over every rank's input exactly once)
# gives the same bits. Not floats: besides rounding, min/max of -0.0 and +0.0, or of two
# NaNs, returns whichever operand came first. Not AVG (a division) or user operators.
EXACT_INT_OPS = (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND,
                 ReduceOp.BOR, ReduceOp.BXOR)


def exact_in_any_order(spec) -> bool:
    """Does every schedule of the reduction ``spec`` give the same bits, without a proof:
    an integer dtype and one of :data:`EXACT_INT_OPS`?"""
    return not spec.dtype.is_float and spec.op in EXACT_INT_OPS


class OnlineChoice:
    """The online choice of one communicator (set as ``planner.online``)."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.decisions: dict[tuple[Collective, int], Decision] = {}
        self.winners: dict[tuple[Collective, int], Decision] = {}  # by (coll, octave)
        self.deadline = 0.0  # monotonic; the issuing call sets it before it plans

    # ---- what the planner asks -------------------------------------------------------

    def same_bits(self, spec, first: str, second: str, opts, nbytes: int) -> bool:
        """May ``second`` replace ``first`` for the call ``spec`` (of ``nbytes``) without
        changing a bit? Each runs with the options its record gives that size."""
        coll = spec.coll
        if coll not in REDUCTIONS or first == second or exact_in_any_order(spec):
            return True
        from ringtree.tuning.same_bits import same_bits

        _, out_blocks = _blocks(coll, spec, self.comm.size)
        in_place = bool(spec.in_place) and spec.op is not ReduceOp.PREMUL_SUM  # else a copy
        return same_bits(coll, first, second, self.comm.size, opts, out_blocks, in_place,
                         nbytes)

    def decide(self, spec, nbytes: int, model_choice: str, ranked: list[tuple[str, float]],
               opts) -> str:
        """The algorithm for (``spec.coll``, ``nbytes``): the model's choice, or the fastest
        of its close candidates as measured now on every rank."""
        coll = spec.coll
        if coll not in TUNED or needs_switch(coll, model_choice) or \
                spec.blocks is not None or _timing_op(spec) is None:
            return model_choice
        near = [(a, t) for a, t in candidates(ranked, model_choice)
                if not needs_switch(coll, a)]
        cands = [(a, t) for a, t in near
                 if self.same_bits(spec, model_choice, a, opts, nbytes)]
        kept = {a for a, _ in cands}
        excluded = tuple(a for a, _ in near if a not in kept)
        if len(cands) < 2:
            if excluded and self._verbose():
                print(f"ringtree: {coll.value} {nbytes} B: online choice skipped: "
                      f"{', '.join(excluded)} reduce in another order than {model_choice} "
                      "(different bits); keeping the model's choice", flush=True)
            return model_choice
        prior = self.winners.get((coll, octave(nbytes)))
        if prior is not None and prior.choice in kept:
            d = Decision(coll, nbytes, model_choice, prior.candidates, prior.times,
                         prior.choice, 0.0, excluded, prior.measured_at)
            self.decisions[(coll, nbytes)] = d
            if self._verbose():
                print(f"ringtree: {coll.value} {nbytes} B: chose {d.choice} as measured at "
                      f"{d.measured_at} B (same octave; model: {model_choice})", flush=True)
            return d.choice
        t0 = time.perf_counter()
        comm = self.comm
        with comm.ungrouped():  # measured now, ahead of an open group
            left, need = self._agreed_time_left(), self._budget(cands)
            if left < need:
                if self._verbose():
                    print(f"ringtree: {coll.value} {nbytes} B: online choice skipped: the "
                          f"call's deadline leaves {left:.3f} s, measuring needs about "
                          f"{need:.3f} s; keeping the model's choice {model_choice}",
                          flush=True)
                return model_choice
            times = self._measure(spec, cands)
        choice = min(zip(times, (a for a, _ in cands)))[1]
        d = Decision(coll, nbytes, model_choice, tuple(a for a, _ in cands), tuple(times),
                     choice, time.perf_counter() - t0, excluded, nbytes)
        self.decisions[(coll, nbytes)] = self.winners[(coll, octave(nbytes))] = d
        if self._verbose():
            got = ", ".join(f"{a} {t * 1e6:,.0f}" for a, t in zip(d.candidates, d.times))
            note = f"; not measured (other bits): {', '.join(excluded)}" if excluded else ""
            print(f"ringtree: {coll.value} {nbytes} B: measured us (slowest rank, median "
                  f"of {ROUNDS}): {got}; chose {choice} (model: {model_choice}); tuning "
                  f"took {d.seconds * 1e3:,.1f} ms{note}", flush=True)
        return choice

    def _verbose(self) -> bool:
        c = self.comm
        return c.debug in ("INFO", "TRACE") and c.rank == 0

    # ---- measuring ------------------------------------------------------------------

    def _runner(self, spec, algo: str):
        """``run(iters)``: ``iters`` calls like ``spec`` with ``algo`` named, back to back,
        each awaited, on zero scratch buffers of its dtype and shape, in place when it is. They go through the
        public methods, so they pay what a caller's call pays (argument checks, planning,
        issuing): on a machine with more ranks than cores that CPU is part of the race."""
        comm, coll = self.comm, spec.coll
        dt, n, count = spec.dtype, self.comm.size, spec.count
        op = _timing_op(spec)
        zeros, r = np.zeros, comm.rank
        inplace = bool(spec.in_place)  # in place or not as the call: schedules differ
        if coll is Collective.ALL_REDUCE:
            x = zeros(count, dt.storage)
            out = x if inplace else zeros(count, dt.storage)

            def one(left: float) -> None:
                comm.all_reduce(x, op, out=out, algo=algo, timeout=left)
        elif coll is Collective.ALL_GATHER:
            out = zeros(count * n, dt.storage)
            x = out[r * count:(r + 1) * count] if inplace else zeros(count, dt.storage)

            def one(left: float) -> None:
                comm.all_gather(x, out=out, algo=algo, timeout=left)
        elif coll is Collective.REDUCE_SCATTER:
            x = zeros(count * n, dt.storage)
            out = x[r * count:(r + 1) * count] if inplace else zeros(count, dt.storage)

            def one(left: float) -> None:
                comm.reduce_scatter(x, op, out=out, algo=algo, timeout=left)
        elif coll is Collective.BROADCAST:
            x = zeros(count, dt.storage)

            def one(left: float) -> None:
                comm.broadcast(x, spec.root, algo=algo, timeout=left)
        else:
            x = zeros(count, dt.storage)
            out = x if inplace else zeros(count, dt.storage)

            def one(left: float) -> None:
                comm.reduce(x, spec.root, op, out=out, algo=algo, timeout=left)

        def run(iters: int) -> None:
            for _ in range(iters):
                one(max(self.deadline - time.monotonic(), 1e-3))

        return run

    @staticmethod
    def _iters(cands: list[tuple[str, float]]) -> list[int]:
        """Calls per sample of every candidate, from its predicted time."""
        return [max(1, min(MAX_ITERS, int(SAMPLE_SECONDS / max(t, 1e-7)))) for _, t in cands]

    def _budget(self, cands: list[tuple[str, float]]) -> float:
        """Seconds the measuring may take, from the predicted times, with room to spare:
        what a call's deadline must leave for it to measure."""
        est = sum((1 + ROUNDS * (k + (SETTLE if k >= 4 else 0))) * t
                  for (_, t), k in zip(cands, self._iters(cands)))
        return max(MEASURE_MIN_SECONDS, MEASURE_SAFETY * est)

    def _agreed_time_left(self) -> float:
        """The least time any rank's call has left before its deadline (a MIN all-reduce,
        so every rank makes the same decision from the same number)."""
        left = np.array([self.deadline - time.monotonic()], np.float64)
        self.comm.all_reduce(left, ReduceOp.MIN, algo=AGREE_ALGO,
                             timeout=max(float(left[0]), 1e-3))
        return float(left[0])

    def _measure(self, spec, cands: list[tuple[str, float]]) -> list[float]:
        """Every candidate's median seconds per call, the slowest rank's (same on all)."""
        runs = [self._runner(spec, a) for a, _ in cands]
        iters = self._iters(cands)
        for run in runs:
            run(1)  # the plan's first touches, connections, staging
        samples: list[list[float]] = [[] for _ in cands]
        k = len(cands)
        for rnd in range(ROUNDS):
            for i in [(rnd + j) % k for j in range(k)]:
                if iters[i] >= 4:
                    runs[i](SETTLE)  # untimed: the first call after another algorithm's
                t0 = time.perf_counter()
                runs[i](iters[i])
                samples[i].append((time.perf_counter() - t0) / iters[i])
        meds = np.array([statistics.median(s) for s in samples], np.float64)
        self.comm.all_reduce(meds, ReduceOp.MAX, algo=AGREE_ALGO,
                             timeout=max(self.deadline - time.monotonic(), 1e-3))
        return [float(v) for v in meds]
