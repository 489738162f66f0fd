"""The blocking ``dist.*`` call at the communicator's per-call cost.

``dist.all_reduce(t)`` (torch's ``opts.asyncOp`` False) waits on its Work at once, so
nothing needs a pending Work, a future, a completion thread or a staged tensor: the call
runs on its caller's thread and returns a :class:`~ringtree.torch.work.DoneWork`. What
each call used to rebuild is cached here:

- the NumPy view of a tensor (``Tensor.numpy`` costs ~1.5 µs), keyed by its data
  pointer, dtype and element count. The view keeps its tensor's storage alive, so no other
  tensor can reuse that address unless it views the same memory: a hit is always the same
  bytes. Only views of tensors up to :data:`CACHED_BYTES` are kept (at most
  :data:`CACHED_VIEWS` of them, dropped at shutdown), so the cache never holds much memory
  alive; a larger tensor gets a fresh view, whose cost is nothing next to its data.
- the timeout: torch passes a new ``timedelta`` each call; the last one's seconds are kept.

The view then reaches the communicator's own hot entries (``Communicator.all_reduce``,
``all_gather``, ``reduce_scatter``, ``broadcast`` with NumPy arrays: one C call for an
all-reduce of a seen shape), which check the memory, number the call and record it in
the flight recorder. A failure goes the general way: the error is carried by a
:class:`~ringtree.torch.work.RingtreeWork` and raised from ``wait()``, as before.
Tensors the fast path does not take (non-contiguous, dtypes NumPy lacks — bfloat16, bool,
int16, complex —, sparse, with ``requires_grad`` through their detached view: taken)
go the general path of :mod:`ringtree.torch.collectives`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ringtree.errors import CommAborted
from ringtree.ops import ReduceOp
from ringtree.torch.tensors import _NUMPY, reduce_op
from ringtree.torch.work import DoneWork, RingtreeWork, _seconds

CACHED_BYTES = 1 << 20
CACHED_VIEWS = 8
_STRIDED = torch.strided


class BlockingPath:
    """Mixed into RingtreeProcessGroup (which provides ``comm``, ``timeout``, ``_lock``,
    ``_closed``, ``_coalescing``, ``_finish`` and ``_dispatch``)."""

    _views: dict | None = None
    _td: tuple = (None, None)
    _last_op: tuple | None = None
    _done_work: DoneWork | None = None

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

    def _fast(self, opts: Any) -> bool:
        """Does a blocking call with these options take the fast path?"""
        return opts is not None and self._coalescing is None and not opts.asyncOp

    def _seconds_of(self, opts: Any) -> float:
        td = opts.timeout
        last = self._td
        if td == last[0]:
            s = last[1]
        else:
            s = _seconds(td)
            self._td = (td, s)
        return self.timeout if s is None else s

    def _op_of(self, opts: Any):
        """ringtree's operator for ``opts.reduceOp``. The last plain one is kept with its
        ``RedOpType`` (a ``ReduceOp`` equals a kind by kind: cheap; a PREMUL_SUM, whose
        factor counts, is never kept)."""
        r = opts.reduceOp
        last = self._last_op
        if last is not None and r == last[0]:
            return last[1]
        op = reduce_op(r)
        self._last_op = (r.op, op) if type(op) is ReduceOp else None
        return op

    def _entered(self) -> None:
        if self._closed:
            raise CommAborted(f"ringtree process group {self._group_name!r} is shut down")

    def _failed(self, name: str, value: Any, err: BaseException, tmo: float) -> RingtreeWork:
        """A failed blocking call's Work: ``wait()`` raises torch's form of ``err``."""
        work = RingtreeWork(name, value, self._dispatch)
        work._timeout_s = tmo
        self._finish(work, [], err)
        return work

    def _succeeded(self, value: Any) -> DoneWork:
        """The group's one finished Work, now holding ``value`` (torch waits on a blocking
        call's Work at once and drops it; a failed call gets a Work of its own)."""
        w = self._done_work
        if w is None:
            w = self._done_work = DoneWork(value)
        else:
            w._result = value
        return w

    def _drop_views(self) -> None:
        self._views = self._done_work = None

    # ---- the collectives ------------------------------------------------------------------

    def _fast_allreduce(self, tensors, opts):
        """``allreduce`` of one tensor, blocking; None when the general path must run."""
        x = self._view(tensors[0])
        if x is None:
            return None
        op, tmo = self._op_of(opts), self._seconds_of(opts)
        with self._lock:
            self._entered()
            try:
                self.comm.all_reduce(x, op, timeout=tmo)
            except BaseException as e:  # noqa: BLE001 - the Work carries it
                return self._failed("allreduce", tensors, e, tmo)
        return self._succeeded(tensors)

    def _fast_broadcast(self, tensors, opts):
        x = self._view(tensors[0])
        if x is None:
            return None
        root, tmo = int(opts.rootRank), self._seconds_of(opts)
        with self._lock:
            self._entered()
            try:
                self.comm.broadcast(x, root, timeout=tmo)
            except BaseException as e:  # noqa: BLE001
                return self._failed("broadcast", tensors, e, tmo)
        return self._succeeded(tensors)

    def _fast_all_gather(self, output, input, opts):  # noqa: A002 - torch's name
        xo, xi = self._view(output), self._view(input)
        if xo is None or xi is None:
            return None
        tmo = self._seconds_of(opts)
        with self._lock:
            self._entered()
            try:
                self.comm.all_gather(xi, out=xo, timeout=tmo)
            except BaseException as e:  # noqa: BLE001
                return self._failed("all_gather_single", [output], e, tmo)
        return self._succeeded([output])

    def _fast_reduce_scatter(self, output, input, opts):  # noqa: A002
        xo, xi = self._view(output), self._view(input)
        if xo is None or xi is None:
            return None
        op, tmo = self._op_of(opts), self._seconds_of(opts)
        with self._lock:
            self._entered()
            try:
                self.comm.reduce_scatter(xi, op, out=xo, timeout=tmo)
            except BaseException as e:  # noqa: BLE001
                return self._failed("reduce_scatter_single", [output], e, tmo)
        return self._succeeded([output])
