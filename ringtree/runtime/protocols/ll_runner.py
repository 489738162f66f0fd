"""Running planned calls on the LL protocol: the communicator's side of
:mod:`ringtree.transports.shm_ll` and :mod:`ringtree.runtime.protocols.ll`.

A communicator whose ranks all share one host opens one LL segment at creation (a
collective through the store, like the shm transport's setup). From then on:

- a call the planner gives to LL runs here, on the calling thread, without the executor:
  write, publish, wait, read (:class:`~ringtree.runtime.protocols.ll.LLOp`); an async
  call is queued for the LL thread, and a thread that waits for its Work first runs the
  queue up to that call itself (it would only sleep until the LL thread had: this saves
  two thread hand-offs per call, which is most of a small call's time when ranks
  outnumber cores);
- a call that runs on Simple *announces* itself in the segment (its sequence number and
  header), so a rank that chose LL for what should be the same call — it disagrees
  on the size — gets a MismatchError instead of waiting, and the Simple rank finds out
  too when its executor is idle (:meth:`LLRunner.check`);
- memory order with Simple work still in flight (async calls) is kept: an LL call whose
  buffers overlap such a call waits for it first, as on one NCCL stream.
"""

from __future__ import annotations

from threading import get_ident

import numpy as np

from ringtree.dtypes import DType
from ringtree.errors import RingtreeError
from ringtree.ir.program import Collective, Program
from ringtree.ops import OP_NAMES
from ringtree.runtime.plan import DescAt
from ringtree.runtime.protocols import (
    ll_crossover,
    ll_direct,
    ll_direct_entry,
    ll_direct_fold,
    ll_direct_probe,
    ll_entry,
    ll_gather,
    ll_hot,
    ll_stores,
)
from ringtree.runtime.protocols.ll import LLOp, fits
from ringtree.runtime.protocols.ll_async import AsyncCalls
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import LL, open_ll
from ringtree.work import Work

MISS = ll_entry.MISS     # a hot path's answer: the call takes the general path
HOT = ll_hot.HOT         # planner.ready's key of the all-reduce's last hot shape
MAX_RANKS = 255          # the cost of polling every line
CELL = 1 << 20           # cell bytes per rank and parity (the largest LL contribution)
SMALL_CELL = 64 << 10    # with many ranks: the segment is nranks x 2 cells


def default_cell(nranks: int) -> int:
    """Cells hold the largest contribution :data:`ringtree.tuning.proto.THRESHOLDS` gives
    LL (pages are touched only as far as calls use them)."""
    return CELL if nranks <= 8 else SMALL_CELL


class LLRunner(AsyncCalls):
    """One communicator's LL segment and the ops prepared on it."""

    def __init__(self, ll: LL):
        self.ll = ll
        self.cell = ll.cell_bytes
        self._init_async()
        self.direct: ll_direct.Direct | None = None  # peers' buffers readable: ll_direct
        self.reg = None  # registered buffers (ll_reg.Registered, made by Communicator.empty)
        # what is measured on the communicator at its first calls: the store mode, and
        # where the single copy takes over from the split
        self.stores: ll_stores.Stores | None = None
        self.crossover: ll_crossover.Crossover | None = None

    @classmethod
    def for_comm(cls, comm) -> LLRunner | None:
        """The LL segment when every rank of ``comm`` is on this host and shared memory
        is in use; None otherwise (every call then runs on Simple). Collective."""
        from ringtree.bootstrap.job import crowded
        from ringtree.transports.registry import shares_memory
        from ringtree.tuning.proto import LL as LL_PROTO

        s = comm.settings
        if comm.size > MAX_RANKS or len(set(comm.nodes)) != 1 or \
                not shares_memory(s.transport) or \
                all(LL_PROTO not in v for v in comm.proto_enabled.values()):
            return None
        runner = cls.open(comm, cell_bytes=s.ll_cell or default_cell(comm.size),
                          spin_us=s.ll_spin_us if s.ll_spin_us is not None else
                          0.0 if crowded(comm.size) else 5.0, yield_us=s.ll_yield_us)
        comm.fabric.closers.append(runner.close)
        runner.grace = s.ll_async_us * 1e-6
        runner.stores = ll_stores.configure(comm, runner)
        why = "RINGTREE_CMA=0"
        if s.cma:
            runner.direct, why = ll_direct_probe.probe(runner.ll, comm.timeout)
            if runner.direct is not None:
                runner.direct.min_bytes = s.cma_min
                runner.direct.share = runner.direct.share and s.cma_share
                if s.tune == "online" and s.cma_min is None:
                    runner.crossover = ll_crossover.Crossover(comm, runner)
        if comm.debug in ("INFO", "TRACE") and comm.rank == 0:
            print(f"ringtree: LL rounds {native.describe()}; single-copy all-reduce, "
                  f"all-gather, reduce-scatter: {'process_vm_readv' if not why else 'off (' + why + ')'}",
                  flush=True)
        return runner

    @classmethod
    def open(cls, comm, *, cell_bytes: int, spin_us: float, yield_us: float) -> LLRunner:
        """Collective over ``comm``'s ranks (all on this host)."""
        ll = open_ll(comm.store, f"{comm.prefix}/ll", comm.rank, comm.size, comm.timeout,
                     cell_bytes=cell_bytes, spin_us=spin_us, yield_us=yield_us,
                     on_idle=comm._check_abort)
        return cls(ll)

    def fits(self, coll: Collective, count: int, itemsize: int) -> bool:
        return fits(self.ll, coll, count, itemsize)

    def serves_any_size(self, spec) -> bool:
        """Does LL serve the call of ``spec`` (a :class:`~ringtree.runtime.planner.CallSpec`)
        whatever its size: on the single-copy path
        (:mod:`~ringtree.runtime.protocols.ll_direct`), or, for an all-gather measured
        faster on the segment, streamed through it? An all-reduce or all-gather in the
        band where hosts disagree is measured first, once per octave
        (:mod:`~ringtree.runtime.protocols.ll_crossover`; collective)."""
        if self.crossover is not None:
            self.crossover.settle(spec)
        d = self.direct
        if ll_direct_fold.applies(d, spec.coll, spec.count, spec.dtype.itemsize,
                                  spec.reducer.code if spec.reducer else 0):
            return True
        # an all-gather whose segment path was measured faster: LL serves it, streamed
        return d is not None and spec.coll is Collective.ALL_GATHER and \
            d.gather_measured(spec.count * spec.dtype.itemsize * d.ll.n) is False

    def prepare(self, prog: Program, dt: DType, count: int, op_code: int, root: int):
        """The op that runs ``prog`` on this segment (ValueError: not a one-round
        Program): an :class:`~ringtree.runtime.protocols.ll_direct.DirectOp` where
        :meth:`serves_any_size`, else an :class:`LLOp`. The first such op of a block that
        streams measures the store mode first (collective)."""
        self.settle_stores(count * dt.itemsize)
        d = self.direct
        if ll_direct_fold.applies(d, prog.collective, count, dt.itemsize, op_code):
            return ll_direct_entry.op_for(self.ll, d, prog, dt, count, op_code, root)
        return LLOp(self.ll, prog, dt, count, op_code, root)

    def settle_stores(self, nbytes: int) -> None:
        """Measure the store mode (:mod:`~ringtree.runtime.protocols.ll_stores`) if it is
        still to be measured and an LL call's block of ``nbytes`` would stream; every rank
        calls this at the same call."""
        if self.stores is not None:
            self.stores.settle(nbytes)

    def run(self, comm, op: LLOp, spec, seq: int, async_op: bool, timeout: float | None):
        """Run ``spec`` (a :class:`~ringtree.runtime.planner.CallSpec`) on ``op``: now, or,
        if ``async_op``, on the LL thread (the Work completes there)."""
        if async_op:
            return self.submit(comm, op, spec.inp, spec.out, spec.reducer, spec.result,
                               spec.post, seq, timeout)
        if self.pending:
            self.drain()
        return self.run_arrays(comm, op, spec.inp, spec.out, spec.reducer, spec.result,
                               spec.post, seq, False, timeout)

    def announce(self, head: tuple[int, int, int]) -> None:
        """A Simple call takes its sequence number: show its header (call words)."""
        if self.pending:
            self.drain()
        self.ll.announce(head)

    # ---- one call ---------------------------------------------------------------------------

    def _now(self, comm, x: np.ndarray, op, out: np.ndarray | None, timeout: float | None,
             queued: bool = False):
        """The all-reduce's hot path (:func:`~.ll_hot.all_reduce`) through
        :meth:`run_arrays` when its last shape did not match (the op as a ReduceOp or its
        name: "sum" missed it and planned every call, 4x). Memory: contiguous, writeable,
        an ``out`` that may share memory with ``x`` goes the general way, which tells in
        place from a partial overlap. A blocking call's shape with a compiled round
        becomes ``planner.ready[HOT]``. ``queued``: an async call of a planned shape, queued for
        the LL thread (:meth:`submit`, after any calls still queued) with what its plan
        holds, where the general path would build its ``CallSpec`` and look the plan up
        again (~10 µs of a ~15 µs submission); its Work, or MISS."""
        in_place = out is None or out is x
        hit = comm.planner.ready.get((x.dtype, x.size, OP_NAMES.get(op.lower())
                                      if type(op) is str else op, in_place))
        if hit is None or comm._group is not None or comm.health.broken is not None or \
                self.pending and not queued or comm._closed or not x.flags.c_contiguous:
            return MISS
        if in_place:
            if not x.flags.writeable:
                return MISS
            out = x
        else:
            f = out.flags
            if out.dtype != x.dtype or out.shape != x.shape or not f.c_contiguous or \
                    not f.writeable or np.may_share_memory(x, out):
                return MISS
        if not queued and hit[0].hot is not None and ll_entry.scaled(hit[0], hit[1]):
            ll_hot.keep(comm.planner.ready, x, op, in_place, hit[0])
        return self._numbered(comm, hit, x, out, out, timeout, queued)

    def blocks_now(self, comm, coll: Collective, x: np.ndarray, out, op,
                   timeout: float | None, queued: bool = False):
        """:meth:`_now`'s twin for all_gather (``op`` None) and reduce_scatter:
        a NumPy call into a NumPy ``out`` of ``size`` × (all-gather) or 1/``size``
        (reduce-scatter) the elements of ``x``, whose shape the planner planned on LL
        (:attr:`~ringtree.runtime.planner.Planner.ready_blocks`), with the same O(1)
        checks. An ``out`` that shares memory with ``x`` goes the general way, but in
        place: ``x`` exactly an all-gather's ``out`` block ``rank``, or ``out`` a
        reduce-scatter's ``x`` block (nccl-tests' and FSDP's; the record's ``alias``,
        ``ringtree.ir.collectives``). :data:`MISS` when the call needs the general path.
        ``queued``: an async call, queued as :meth:`_now` queues one (its Work)."""
        if type(out) is not np.ndarray:
            return MISS
        gather = op is None
        hit = comm.planner.ready_blocks.get((coll, x.dtype, x.size if gather else out.size,
                                             -1 if gather else OP_NAMES.get(op.lower())
                                             if type(op) is str else op))
        if hit is None or comm._group is not None or comm.health.broken is not None or \
                self.pending and not queued or comm._closed:
            return MISS
        f = out.flags
        if (out.size != x.size * comm.size if gather else x.size != out.size * comm.size) \
                or out.dtype != x.dtype or not x.flags.c_contiguous or not f.c_contiguous \
                or not f.writeable or np.may_share_memory(x, out) and not (
                    x.ctypes.data == out.ctypes.data + comm.rank * x.nbytes if gather else
                    out.ctypes.data == x.ctypes.data + comm.rank * out.nbytes):
            return MISS
        if not queued and hit[0].hot is not None and ll_entry.scaled(hit[0], hit[1]):
            comm.planner.ready[ll_gather.GATHER if gather else ll_gather.SCATTER] = \
                ll_gather.entry(hit[0], x, op)  # the next call: one entry
        return self._numbered(comm, hit, x, out, out, timeout, queued)

    def _numbered(self, comm, hit: tuple, x: np.ndarray, out: np.ndarray, result,
                  timeout: float | None, queued: bool):
        """Number a call of a planned shape (``hit``: its op and reducer) from the
        issuing thread and run it now (``result``) or queue it (its Work)."""
        if comm._owner.ident != get_ident() and not comm.background:
            comm._owner.check(comm.rank)
        comm.seq += 1
        flat_x = x if x.ndim == 1 else x.reshape(-1)
        flat_out = out if out.ndim == 1 else out.reshape(-1)
        if queued:
            op = hit[0]
            entry = op.queued_entry  # its C entry, made once the op has one
            if entry is None and op.hot is not None:
                entry = op.queued_entry = (ll_hot.queued(op) if op.coll is Collective.
                                           ALL_REDUCE else ll_gather.queued(op)) or False
            return self.submit(comm, op, flat_x, flat_out, hit[1], result, None,
                               comm.seq, timeout, entry)
        return self.run_arrays(comm, hit[0], flat_x, flat_out, hit[1], result, None,
                               comm.seq, False, timeout)

    def queue(self, comm, coll: Collective, x: np.ndarray, out, op,
              timeout: float | None):
        """An async all-reduce, all-gather (``op`` None), reduce-scatter or in-place
        broadcast (``op``: the root) of a planned shape, queued as it is (:meth:`_now`,
        :meth:`blocks_now`, :meth:`broadcast_blocks` with ``queued``): its Work, or MISS
        for the general path (registered buffers at the registry's sizes included: the
        general path asks the registry). The timeout is refused before the call is
        numbered, as ``_run`` does."""
        reg, reduce = self.reg, coll is Collective.ALL_REDUCE
        if reg is not None and (x.nbytes >= reg.floor_all_reduce if reduce else
                                x.nbytes * self.ll.n >= reg.floor_blocks):
            return MISS
        timeout = ll_entry.timeout_of(timeout)
        if reduce:
            return self._now(comm, x, op, out, timeout, True)
        if coll is Collective.BROADCAST:
            return self.broadcast_blocks(comm, x, op, timeout, True)
        return self.blocks_now(comm, coll, x, out, op, timeout, True)

    gather_now = ll_gather.gather_now  # all_gather's one C entry, else blocks_now
    scatter_now = ll_gather.scatter_now  # reduce_scatter's one C entry, else blocks_now

    reduce_now = ll_entry.reduce_now  # reduce's one C entry, else MISS
    broadcast_now = ll_gather.broadcast_now  # broadcast's one C entry, else:

    def broadcast_blocks(self, comm, x: np.ndarray, root, timeout: float | None,
                         queued: bool = False):
        """:meth:`_now`'s twin for an in-place NumPy broadcast whose shape and
        root the planner planned on LL (a read-only root buffer goes the general way).
        :data:`MISS` when the call needs the general path; ``queued``: as :meth:`_now`."""
        hit = comm.planner.ready_blocks.get((Collective.BROADCAST, x.dtype, x.size, root))
        if hit is None or type(root) is not int or comm._group is not None or \
                comm.health.broken is not None or self.pending and not queued or \
                comm._closed or not x.flags.c_contiguous or not x.flags.writeable:
            return MISS
        if not queued and hit[0].hot is not None:  # the next call of this shape: one entry
            comm.planner.ready[ll_gather.BCAST] = ll_gather.entry(hit[0], x, root)
        return self._numbered(comm, (hit[0], None), x, x, x, timeout, queued)

    def barrier_now(self, comm, timeout: float | None):
        """A blocking barrier once one was planned on LL (``planner.ready_blocks``'s
        :data:`~.ll_entry.BARRIER`): in its C entry (:func:`~.ll_entry.barrier`), else
        numbered and run as :meth:`blocks_now` runs its calls, without a CallSpec or the
        planner (on an Intel Xeon host this Python path took 2.0-2.3 µs on 1 and 2
        ranks, against 3.1-3.8 through the general path and 0.45-0.9 for an 8-byte
        all-reduce). None, or :data:`MISS` for the general path."""
        hit = comm.planner.ready_blocks.get(ll_entry.BARRIER)
        if hit is None or comm._group is not None or comm.health.broken is not None or \
                self.pending or comm._closed:
            return MISS
        timeout = ll_entry.timeout_of(timeout)
        if hit[0].hot is not None and ll_entry.barrier(self, comm, hit[0], timeout):
            return None
        if comm._owner.ident != get_ident() and not comm.background:
            comm._owner.check(comm.rank)
        comm.seq += 1
        return self.run_arrays(comm, hit[0], None, None, hit[1], None, None, comm.seq,
                               False, timeout)

    def _finish_hot(self, comm, op: LLOp, out, r: int, s: int, timeout: float | None,
                    x=None) -> None:
        """Complete a hot call the kernel returned early from (``x``: a split's input)."""
        fr = comm.flight
        t = comm.timeout if timeout is None else timeout
        try:
            if x is not None:
                op.run.after(x.reshape(-1), out.reshape(-1), r, s, t)
            else:
                native.finish(self.ll, op.hot, r, s, t, op.describe)
                op.hot.fold(out, s & 1)
        except RingtreeError as err:
            err = comm._on_error(err)
            if fr is not None:
                fr.end_native(err)
            raise err from None
        if fr is not None:
            fr.end_native()

    def run_arrays(self, comm, op: LLOp, inp, out, red, result, post, seq: int,
                   async_op: bool, timeout: float | None):
        """Run call ``seq`` on ``op`` now, on this thread; a failure goes through
        ``comm._on_error`` (recorded for every rank)."""
        t = comm.timeout if timeout is None else timeout
        ex = comm.executor
        if ex.busy:  # async Simple work in flight: keep the memory order
            self._order(comm, inp, out)
        fr = comm.flight
        obs = ex.observer  # the profiler: the call's entry and exit, no steps
        active = obs.active
        desc = DescAt(op.desc, seq) if fr is not None or active else None
        e = fr.begin(desc) if fr is not None else None
        if active:
            nbytes = max(0 if inp is None else inp.nbytes, 0 if out is None else out.nbytes)
            obs.outside_begin(desc, op.coll.code, nbytes)
        try:
            op.run(inp, out, red, t)
            if post is not None:
                post()
            if active:
                obs.outside_end(seq, op.coll.code)
        except RingtreeError as err:
            err = comm._on_error(err)
            if e is not None:
                fr.end(e, err)
            if not async_op:
                raise err from None
            work = Work(op.name)
            work._finish(None, err)
            return work
        if e is not None:
            fr.end(e)
        if async_op:
            work = Work(op.name)
            work._finish(result)
            return work
        return result

    @staticmethod
    def _order(comm, inp, out) -> None:
        progress = comm.progress
        with progress.cv:
            before = comm.executor.overlapping((inp, out), (False, True))
        if before:
            progress.drive_until(lambda: all(b.done for b in before))

    def check(self) -> None:
        """Idle hook of a Simple call: MismatchError if a peer runs another call."""
        self.ll.check_announced(lambda: "the current call")

    def close(self) -> None:
        """Close the segment (a thread waiting in it fails) and let the LL thread go."""
        self.ll.close()
        self._let_go()

