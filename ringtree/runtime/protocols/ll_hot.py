"""``Communicator.all_reduce`` in one Python frame: the method itself (and
``broadcast``, ``all_gather``, ``reduce_scatter`` in their own frames, below).

A blocking NumPy all-reduce of the last shape the hot path took (``planner.ready[HOT]``,
matched by identity: the array's dtype object, its size, the op object as the caller
wrote it, in place or not) is one C call, ``Round.hot`` (docs/design-notes.md, "The
small all-reduce in one C entry" and "The per-call cost: one frame, the array's
fields"). Before, that call sat behind two Python frames: ``Collectives.all_reduce``
(its argument checks) and ``LLRunner.all_reduce_now`` (the shape and the communicator's
state), each frame and each call between them ~0.1-0.3 µs of a 1.3 µs one-rank call.
:func:`all_reduce` is the communicator's method itself and does both in one frame, with
what a shape needs per call prepared when it is kept (:func:`keep`: the C entry as a
bound method, and whether the op is a split; the dtype object the entry then checks
itself, ``Round.expect``, with the size). Every check stays, each O(1): the arguments (a
NumPy ``x`` and ``out``, no ``algo``, not async), the timeout (refused before the call
is numbered, as ``_run``), the issuing thread (in the C entry: ``NOTMINE`` sends it to
``ThreadOwner.check``), the communicator's states (group, broken, closed, async LL calls
pending, async Simple work in flight for the memory order, an active profiler: one flag,
``_hot_off``, that every writer of them sets and ``Communicator._hot_blocked`` clears
when none holds), the parity; the memory (contiguous, writeable, the round's size;
``out``: x's dtype and shape, no overlap) is the C entry's buffer request (``NOBUF``:
nothing done). Anything else is :meth:`LLRunner._now
<ringtree.runtime.protocols.ll_runner.LLRunner._now>` (which plans, learns the shape, or
answers MISS) and then the general path, the communicator's ``_all_reduce_general``,
which raises every refusal's error as before. An async call of a shape the planner has
planned is queued from here too, with the same checks but for pending LL calls
(``LLRunner.queue``), instead of building its ``CallSpec`` and looking its plan up
again.

:func:`broadcast`, :func:`all_gather` and :func:`reduce_scatter` are those methods in the
same way: their argument checks, then the shape each kept last (``ll_gather``'s keys in
``planner.ready``) and :func:`~.ll_entry.enter`, the C entry; anything else goes the
communicator's ``_*_general`` (docs/design-notes.md, "The broadcast, all-gather and
reduce-scatter in one frame too").
"""

from __future__ import annotations

import numpy as np

from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp
from ringtree.runtime.protocols.ll_entry import MISS, bind, enter
from ringtree.runtime.protocols.ll_gather import BCAST, GATHER, SCATTER
from ringtree.runtime.protocols.ll_split import Split
from ringtree.settings import MIN_TIMEOUT, as_timeout
from ringtree.transports.shm_native import NOBUF, NOTMINE

# the key of planner.ready's entry for the last shape the hot path took (so clearing
# ready clears it too): a str, whose hash is kept, that no call's key tuple equals
HOT = "all_reduce_now: the last shape"
ndarray = np.ndarray  # a module global: NumPy's module attribute is not specialised


def keep(ready: dict, x: np.ndarray, op, in_place: bool, lop) -> None:
    """Make the shape of this call (``lop``: its compiled LLOp) the hot one:
    ``ready[HOT]`` = (dtype, size, op, in place, LLOp, its C entry, split or not). The
    entry checks the dtype object (``Round.expect``) and the size (the round's bytes)."""
    lop.hot.expect(x.dtype)
    two = lop.paired or type(lop.run) is Split  # LL calls s and s + 1 in the entry
    ready[HOT] = (x.dtype, x.size, op, in_place, lop, lop.run.entry if lop.paired else
                  lop.hot.hot, two)


def all_reduce(comm, x, op=ReduceOp.SUM, *, out=None, async_op: bool = False,
               algo: str | None = None, timeout: float | None = None):
    """Reduce ``x`` over all ranks; the result replaces ``x`` (or goes to ``out``)."""
    ll = comm.ll
    if ll is None or type(x) is not ndarray or algo is not None or \
            out is not None and type(out) is not ndarray:
        return comm._all_reduce_general(x, op, out, async_op, algo, timeout)
    if async_op:  # a planned shape queued as it is
        done = ll.queue(comm, Collective.ALL_REDUCE, x, out, op, timeout)
        return comm._all_reduce_general(x, op, out, True, None, timeout) if done is MISS \
            else done
    reg = ll.reg  # registered buffers: the peers' read in place (ll_reg)
    if reg is not None and x.nbytes >= reg.floor_all_reduce:
        done = reg.call(comm, Collective.ALL_REDUCE, x, out, op, timeout)
        if done is not MISS:
            return done
    if timeout is not None and not (type(timeout) is float and timeout >= MIN_TIMEOUT):
        timeout = as_timeout(timeout)
    m = comm.planner.ready.get(HOT)
    seg = ll.ll
    s = seg.seq + 1
    if m is None or op is not m[2] or (out is None or out is x) is not m[3] or \
            comm._hot_off and comm._hot_blocked() or seg.synced < s - 1:
        return _now(comm, ll, x, op, out, timeout)  # (after Simple calls the parity
    lop = m[4]                                       # may need a wait)
    if lop.rec is not comm.flight:
        bind(lop, comm.flight)
    seq = comm.seq + 1
    r = m[5](x, out, s, seq, comm._owner.ident)  # the issuing thread checked first
    if r == NOTMINE:  # not the owner's thread: refused, or this one takes over
        if not comm.background:
            comm._owner.check(comm.rank)
        r = m[5](x, out, s, seq)
    if r == NOBUF:
        return _now(comm, ll, x, op, out, timeout)
    comm.seq = seq
    seg.seq = s
    seg.written[s & 1] = None  # the kernel wrote all three header words
    if out is None:
        out = x
    if m[6]:  # the split's or the single copy's one entry: LL calls s and s + 1
        if r == -1:
            lop.run.after(x, out, r, s, 0.0)
        else:
            ll._finish_hot(comm, lop, out, r, s, timeout, x)
        return out
    if r != -1:
        ll._finish_hot(comm, lop, out, r, s, timeout)
    seg.synced = s
    return out


def queued(lop) -> tuple | None:
    """The C entry and completion of a queued async all-reduce of ``lop``'s shape
    (:func:`~.ll_entry.run_queued`), or None: no one entry, the split (two LL calls, its
    own completion), a one-rank PREMUL_SUM (whose scale is set per call). The single
    copy's entry completes its two calls itself (no completion)."""
    hot = lop.hot
    if hot is not None and lop.paired:  # the single copy's entry (ll_entry.paired)
        return lop.run.entry, None
    if hot is None or lop.premul or type(lop.run) is Split:
        return None
    return hot.hot, lambda x, out, p: hot.fold(out, p)


def _now(comm, ll, x: np.ndarray, op, out, timeout: float | None):
    done = ll._now(comm, x, op, out, timeout)
    if done is MISS:
        return comm._all_reduce_general(x, op, out, False, None, timeout)
    return done


def broadcast(comm, x, root: int = 0, *, async_op: bool = False, algo: str | None = None,
              timeout: float | None = None):
    """Copy root's ``x`` into ``x`` on every rank."""
    ll = comm.ll
    if ll is not None and type(x) is ndarray and algo is None and not async_op and \
            _entered(comm, ll, BCAST, x, x, root, timeout):
        return x
    return comm._broadcast_general(x, root, async_op, algo, timeout)


def all_gather(comm, x, *, out=None, async_op: bool = False, algo: str | None = None,
               timeout: float | None = None):
    """Concatenate every rank's ``x``: result shape ``(size, *x.shape)`` unless ``out``
    (an array of size·x.size elements, or a list of ``size`` arrays) is given."""
    ll = comm.ll
    if ll is not None and type(x) is ndarray and type(out) is ndarray and algo is None \
            and not async_op and _entered(comm, ll, GATHER, x, out, None, timeout):
        return out
    return comm._all_gather_general(x, out, async_op, algo, timeout)


def reduce_scatter(comm, x, op=ReduceOp.SUM, *, out=None, async_op: bool = False,
                   algo: str | None = None, timeout: float | None = None):
    """Reduce ``x`` (``size`` equal blocks, or a list of ``size`` arrays) and give rank
    r block r of the result, in ``out`` or a new array."""
    ll = comm.ll
    if ll is not None and type(x) is ndarray and type(out) is ndarray and algo is None \
            and not async_op and _entered(comm, ll, SCATTER, x, out, op, timeout):
        return out
    return comm._reduce_scatter_general(x, op, out, async_op, algo, timeout)


def _entered(comm, ll, key: str, x: np.ndarray, out: np.ndarray, red,
             timeout: float | None) -> bool:
    """Did the shape kept under ``key`` (dtype object, size, root or op by identity) run
    this call in its C entry (:func:`~.ll_entry.enter`)? Not for a registered buffers'
    call (``ll_gather``'s way) or a timeout ``_run`` would check first."""
    m, reg = comm.planner.ready.get(key), ll.reg
    return m is not None and x.dtype is m[0] and x.size == m[1] and red is m[2] and \
        (reg is None or x.nbytes * ll.ll.n < reg.floor_blocks) and \
        (timeout is None or type(timeout) is float and timeout >= MIN_TIMEOUT) and \
        enter(ll, comm, m, x, out, timeout)
