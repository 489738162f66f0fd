"""One compiled step, run as a generator, phase by phase.

A step (``ringtree/ir/program.py``) is ``value = src; value (⊕|=) recv(p) for p in
recv_from; dst = value; send value to each of send_to``, cut into slices that flow
independently (NCCL's slices). :func:`run_step` runs one in five phases:

1. *post* every receive of every slice at once (:func:`post_receives`): into the
   destination when nothing is reduced, into pooled staging otherwise, or in place out of
   the peer's shared-memory slot (zero-copy, single-receive reduces only, so holding a
   slot never waits on another peer);
2. per slice, *wait* for the slice of each receive;
3. *combine* (:func:`combine`): reduce the slice, or take the received or local value;
4. *send* it, in program order per (peer, channel): a step that has its data before an
   earlier step to the same peer waits for its turn (:class:`Turn`);
5. *drain* the sends, then give staging buffers and slots back (also after an error).

The generator yields what it waits for (a request or a turn, each with ``done``); the
scheduler (:mod:`ringtree.runtime.executor`) resumes it when that is done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np

from ringtree.ir.wire import WireHeader
from ringtree.runtime.plan import Call, CStep
from ringtree.transports.base import Request

if TYPE_CHECKING:
    from ringtree.runtime.batch import Pending
    from ringtree.runtime.executor import Executor
    from ringtree.runtime.observer import StepWatch


class BufferPool:
    """Reusable staging buffers (no per-call allocation of big buffers)."""

    def __init__(self) -> None:
        self.free: dict[int, list[np.ndarray]] = {}

    def get(self, nbytes: int) -> np.ndarray:
        size = 1 << max(6, (nbytes - 1).bit_length())
        lst = self.free.get(size)
        return lst.pop() if lst else np.empty(size, dtype=np.uint8)

    def put(self, buf: np.ndarray) -> None:
        lst = self.free.setdefault(buf.nbytes, [])
        if len(lst) < 8:
            lst.append(buf)


class Turn:
    """Waitable: a step's turn to post its sends to one (peer, channel)."""

    __slots__ = ("queue", "step", "peer", "index")
    is_send = True
    header = bytes(8)
    pos = 0
    error = None

    def __init__(self, queue: deque, step: CStep, peer: int, index: int):
        self.queue, self.step, self.peer, self.index = queue, step, peer, index

    @property
    def done(self) -> bool:
        return self.queue[0] is self.step


class Receives:
    """Phase 1's result: per receive, where its slices land and their requests."""

    __slots__ = ("staged", "reqs", "tmps", "acc", "viewed")

    def __init__(self) -> None:
        self.staged: list[np.ndarray] = []    # staging per receive (not for `viewed`)
        self.reqs: list[list[Request]] = []   # per receive, per slice
        self.tmps: list[np.ndarray] = []      # pooled buffers to give back
        self.acc: np.ndarray | None = None    # a viewed reduce's value, without a dst
        self.viewed = False                   # the (only) receive is read in its slot


NO_RECEIVES = Receives()


def views(cs: CStep, call: Call) -> tuple[np.ndarray | None, np.ndarray | None, np.dtype]:
    """The step's source and destination regions of the call's buffers, and their dtype."""
    bufs = call.bufs
    src = bufs[cs.src.buf][cs.src.off:cs.src.off + cs.length] if cs.src else None
    dst = bufs[cs.dst.buf][cs.dst.off:cs.dst.off + cs.length] if cs.dst else None
    proto = src if src is not None else dst
    assert proto is not None
    return src, dst, proto.dtype


def header(call: Call, nbytes: int) -> bytes:
    return WireHeader.frame(nbytes, call.prefix)


def post_receives(ex: Executor, cs: CStep, call: Call, ch: int, dst: np.ndarray | None,
                  dtype: np.dtype) -> Receives:
    """Phase 1: post every slice of every receive of the step."""
    s, fabric, itemsize = cs.step, ex.fabric, dtype.itemsize
    r = Receives()
    if s.reduce and len(s.recv_from) == 1 and fabric.can_view(
            s.recv_from[0], max(ln for _, ln in cs.slices) * itemsize):
        peer = s.recv_from[0]
        r.viewed = True
        r.reqs.append([fabric.irecv_view(peer, ch, header(call, ln * itemsize), ln * itemsize)
                       for _, ln in cs.slices])
        if dst is None:  # the value must outlive the slot: keep it here
            r.acc = _staging(ex, r, cs.length, dtype)
        return r
    for peer in s.recv_from:
        if not s.reduce and dst is not None:
            target = dst
        else:
            target = _staging(ex, r, cs.length, dtype)
            r.staged.append(target)
        bview = target.view(np.uint8)
        r.reqs.append([fabric.irecv(peer, ch, header(call, ln * itemsize),
                                    bview[off * itemsize:(off + ln) * itemsize])
                       for off, ln in cs.slices])
    return r


def _staging(ex: Executor, r: Receives, length: int, dtype: np.dtype) -> np.ndarray:
    raw = ex.pool.get(length * dtype.itemsize)
    r.tmps.append(raw)
    return raw[:length * dtype.itemsize].view(dtype)


def combine(cs: CStep, call: Call, r: Receives, k: int, sl: slice, src: np.ndarray | None,
            dst: np.ndarray | None, dtype: np.dtype, fabric) -> np.ndarray:
    """Phase 3: the value slice ``k`` carries on (reduced, received or local)."""
    s = cs.step
    if s.reduce:
        red = call.reducer
        assert red is not None
        if not s.recv_from:  # local reduce: dst = dst ⊕ src
            assert dst is not None and src is not None
            red.combine(dst[sl], dst[sl], src[sl])
            return dst[sl]
        got = [r.reqs[0][k].buf.view(dtype)] if r.viewed else [t[sl] for t in r.staged]
        parts = [src[sl], *got] if src is not None else got
        target = dst[sl] if dst is not None else r.acc[sl] if r.acc is not None else got[0]
        red.combine(target, parts[0], parts[1])
        for extra in parts[2:]:
            red.combine(target, target, extra)
        if r.viewed:  # done with the peer's slot (the value is never in it)
            fabric.release(r.reqs[0][k])
        return target
    if s.recv_from:
        return dst[sl] if dst is not None else r.staged[0][sl]
    assert src is not None
    if dst is not None and not cs.skip_copy:
        dst[sl] = src[sl]
    return src[sl]


def post_sends(ex: Executor, cs: CStep, call: Call, ch: int, value: np.ndarray, last: bool,
               sends: list[Request], watch: StepWatch | None, start: int) -> Turn | None:
    """Phase 4: send the slice's ``value`` to ``send_to[start:]``, in program order per
    (peer, channel): returns the :class:`Turn` to wait for when an earlier step to that
    peer has not posted yet (then call again from ``turn.index``)."""
    raw = value.view(np.uint8)
    hdr = header(call, raw.nbytes)
    to = cs.step.send_to
    for i in range(start, len(to)):
        peer = to[i]
        q = ex.turns.get((peer, ch))  # this step's place in line, taken at issue
        if q is not None and q[0] is not cs:
            return Turn(q, cs, peer, i)
        if watch is not None:
            watch.sent(peer, raw.nbytes)
        sends.append(ex.fabric.isend(peer, ch, hdr, raw))
        if last and q is not None:
            q.popleft()
    return None


def give_back(ex: Executor, r: Receives) -> None:
    """Phase 5's cleanup: slots a view receive still holds (after an error), staging."""
    if r is NO_RECEIVES:
        return
    if r.viewed:
        for req in r.reqs[0]:
            if req.done and req.error is None:
                ex.fabric.release(req)
    for t in r.tmps:
        ex.pool.put(t)


def run_step(ex: Executor, cs: CStep, call: Call) -> Generator[Pending, None, None]:
    """Run one step of ``call`` (see the module docstring); yields what it waits on."""
    if cs.length == 0:
        return
    s, ch = cs.step, call.channel_base + cs.channel
    src, dst, dtype = views(cs, call)
    obs = ex.observer
    watch: StepWatch | None = obs.step(cs, call, ch) if obs.active else None
    r = post_receives(ex, cs, call, ch, dst, dtype) if s.recv_from else NO_RECEIVES
    sends: list[Request] = []
    last = len(cs.slices) - 1
    try:
        for k, (off, ln) in enumerate(cs.slices):
            for j, reqs in enumerate(r.reqs):                       # phase 2: wait
                req = reqs[k]
                t0 = 0 if watch is None else obs.clock()
                while not req.done:
                    yield req
                if req.error is not None:
                    raise req.error
                if watch is not None:
                    watch.recv_waited(t0, j, k, req, ln * dtype.itemsize)
            t0 = 0 if watch is None else obs.clock()
            value = combine(cs, call, r, k, slice(off, off + ln), src, dst, dtype,  # phase 3
                            ex.fabric)
            if watch is not None:
                watch.combined(t0, ln * dtype.itemsize)
            if s.send_to:                                           # phase 4: send
                turn = post_sends(ex, cs, call, ch, value, k == last, sends, watch, 0)
                while turn is not None:  # an earlier step to that peer has not sent yet
                    while not turn.done:
                        yield turn
                    turn = post_sends(ex, cs, call, ch, value, k == last, sends, watch,
                                      turn.index)
        t0 = 0 if watch is None else watch.draining(sends)
        for req in sends:                                           # phase 5: drain
            while not req.done:
                yield req
            if req.error is not None:
                raise req.error
        if watch is not None:
            watch.finished(t0, cs.length * dtype.itemsize)
    finally:
        give_back(ex, r)
