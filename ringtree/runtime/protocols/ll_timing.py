"""Two ways of running the same LL call, timed against each other on the communicator
that will run them, so that every rank keeps the same one.

What the LL runner measures instead of fixing (:mod:`~ringtree.runtime.protocols.ll_stores`:
streaming or cached copies into the segment; :mod:`~ringtree.runtime.protocols.ll_crossover`:
the single copy or the split) depends on the host, and sometimes on where the job's
processes landed on it, which a guest cannot see. The method is the online choice's
(:mod:`ringtree.tuning.autotune`, after FFTW's planner: Frigo & Johnson, Proc. IEEE
93(2), 2005), for two arms:

1. the arms are calls on scratch buffers (:func:`scratch`), never the caller's, but
   for a large all-gather, which only writes its output (on the call's own from 32 MiB a
   rank: :func:`ringtree.runtime.protocols.ll_crossover._own_buffers`); each takes the
   communicator's next sequence numbers, as a call does, so every rank must run the same
   ones: the calls per sample come from the bytes alone (:func:`calls_per_sample`);
2. one untimed call of each, then :data:`ROUNDS` rounds, the first arm alternating
   between rounds, each sample ``k`` calls back to back after a barrier, so that a
   rank's lag from the previous sample is not counted in the next one's time (with two
   ranks a core a rank can be a scheduler tick behind its peers);
3. per rank, the median of the rounds' ratios (first ÷ second arm, the two samples of a
   round taken back to back: a slow phase of the machine, which can outlast a sample and
   slow every library up to 4x, hits both sides of a ratio alike); the lowest and
   highest ratio over the ranks and the slowest rank's medians by one MAX all-reduce
   (exact in any order), so every rank decides from the same numbers;
4. :func:`choose`: the arm that is not the default only when it was faster by more
   than :data:`MARGIN` on every rank (a tie keeps the default).

A peer that dies during the measuring fails its calls as any call's: the error names it.
"""

from __future__ import annotations

import mmap
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ringtree.ops import ReduceOp

__all__ = ["MARGIN", "ROUNDS", "Timed", "calls_per_sample", "choose", "compare", "scratch",
           "scratch_run"]

ROUNDS = 5
SAMPLE_BYTES = 8 << 20  # bytes of all-reduce a sample moves: 1-2 ms on 2 ranks
MARGIN = 0.05           # the other arm must be this much faster to replace the default


def calls_per_sample(nbytes: int) -> int:
    """Calls per timed sample for calls of ``nbytes``: from the bytes alone, the same on
    every rank (at least one, at most 64)."""
    return max(1, min(64, SAMPLE_BYTES // max(nbytes, 1)))


def choose(default: bool, low: float, high: float) -> bool:
    """The first arm? From the ``default`` (True: the first) and the lowest and highest
    rank's median ratio first ÷ second: the other arm only when it was faster by more
    than :data:`MARGIN` on every rank."""
    return not low * (1 - MARGIN) > 1 if default else high < 1 - MARGIN


@dataclass(frozen=True)
class Timed:
    """What one comparison found: the slowest rank's median seconds per call of each
    arm, the lowest and highest rank's median ratio first ÷ second, and the choice."""

    nbytes: int
    first: float
    second: float
    ratios: tuple[float, float]
    chose_first: bool
    seconds: float  # what the measuring took


def compare(comm, arms: tuple[Callable[[], None], Callable[[], None]], nbytes: int,
            default: bool) -> Timed:
    """Time ``arms`` (each one call on scratch buffers; collective: every rank passes the
    same arms for the same ``nbytes``) and choose between them; ``default``: the first
    arm unless the second wins by the margin."""
    t0 = time.perf_counter()
    k = calls_per_sample(nbytes)
    for arm in arms:
        arm()  # first touches: the scratch, the arm's own buffers
    samples: list[list[float]] = [[], []]
    for rnd in range(ROUNDS):
        for i in (rnd % 2, 1 - rnd % 2):
            arm = arms[i]
            comm.barrier()  # the ranks start together: no rank's lag moves into a sample
            t = time.perf_counter()
            for _ in range(k):
                arm()
            samples[i].append((time.perf_counter() - t) / k)
    ratio = statistics.median(a / b for a, b in zip(*samples))
    got = np.array([statistics.median(samples[0]), statistics.median(samples[1]),
                    -ratio, ratio], np.float64)
    comm.all_reduce(got, ReduceOp.MAX)
    low, high = -float(got[2]), float(got[3])
    return Timed(nbytes, float(got[0]), float(got[1]), (low, high),
                 choose(default, low, high), time.perf_counter() - t0)


def scratch(count: int, dtype) -> np.ndarray:
    """Zeros of ``dtype`` for the arms, in pages mapped for them alone (``mmap``: shared
    anonymous memory in 4 KiB pages, about the slowest the kernel's copy reads from; an
    8 MiB read from huge pages took half the time: the single copy wins on scratch only
    where it wins on most pages). Not from ``malloc``: freeing a large mapped chunk
    raises glibc's dynamic mmap threshold, so the measuring would move the caller's
    later buffers of that size onto the ``brk`` heap; and where a scratch
    buffer lay changed what it measured (4 ranks on 2 cores, 1 MiB, before the copies
    ignored a buffer's offset within its page: the single copy 1,480-1,680 µs and the
    split 430-540 µs on heap scratch, 780-880 and 1,370-1,440 on mapped pages)."""
    dt = np.dtype(dtype)
    return np.frombuffer(mmap.mmap(-1, max(count * dt.itemsize, 1)), dt, count)


def scratch_run(comm, runner, op, x: np.ndarray, out: np.ndarray, red) -> Callable[[], None]:
    """One call of the LL ``op`` on the scratch ``x`` into ``out`` with the reducer
    ``red``, under the communicator's next sequence number and timeout. The op is named
    for what it does (``all_reduce (measuring)``) in the flight recorder, the profiler
    and its errors: the calls are real, on every rank, and cost the job their time."""
    op.name = f"{op.name} (measuring)"
    op.desc = op.desc._replace(name=op.name)

    def run() -> None:
        comm.seq += 1
        runner.run_arrays(comm, op, x, out, red, out, None, comm.seq, False, None)
    return run
