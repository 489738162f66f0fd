"""The collectives of a :class:`~ringtree.communicator.Communicator`: each method
validates its arguments into a frozen call spec (:mod:`ringtree.api`) and hands it to the
communicator's ``_run`` (plan, then issue), except where the call can take its
one-entry hot path: a synchronous NumPy call, no ``algo=``, on a communicator with an LL
segment goes to the LL runner's ``*_now`` first (:mod:`ringtree.runtime.protocols`), which
runs the last shape it saw in one C call (docs/design-notes.md, "The small all-reduce in
one C entry" and the sections after it) and answers ``MISS`` when the call needs the
general path. ``all_reduce`` is :func:`ringtree.runtime.protocols.ll_hot.all_reduce`
itself: its checks and the C call in one frame; ``broadcast``, ``all_gather`` and
``reduce_scatter`` are ``ll_hot``'s too (the kept shape checked in their frames, then
``_*_general``: the runner's ``*_now``, or the general path). An async NumPy call of a shape the
planner has planned on LL (all-reduce, all-gather, reduce-scatter, in-place broadcast)
is queued for the LL thread as it is (``LLRunner.queue``), without its spec.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ringtree import api
from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp
from ringtree.runtime.protocols import ll_hot
from ringtree.runtime.protocols.ll_runner import MISS
from ringtree.work import Work


class Collectives:
    """The collective methods of a communicator (``torch.distributed`` names and
    semantics), mixed into :class:`~ringtree.communicator.Communicator` as
    :class:`~ringtree.resilience.methods.Resilient` is; it provides what they use."""

    ll: Any                     # the LL runner (ringtree.runtime.protocols.ll_runner), or None
    _run: Callable[..., Any]    # plan a CallSpec and issue it (Communicator._run)

    all_reduce = ll_hot.all_reduce  # the method, its hot path in one frame

    def _all_reduce_general(self, x, op, out, async_op: bool, algo: str | None,
                            timeout: float | None):
        """:meth:`all_reduce` on the general path: validate, plan, issue."""
        return self._run(api.for_all_reduce(self, x, op, out, algo), async_op, timeout)

    broadcast = ll_hot.broadcast  # the method, its hot path in one frame

    def _broadcast_general(self, x, root, async_op: bool, algo: str | None,
                           timeout: float | None):
        """:meth:`broadcast` past its frame's hot path: a call to queue, a shape to learn,
        or the general path."""
        if algo is None and type(x) is np.ndarray and self.ll is not None:
            done = self.ll.queue(self, Collective.BROADCAST, x, x, root, timeout) \
                if async_op else self.ll.broadcast_now(self, x, root, timeout)
            if done is not MISS:
                return done
        return self._run(api.for_broadcast(self, x, root, algo), async_op, timeout)

    def reduce(self, x, root: int = 0, op=ReduceOp.SUM, *, out=None, async_op: bool = False,
               algo: str | None = None, timeout: float | None = None):
        """Reduce to ``root``: its ``x`` (or ``out``) gets the result; others are untouched."""
        if algo is None and not async_op and type(x) is np.ndarray and self.ll is not None:
            done = self.ll.reduce_now(self, x, root, op, out, timeout)  # the hot path
            if done is not MISS:
                return done
        return self._run(api.for_reduce(self, x, root, op, out, algo), async_op, timeout)

    all_gather = ll_hot.all_gather  # the method, its hot path in one frame

    def _all_gather_general(self, x, out, async_op: bool, algo: str | None,
                            timeout: float | None):
        """:meth:`all_gather` past its frame's hot path (as :meth:`_broadcast_general`)."""
        if algo is None and type(x) is np.ndarray and self.ll is not None:
            done = self.ll.queue(self, Collective.ALL_GATHER, x, out, None, timeout) \
                if async_op else self.ll.gather_now(self, x, out, timeout)
            if done is not MISS:
                return done
        return self._run(api.for_all_gather(self, x, out, algo), async_op, timeout)

    reduce_scatter = ll_hot.reduce_scatter  # the method, its hot path in one frame

    def _reduce_scatter_general(self, x, op, out, async_op: bool, algo: str | None,
                                timeout: float | None):
        """:meth:`reduce_scatter` past its frame's hot path (as
        :meth:`_broadcast_general`)."""
        if algo is None and type(x) is np.ndarray and self.ll is not None:
            done = self.ll.queue(self, Collective.REDUCE_SCATTER, x, out, op,
                                        timeout) if async_op else \
                self.ll.scatter_now(self, x, out, op, timeout)
            if done is not MISS:
                return done
        return self._run(api.for_reduce_scatter(self, x, op, out, algo), async_op, timeout)

    def gather(self, x, root: int = 0, *, out=None, async_op: bool = False,
               algo: str | None = None, timeout: float | None = None):
        """Root receives every rank's ``x`` (shape ``(size, *x.shape)``); others get None."""
        return self._run(api.for_gather(self, x, root, out, algo), async_op, timeout)

    def scatter(self, x, root: int = 0, *, out=None, async_op: bool = False,
                algo: str | None = None, timeout: float | None = None):
        """Rank r receives block r of root's ``x`` (``size`` equal blocks) into ``out``.
        Non-root ranks may pass ``x=None`` but then must pass ``out``."""
        return self._run(api.for_scatter(self, x, root, out, algo), async_op, timeout)

    def all_to_all(self, x, *, out=None, send_splits: Sequence[int] | None = None,
                   recv_splits: Sequence[int] | None = None, async_op: bool = False,
                   algo: str | None = None, timeout: float | None = None):
        """Rank r sends block j of ``x`` to rank j and receives block r of every rank.

        Equal blocks by default; ``send_splits``/``recv_splits`` give uneven block sizes
        in rows of dimension 0 (torch's ``all_to_all_single``). Missing ``recv_splits``
        are exchanged first.
        """
        spec = api.for_all_to_all(self, x, out, send_splits, recv_splits, algo)
        return self._run(spec, async_op, timeout)

    def barrier(self, *, async_op: bool = False, timeout: float | None = None):
        """Return once every rank has entered the barrier (dissemination algorithm)."""
        if not async_op and self.ll is not None:
            done = self.ll.barrier_now(self, timeout)  # planned on LL before
            if done is not MISS:
                return done
        return self._run(api.for_barrier(), async_op, timeout)

    def send(self, x, dst: int, tag: int = 0, *, timeout: float | None = None):
        """Send ``x`` to rank ``dst`` (matched in order per (dst, tag))."""
        return self._run(api.for_p2p(self, x, dst, tag, True), False, timeout)

    def recv(self, x, src: int, tag: int = 0, *, timeout: float | None = None):
        """Receive into ``x`` from rank ``src``; returns ``x``."""
        return self._run(api.for_p2p(self, x, src, tag, False), False, timeout)

    def isend(self, x, dst: int, tag: int = 0) -> Work:
        return self._run(api.for_p2p(self, x, dst, tag, True), True, None)

    def irecv(self, x, src: int, tag: int = 0) -> Work:
        return self._run(api.for_p2p(self, x, src, tag, False), True, None)

    def broadcast_object(self, obj: object = None, root: int = 0) -> object:
        """Root's picklable ``obj`` on every rank. Unpickles what root sent: use only
        within a trusted job."""
        return api.broadcast_object(self, obj, root)

    def all_gather_object(self, obj: object) -> list:
        """Every rank's picklable ``obj``, in rank order (unpickles peers' data)."""
        return api.all_gather_object(self, obj)
