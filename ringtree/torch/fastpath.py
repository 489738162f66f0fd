"""``dist.*`` calls at the communicator's per-call cost, blocking and async.

``dist.all_reduce(t)`` (torch's ``opts.asyncOp`` False) waits on its Work at once, so
nothing needs a pending Work, a future, a completion thread or a staged tensor: the call
runs on its caller's thread and returns a :class:`~ringtree.torch.work.DoneWork`. An async
call (``opts.asyncOp`` True) is issued to the communicator as a NumPy call is
(``comm.all_reduce(x, async_op=True)``: an LL call queued for the LL thread or a waiter,
:mod:`ringtree.runtime.protocols.ll_async`) and returns a
:class:`~ringtree.torch.work.PendingWork` over the communicator's Work, where the general
path staged the tensor, built a ``RingtreeWork`` and chained its completion on the
communicator's (two locks, a closure and a callback a call, which made an 8-byte
``dist.all_reduce(t, async_op=True).wait()`` on 2 ranks cost 177 µs against the
communicator's 50). A call refused as it is issued (bad arguments) raises at once, as the
general path's does. What each call used to rebuild is cached here:

- the NumPy view of a tensor (``Tensor.numpy`` costs ~1.5 µs), keyed by its data
  pointer, dtype and element count. The view keeps its tensor's storage alive, so no other
  tensor can reuse that address unless it views the same memory: a hit is always the same
  bytes. Only views of tensors up to :data:`CACHED_BYTES` are kept (at most
  :data:`CACHED_VIEWS` of them, dropped at shutdown), so the cache never holds much memory
  alive; a larger tensor gets a fresh view, whose cost is nothing next to its data.
- the timeout: torch passes a new ``timedelta`` each call; the last one's seconds are kept.

- the reduce operator: the last plain one, with its kind (:data:`_kind`: the option's
  hash, ~0.4 µs, where ``ReduceOp ==`` costs ~2 µs).

A blocking call's view then enters the communicator's one-call hot path itself
(``LLRunner.broadcast_now``, ``reduce_now``, ``gather_now``, ``scatter_now``: the C
entries ``bshot``, ``rhot``, ``ghot``, ``shot`` for a shape seen before), as
``Communicator.reduce`` does first for a blocking NumPy call (``broadcast``,
``all_gather`` and ``reduce_scatter`` check their kept shape in their own frames, then
fall back to these), one Python layer less; the kernel checks the memory, numbers the
call and records it in the flight recorder. A call it does not take (MISS) goes through
the communicator's method. An all-reduce calls ``Communicator.all_reduce``, whose hot
path is its own frame (:mod:`ringtree.runtime.protocols.ll_hot`), from ``allreduce``
itself, with the last tensor's view, operator and timeout checked inline (the tensor
by identity, then its data pointer, dtype, element count and contiguity, since a
tensor's data and dtype can change in place: ``set_``, ``resize_``, ``.data =``). Each
entry is one method of the group placed before the general ones (:class:`FastPath`
precedes :class:`~ringtree.torch.collectives.CollectiveOps`), so a blocking call costs
torch's own wrapper, the three option reads (pybind properties, ~0.3 µs each), the view,
the group's lock and the communicator's call. A failure goes the general way: the error is
carried by a :class:`~ringtree.torch.work.RingtreeWork` and raised from ``wait()``.
Calls the fast path does not take (coalesced, several tensors; tensors non-contiguous,
of dtypes NumPy lacks — bfloat16, bool, int16, complex —, sparse; with ``requires_grad``
through their detached view: taken) go the general path of
:mod:`ringtree.torch.collectives`.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ringtree.errors import CommAborted
from ringtree.ops import ReduceOp
from ringtree.runtime.protocols.ll_runner import MISS
from ringtree.torch.tensors import _NUMPY, reduce_op
from ringtree.torch.work import DoneWork, PendingWork, RingtreeWork, _seconds


def _hash_is_kind() -> bool:
    """Does ``hash(ReduceOp)`` give its kind's number on this torch, for every kind? (Its
    binding hashes the kind.) Then a call tells the last operator again by its hash,
    ~0.4 µs with the option's read, where ``ReduceOp ==`` (pybind's comparison, through
    implicit conversions) was ~2 µs, a sixth of a blocking ``dist.all_reduce``."""
    try:
        opts = dist.AllreduceOptions()
        for kind in dist.ReduceOp.RedOpType.__members__.values():
            if kind == dist.ReduceOp.RedOpType.PREMUL_SUM:  # made with its factor only:
                continue                                  # never the kept operator
            opts.reduceOp = kind
            if hash(opts.reduceOp) != int(kind):
                return False
        return True
    except (AttributeError, TypeError, ValueError):
        return False


# what identifies a torch ReduceOp's kind in the last operator's cache: its hash where
# that is the kind's number, else its RedOpType (compared with ==)
_kind = hash if _hash_is_kind() else attrgetter("op")
CACHED_BYTES = 1 << 20
CACHED_VIEWS = 8
_STRIDED = torch.strided


class _Hot:
    """What ``allreduce`` reads per call, in one plain object: an attribute of
    the group (a pybind-derived ``ProcessGroup``, whose type lookups are not cached) costs
    ~35 ns more than a slot here; ten of them were a tenth of the call. ``view``: the
    last tensor's (tensor, data pointer, dtype, numel, NumPy view); ``op``: the last
    reduce op's (kind, ringtree op); ``td``: the last timeout's (timedelta, seconds or
    None); ``work``: the finished Work handed back for every successful call."""

    __slots__ = ("comm", "lock", "timeout", "view", "op", "td", "work")

    def __init__(self, comm, lock, timeout: float):
        self.comm, self.lock, self.timeout = comm, lock, timeout
        self.view = self.op = None
        self.td = (None, None)
        self.work = DoneWork(None)


class FastPath:
    """Put before :class:`~ringtree.torch.collectives.CollectiveOps` in
    RingtreeProcessGroup's bases (which provide ``comm``, ``timeout``, ``_lock``,
    ``_closed``, ``_coalescing``, ``_finish`` and ``_dispatch``): each entry below takes a
    call it can serve and hands every other to the general method (``super()``)."""

    _views: dict | None = None
    _td: tuple = (None, None)
    _last_op: tuple | None = None
    _done_work: DoneWork | None = None
    _hot: _Hot | None = None         # allreduce's state

    # ---- the entries torch calls ------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        h = self._hot  # the state read per call, one attribute of the group away
        if h is None or opts is None or self._coalescing is not None or len(tensors) != 1:
            return self._allreduce_first(tensors, opts)
        t = tensors[0]
        v = h.view  # the last tensor's view: checked by identity, then in place changes
        if v is not None and v[0] is t and t.data_ptr() == v[1] and t.dtype is v[2] and \
                t.numel() == v[3] and t.is_contiguous():
            x = v[4]
        else:
            x = self._view(t)
            if x is None:
                return super().allreduce(tensors, opts)
            if x.nbytes <= CACHED_BYTES:  # (it keeps t alive, as the views do)
                h.view = (t, t.data_ptr(), t.dtype, t.numel(), x)
        r, op = opts.reduceOp, h.op
        if op is not None and _kind(r) == op[0]:
            op = op[1]
        else:
            op = self._op_of(r)
            h.op = self._last_op  # a plain op's (kind, op); PREMUL_SUM's: None
        td, tmo = opts.timeout, h.td
        if not td == tmo[0]:
            tmo = h.td = (td, _seconds(td))
        tmo = h.timeout if tmo[1] is None else tmo[1]
        pending = opts.asyncOp
        with h.lock:
            if self._closed:
                raise CommAborted(f"ringtree process group {self._group_name!r} is shut down")
            try:
                part = h.comm.all_reduce(x, op, async_op=True, timeout=tmo) if pending \
                    else h.comm.all_reduce(x, op, timeout=tmo)
            except BaseException as e:  # noqa: BLE001 - the Work carries it
                if pending:  # refused as issued (bad arguments): raised at once
                    raise
                return self._failed("allreduce", tensors, e, tmo)
        if pending:
            return PendingWork(part, tensors, self, "allreduce", tmo)
        w = h.work
        w._result = tensors
        return w

    def _allreduce_first(self, tensors, opts):
        """:meth:`allreduce` without its state (made here, unless the group is shut
        down) or for a call it does not take (coalescing, several tensors, no options)."""
        if self._hot is None and not self._closed:
            self._hot = _Hot(self.comm, self._lock, self.timeout)
            return self.allreduce(tensors, opts)
        return super().allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        if opts is None or self._coalescing is not None or len(tensors) != 1:
            return super().broadcast(tensors, opts)
        x = self._view(tensors[0])
        if x is None:
            return super().broadcast(tensors, opts)
        return self._run("broadcast", tensors, _broadcast, x, None, int(opts.rootRank),
                         self._seconds_of(opts.timeout), opts.asyncOp)

    def reduce(self, tensors, opts=None):
        if opts is None or self._coalescing is not None or len(tensors) != 1:
            return super().reduce(tensors, opts)
        x = self._view(tensors[0])
        if x is None:
            return super().reduce(tensors, opts)
        return self._run("reduce", tensors, _reduce, x, int(opts.rootRank),
                         self._op_of(opts.reduceOp), self._seconds_of(opts.timeout),
                         opts.asyncOp)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        if opts is None or self._coalescing is not None:
            return super().all_gather_single(output, input, opts)
        xo, xi = self._view(output), self._view(input)
        if xo is None or xi is None:
            return super().all_gather_single(output, input, opts)
        return self._run("all_gather_single", [output], _all_gather, xi, xo, None,
                         self._seconds_of(opts.timeout), opts.asyncOp)

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        if opts is None or self._coalescing is not None:
            return super().reduce_scatter_single(output, input, opts)
        xo, xi = self._view(output), self._view(input)
        if xo is None or xi is None:
            return super().reduce_scatter_single(output, input, opts)
        return self._run("reduce_scatter_single", [output], _reduce_scatter, xi, xo,
                         self._op_of(opts.reduceOp), self._seconds_of(opts.timeout),
                         opts.asyncOp)

    _reduce_scatter_base = reduce_scatter_single

    # ---- what the entries share -------------------------------------------------------

    def _run(self, name: str, value: Any, entry, x, a, b, tmo: float | None,
             pending: bool):
        """``entry(comm, x, a, b, tmo, pending)`` in this group's issue order: run to its
        end on this thread (``pending`` False: the group's one finished Work holding
        ``value``, since torch waits on a blocking call's Work at once and drops it) or
        issued (a :class:`~ringtree.torch.work.PendingWork` over the communicator's
        Work); a call that fails as it is issued or run gets a failed Work of its own that
        raises torch's form of the error from ``wait()``."""
        tmo = self.timeout if tmo is None else tmo
        with self._lock:
            if self._closed:
                raise CommAborted(f"ringtree process group {self._group_name!r} is shut down")
            try:
                part = entry(self.comm, x, a, b, tmo, pending)
            except BaseException as e:  # noqa: BLE001 - the Work carries it
                if pending:  # refused as issued (bad arguments): raised at once
                    raise
                return self._failed(name, value, e, tmo)
        if pending:
            return PendingWork(part, value, self, name, tmo)
        return self._done(value)

    def _failed(self, name: str, value: Any, e: BaseException, tmo: float | None):
        work = RingtreeWork(name, value, self._dispatch)
        work._timeout_s = self.timeout if tmo is None else tmo
        self._finish(work, [], e)
        return work

    def _done(self, value: Any) -> DoneWork:
        w = self._done_work
        if w is None:
            w = self._done_work = DoneWork(value)
        else:
            w._result = value
        return w

    def _view(self, t: torch.Tensor) -> np.ndarray | None:
        """``t``'s memory as a NumPy array, or None when the fast path cannot take it."""
        views = self._views
        if views is None:
            views = self._views = {}
        if t.layout is not _STRIDED:
            return None
        key = (t.data_ptr(), t.dtype, t.numel())
        x = views.get(key)
        if x is not None and t.is_contiguous():
            return x
        if t.dtype not in _NUMPY or not t.is_contiguous() or t.device.type != "cpu":
            return None
        try:
            x = t.detach().numpy()
        except (RuntimeError, TypeError):  # conjugate/negative bit views and the like
            return None
        if x.nbytes <= CACHED_BYTES:
            if len(views) >= CACHED_VIEWS:
                views.clear()
            views[key] = x
        return x

    def _seconds_of(self, td: Any) -> float | None:
        """The call's timeout from torch's ``opts.timeout``, None: the group's (the last
        ``timedelta``'s seconds are kept: torch passes a new, equal one each call)."""
        last = self._td
        if td == last[0]:
            return last[1]
        s = _seconds(td)
        self._td = (td, s)
        return s

    def _op_of(self, r: Any):
        """ringtree's operator for torch's ``opts.reduceOp``. The last plain one is kept
        with its kind (:data:`_kind`; a PREMUL_SUM, whose factor counts, is never kept)."""
        last = self._last_op
        if last is not None and _kind(r) == last[0]:
            return last[1]
        op = reduce_op(r)
        self._last_op = (_kind(r), op) if type(op) is ReduceOp else None
        return op

    def _drop_views(self) -> None:
        self._views = self._done_work = self._hot = None


# ---- the communicator's hot entries, entered directly ---------------------------------------
# Each is what ``Communicator.all_reduce`` (``broadcast``, ``reduce``, ``all_gather``,
# ``reduce_scatter``) does first for a blocking NumPy call without ``algo``; a call the
# hot entry does not take (MISS: not planned yet, a subgroup, a broken communicator ...)
# goes through the communicator's method, which takes the general path.

def _broadcast(comm, x: np.ndarray, out: None, root: int, tmo: float, pending: bool):
    if pending:
        return comm.broadcast(x, root, async_op=True, timeout=tmo)
    ll = comm.ll
    if ll is None or ll.broadcast_now(comm, x, root, tmo) is MISS:
        comm.broadcast(x, root, timeout=tmo)
    return None


def _reduce(comm, x: np.ndarray, root: int, op: Any, tmo: float, pending: bool):
    if pending:
        return comm.reduce(x, root, op, async_op=True, timeout=tmo)
    ll = comm.ll
    if ll is None or ll.reduce_now(comm, x, root, op, None, tmo) is MISS:
        comm.reduce(x, root, op, timeout=tmo)
    return None


def _all_gather(comm, x: np.ndarray, out: np.ndarray, _: None, tmo: float, pending: bool):
    if pending:
        return comm.all_gather(x, out=out, async_op=True, timeout=tmo)
    ll = comm.ll
    if ll is None or ll.gather_now(comm, x, out, tmo) is MISS:
        comm.all_gather(x, out=out, timeout=tmo)
    return None


def _reduce_scatter(comm, x: np.ndarray, out: np.ndarray, op: Any, tmo: float,
                    pending: bool):
    if pending:
        return comm.reduce_scatter(x, op, out=out, async_op=True, timeout=tmo)
    ll = comm.ll
    if ll is None or ll.scatter_now(comm, x, out, op, tmo) is MISS:
        comm.reduce_scatter(x, op, out=out, timeout=tmo)
    return None
