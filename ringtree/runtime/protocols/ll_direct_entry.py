"""The single copy's whole call in one C entry.

A single-copy call (:mod:`ll_direct`, :mod:`ll_direct_fold`) is two LL calls around the
moves: call ``s`` publishes every rank's input and output addresses, the moves read or
write the peers' buffers through the kernel (``process_vm_readv``/``writev``), call
``s + 1`` publishes each rank's status and is what lets a caller reuse its buffers. The
moves were compiled already; the steps around them cost about 10 µs a call in Python
on an Intel Xeon host (two posts and waits, the status, the payload words), where the
moves of a 64 KiB all-gather take about 3.5 µs and the segment's whole call 8.9.

``Round.dcall`` (``transports/_direct.h``) runs both calls and the moves in one entry,
the GIL released: the same words in the same lines, the same moves in the same order
(all-gather: the push where ``DirectOp.push``, else straight reads; reduce-scatter
and all-reduce: ``fold_push``'s loop, the same bits), so kernel and Python ranks run
one job. :func:`prepare` gives an op the entry where its call is one of those
(:func:`mode`); ``op.run`` is then a :class:`Compiled`, which the general path calls
and whose :meth:`~Compiled.after` completes a call the kernel handed back:

- a code of call ``s`` (a peer asleep or late, a mismatch): Python finishes that wait
  (:func:`~ringtree.transports.shm_native.finish`: the liveness checks that name a dead
  rank, the timeout) and runs the moves and call ``s + 1`` itself;
- ``SECOND`` + a code of call ``s + 1``: the moves are done; Python finishes that wait
  and reads the statuses;
- ``D_GONE``: a peer's process was gone during a move (``ESRCH``): it is named;
- ``D_FAILED``: both calls done and a rank's status is set: every rank raises, naming
  who could not read or write whom.

The communicator's hot paths (:mod:`ll_hot` for the all-reduce, :mod:`ll_gather` for
the all-gather and reduce-scatter) and the async queue (:func:`~.ll_entry.run_queued`)
call the entry with the flight recorder's entry written from C, as for the segment's
one-entry calls; :func:`~.ll_entry.paired` completes it there (the broadcast's hot path,
``LLRunner.broadcast_now``, too). The shared copies, bounced reads, AVG and dtypes or ops
the kernel does not fold keep the Python steps.
"""

from __future__ import annotations

import errno

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Collective, Program
from ringtree.runtime.protocols import ll_direct as direct
from ringtree.runtime.protocols.ll_direct import ADDR, OUT, Direct, DirectOp
from ringtree.runtime.protocols.ll_direct_bcast import BroadcastOp
from ringtree.runtime.protocols.ll_direct_fold import AllReduceOp, ScatterOp, native_piece
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import LL

__all__ = ["Compiled", "available", "mode", "op_for", "prepare"]

_llc = native._llc
PUSH, READ, FOLD, FOLD_PUSH, BCAST = 1, 2, 3, 4, 5  # the entry's modes (_direct.h: DM_*)
OWN_CACHED, OWN_STREAM, OWN_MEMCPY = 0, 1, 2  # an all-gather's own copy (_direct.h: OWN_*)


def op_for(ll: LL, direct: Direct, prog: Program, dt: DType, count: int, op_code: int,
           root: int) -> DirectOp:
    """The single-copy op of ``prog`` (where
    :func:`~ringtree.runtime.protocols.ll_direct_fold.applies`), with its C entry where
    :func:`mode` gives one."""
    cls = {Collective.ALL_REDUCE: AllReduceOp, Collective.REDUCE_SCATTER: ScatterOp,
           Collective.BROADCAST: BroadcastOp}.get(prog.collective, DirectOp)
    op = cls(ll, direct, prog, dt, count, op_code, root)
    prepare(op)
    return op


def available() -> bool:
    """Is the C entry there (the kernel built, and not switched off)?"""
    return native.enabled() and hasattr(_llc.Round, "dcall")


def mode(op: DirectOp) -> int | None:
    """The moves ``Round.dcall`` makes for ``op``'s calls (:data:`PUSH`, :data:`READ`,
    :data:`FOLD`, :data:`FOLD_PUSH`, :data:`BCAST`), or None: the Python steps (no
    kernel, the shared or bounced all-gather, a broadcast's bounced read, a fold the
    kernel does not make)."""
    n = op.ll.n
    if not available() or n < 2:
        return None
    if op.coll is Collective.ALL_GATHER:  # the choices of DirectOp._gather
        if op.push:
            return PUSH
        return None if op.shares(op.straight()) or op.nbytes * n >= direct.STREAM_MIN \
            else READ
    if op.coll is Collective.BROADCAST:  # (shared and bounced copies: the Python steps)
        return None if op.shared or op.nbytes >= direct.BOUNCE_BROADCAST else BCAST
    if not getattr(op, "native", False):
        return None
    return FOLD_PUSH if op.coll is Collective.ALL_REDUCE else FOLD


def prepare(op: DirectOp) -> None:
    """Give ``op`` its C entry (``op.hot``, ``op.run`` a :class:`Compiled`) where
    :func:`mode` says the kernel makes its calls."""
    m = mode(op)
    if m is None:
        return
    ll, n, item = op.ll, op.ll.n, op.dtype.storage.itemsize
    k = native.make_round(ll, (0, 0), 0, ((), ()), 0, op.dtype.code,
                          getattr(op, "op_code", 0))
    lo = hi = piece = 0
    scratch = None
    block = op.nbytes
    if m == FOLD:  # block `op.block` of the input (n blocks) into the output
        block, lo = op.nbytes * n, op.block * op.nbytes
        hi = lo + op.nbytes
    elif m == FOLD_PUSH:  # the own block of the all-reduce's input
        lo, hi = op.bounds[ll.rank] * item, op.bounds[ll.rank + 1] * item
    elif m == BCAST:  # the root's buffer
        lo = op.root
    if m in (FOLD, FOLD_PUSH):
        piece = native_piece(n, item)
        op._scratch = scratch = np.empty((n - 1) * (piece + 4096), np.uint8)
    pids = [op.direct.pids.get(q, 0) for q in range(n)]
    order = list(op.order) if m in (FOLD, FOLD_PUSH) else []
    k.direct(m, ll.rank, pids, op._words[0], op._words[1], order, block, lo, hi, piece,
             own_copy(op) if m in (PUSH, READ) else 0, scratch)
    k.set_head(*op.head)
    op.hot = k
    op.run = Compiled(op, m)


def own_copy(op: DirectOp) -> int:
    """How the entry copies an all-gather's own block: streamed from
    :data:`~ringtree.runtime.protocols.ll_direct.STREAM_MIN` bytes of output (as
    ``DirectOp._own_copy``), else with glibc's ``memcpy`` where this process measured
    that offsets in a cache line cost ``rep movsb`` nothing
    (:func:`~ringtree.transports.shm_cma.offsets_matter`; on an Intel Xeon host, three
    alternated pairs, 64 KiB 4.45-4.61 µs a call against 4.71-4.78 with the segment's
    loop, 1 MiB 51.7-52.2 against 53.5-57.8), else the segment's cached loop (on an AMD
    EPYC Zen 3 host ``rep movsb`` ran 2-3.5x slower at a NumPy array's offsets)."""
    if op.nbytes * op.ll.n >= direct.STREAM_MIN:
        return OWN_STREAM
    return OWN_CACHED if cma.offsets_matter() else OWN_MEMCPY


class Compiled:
    """``op.run`` where the kernel makes the calls: ``Round.dcall``, the Python steps
    (``python``) for buffers it refuses, and :meth:`after` for a call it handed back."""

    __slots__ = ("op", "mode", "python", "entry")

    def __init__(self, op: DirectOp, m: int):
        self.op, self.mode, self.python, self.entry = op, m, op.run, op.hot.dcall

    def __call__(self, x: np.ndarray, out: np.ndarray, red, timeout: float) -> None:
        op = self.op
        ll = op.ll
        s = ll.seq + 1
        if ll.synced < s - 1:  # after Simple calls: the parity may need a wait
            ll.parity(timeout, op.describe)
        r = self.entry(x, out, s, -1)  # (not recorded from C: run_arrays records)
        if r == native.NOBUF:  # not contiguous, in place, another shape
            return self.python(x, out, red, timeout)
        self.after(x, out, r, s, timeout)

    def after(self, x: np.ndarray, out: np.ndarray, r: int, s: int, timeout: float) -> None:
        """Complete LL calls ``s`` and ``s + 1`` after ``Round.dcall`` returned ``r``
        (the module's codes); a failure raises."""
        op = self.op
        ll = op.ll
        ll.written[0] = ll.written[1] = None  # the kernel wrote both lines' headers
        if r == -1:
            ll.seq = ll.synced = s + 1
        elif r >= _llc.D_FAILED:
            ll.seq = ll.synced = s + 1
            op._statuses((s + 1) & 1)
        elif r >= _llc.D_GONE:
            ll.seq = ll.synced = s
            q, wrote = (r - _llc.D_GONE) >> 1, bool((r - _llc.D_GONE) & 1)
            op.direct.failed(q, errno.ESRCH, wrote)  # raises, naming it
        elif r >= native.SECOND // 2:
            ll.seq = s + 1
            native.finish(ll, op.hot, r - native.SECOND, s + 1, timeout, op.describe)
            ll.synced = s + 1
            op._statuses((s + 1) & 1)
        else:
            ll.seq = s
            native.finish(ll, op.hot, r, s, timeout, op.describe)
            ll.synced = s
            self._rest(x, out, s & 1, timeout)

    def _rest(self, x: np.ndarray, out: np.ndarray, p: int, timeout: float) -> None:
        """The moves and call ``s + 1`` in Python, every rank's words of parity ``p``
        posted: what the kernel did not do."""
        op, m = self.op, self.mode
        W, words, me = op.ll.W, op._words[p], op.ll.rank
        addrs = [int(W[i + ADDR]) for i in words]
        x, out = (x.reshape(-1),) * 2 if out is x else (x.reshape(-1), out.reshape(-1))
        own = None  # (an in-place call's flat views: one object, as the caller's were)
        if m == PUSH or m == READ:
            block = out[me * op.count:(me + 1) * op.count]
            if not np.may_share_memory(block, x):
                own = op._own_copy(x, block)
            status = op._pushes(x, words) if m == PUSH else \
                op._reads(addrs, cma.address(out), True)
        elif m == BCAST:
            status = op._bcast_moves(x, out, addrs)
        elif m == FOLD:
            lo = op.block * op.count
            status = op._fold_native(x[lo:lo + op.count], out, addrs, None,
                                     lo * x.itemsize) if op.count else 0
        else:
            b = op.bounds
            pairs = [(a, int(W[i + OUT])) for a, i in zip(addrs, words)]
            status = op._fold(x, out, None, pairs, b[me], b[me + 1]) \
                if b[me + 1] > b[me] else 0
        op._complete(status, timeout, own)

