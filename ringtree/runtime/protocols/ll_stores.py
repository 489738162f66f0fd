"""Streaming or cached copies into the segment: which one LL's compiled rounds use,
measured on the communicator.

Every LL call copies data into the shared segment for its peers to read: the fold
round's contribution, the split's staged blocks and folded tiles, a gather's or a
broadcast's part. From 4 KiB those copies stream (non-temporal stores, ``_stream.h``),
because on the first two hosts measured a cached store cost more: a cell's lines were
last read by the peers, so the store had to take each line back from their caches first
(``docs/design-notes.md``, "Streaming stores into the segment"). On a third host (AMD
EPYC Zen 3, 2 vCPUs) it depends on the job: in three jobs of four, cached stores made the
2-rank split 1.6-1.9x faster from 256 KiB to 4 MiB, in the fourth 2x slower at every size
from 64 KiB, and a job's mode held for all its sizes. So it is most likely whether the
job's two vCPUs share a cache on the host, which a guest cannot see; DeepSpeed's shm
kernel, which stages with cached stores, took 103-194 µs at 1 MiB across such jobs.

So the communicator measures it. At its first call planned on LL whose block is
:data:`~ringtree.transports.shm_native.SHARE_NT` bytes or more (or before it measures the
single copy against the split, :mod:`~ringtree.runtime.protocols.ll_crossover`), it times a float32 sum
all-reduce of :data:`PROBE` bytes on scratch buffers, its rounds streaming against its
rounds cached (:func:`~ringtree.runtime.protocols.ll_timing.compare`, streaming the
default), and sets every round on its segment, made or to be made, to the winner
(:func:`~ringtree.transports.shm_native.stores`). One measurement serves every size and
collective: the mode is the job's. The stores change no bit: the same bytes land in the
segment either way.

``RINGTREE_LL_STORES=stream`` or ``cache`` sets the mode without measuring;
``RINGTREE_TUNE=model`` means ``stream`` unless ``RINGTREE_LL_STORES`` is set; without the
compiled kernel (``RINGTREE_LL_NATIVE=0``, no compiler at install) there is nothing to
choose: NumPy's copies go through the caches. ``RINGTREE_DEBUG=INFO`` prints the
measurement (rank 0). Ranks that call different collectives at that call (a program's
error) may be told so by the mismatch of a measuring call, whose count is the probe's.
"""

from __future__ import annotations

import weakref

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp, resolve
from ringtree.runtime.protocols.ll import LLOp
from ringtree.runtime.protocols.ll_timing import ROUNDS, Timed, compare, scratch, scratch_run
from ringtree.transports import shm_native as native

__all__ = ["PROBE", "Stores", "configure"]

# bytes of the all-reduce timed: on the Zen 3 host, 2 ranks, cached ÷ streaming was 0.54
# at 1 MiB against 0.83-0.92 at 256 KiB (the clearest step between the modes); 4 ranks
# on 2 cores 0.85-0.89 at 1 and 4 MiB
PROBE = 1 << 20


def configure(comm, runner) -> Stores | None:
    """Set the mode ``RINGTREE_LL_STORES`` names on ``runner``'s segment, or return the
    :class:`Stores` that will measure it (None: nothing to measure)."""
    s = comm.settings
    mode = s.ll_stores
    if mode == "measure" and s.tune == "model" and not s.explicit("RINGTREE_LL_STORES"):
        mode = "stream"
    if mode == "cache":
        native.stores(runner.ll, native.CACHED)
    if mode != "measure" or comm.size < 2 or not native.enabled():
        return None
    return Stores(comm, runner)


class Stores:
    """One communicator's measured store mode (``LLRunner.stores``)."""

    def __init__(self, comm, runner):
        self._comm = weakref.ref(comm)  # the communicator owns the runner, which owns this
        self.runner = runner
        self.timed: Timed | None = None  # first arm: streaming; second: cached
        self._started = False

    def settle(self, nbytes: int) -> None:
        """Measure the mode at the first LL call whose block of ``nbytes`` is large enough
        to stream (planned now; collective: every rank plans the same calls)."""
        if self._started or nbytes < native.SHARE_NT:
            return
        comm = self._comm()
        if comm is None:
            return
        self._started = True  # the measuring's own calls plan (its agreement) too
        runner = self.runner
        if runner.pending:
            runner.drain()  # the scratch calls take the next numbers after queued calls
        ll, count = runner.ll, PROBE // 4
        prog = comm.planner.ll_program(Collective.ALL_REDUCE, 0, PROBE)
        op = LLOp(ll, prog, DType.FLOAT32, count, ReduceOp.SUM.code, 0)
        x = scratch(count, np.float32)
        run = scratch_run(comm, runner, op, x, x, resolve(ReduceOp.SUM, DType.FLOAT32))

        def with_stores(share_nt: int):
            def arm() -> None:
                if native.share_nt(ll) != share_nt:  # the first call of a sample
                    native.stores(ll, share_nt)
                run()
            return arm

        m = self.timed = compare(comm, (with_stores(native.SHARE_NT),
                                        with_stores(native.CACHED)), PROBE, True)
        native.stores(ll, native.SHARE_NT if m.chose_first else native.CACHED)
        if comm.debug in ("INFO", "TRACE") and comm.rank == 0:
            print(f"ringtree: LL stores into the segment: measured us (all_reduce {PROBE} B, "
                  f"slowest rank, median of {ROUNDS}): streaming {m.first * 1e6:,.0f}, "
                  f"cached {m.second * 1e6:,.0f}, ratio by rank {m.ratios[0]:.2f}-"
                  f"{m.ratios[1]:.2f}; chose {'streaming' if m.chose_first else 'cached'} "
                  f"(took {m.seconds * 1e3:,.1f} ms)", flush=True)
