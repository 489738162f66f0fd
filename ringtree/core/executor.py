"""The executor: runs one rank's compiled calls (:mod:`ringtree.core.plan`) over its transports.

Running follows three rules:

1. *In-order issue*: within a channel, step i+1 is issued no earlier than step i, so the
   messages of a (sender, receiver, channel) triple are posted in program order — the
   IR's matching rule.
2. *Out-of-order completion*: a step waits only for earlier steps that touch the same
   memory (read-after-write, write-after-read, write-after-write). Sends never block a
   channel, so a rank that sends to ``next`` and receives from ``prev`` makes progress
   at any size.
3. *Slicing*: each step's data is cut into slices of ``slice_bytes`` that flow
   recv → reduce → send independently, which pipelines chains and trees (NCCL's
   slices/chunkSteps).

Each issued step is a generator that yields the request it waits for; the scheduler
resumes steps whose requests completed and sleeps in the transports' ``wait`` when none
can move. Calls are submitted as they are issued and driven by whichever thread waits
(see the scheduler section and ``docs/design-notes.md``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator

import numpy as np

from ringtree.core.ir import Buf
from ringtree.core.plan import DEFAULT_SLICE_BYTES, Call, CStep
from ringtree.core.wire import WireHeader
from ringtree.errors import CollectiveTimeout, CommAborted, MismatchError, PeerError
from ringtree.prof.recorder import Ev, prim_code
from ringtree.prof.recorder import now as ns_now
from ringtree.transports.base import HeaderMismatch, Request


class BufferPool:
    """Reusable staging buffers (no per-call allocation of big buffers)."""

    def __init__(self) -> None:
        self.free: dict[int, list[np.ndarray]] = {}

    def get(self, nbytes: int) -> np.ndarray:
        size = 1 << max(6, (nbytes - 1).bit_length())
        lst = self.free.get(size)
        buf = lst.pop() if lst else np.empty(size, dtype=np.uint8)
        return buf

    def put(self, buf: np.ndarray) -> None:
        lst = self.free.setdefault(buf.nbytes, [])
        if len(lst) < 8:
            lst.append(buf)


class Executor:
    """Runs calls of one rank over a fabric (``isend``/``irecv``/``poll``/``wait``)."""

    def __init__(self, rank: int, fabric, *, on_idle: Callable[[], None] | None = None,
                 slice_bytes: int = DEFAULT_SLICE_BYTES):
        self.rank = rank
        self.fabric = fabric
        self.on_idle = on_idle
        self.slice_bytes = slice_bytes
        self.pool = BufferPool()
        self.on_error: Callable[[BaseException], BaseException] | None = None
        self._chans: dict[int, deque] = {}       # channel -> steps not yet issued, in order
        self._turns: dict[tuple[int, int], deque] = {}  # (peer, channel) -> senders in order
        self._active: list[list] = []            # [generator, awaited, step, call, batch]
        self._batches: list[Batch] = []
        self._epoch = 0  # bumped by cancel(): a round in progress must stop
        self._probes: list[Probe] = []           # receives from any source, not matched yet
        self._claims: set[tuple[int, int]] = set()  # (peer, channel) a probe has matched
        # Longest sleep in the transports: calls submitted meanwhile wait for the wake-up
        # (the transports offer no wake-up descriptor), so latency-bound users lower it.
        self.wait_cap = 0.25
        self.rec = None      # ringtree.prof.recorder.Recorder while profiling
        self.blocked: list | None = None  # active steps as of the last wait (for the doctor)

    # ---- one step --------------------------------------------------------------------

    def _step(self, cs: CStep, call: Call) -> Generator[Request, None, None]:
        s, fabric = cs.step, self.fabric
        if cs.length == 0:
            return
        bufs, red = call.bufs, call.reducer
        ch = call.channel_base + cs.channel
        src = bufs[cs.src.buf][cs.src.off:cs.src.off + cs.length] if cs.src else None
        dst = bufs[cs.dst.buf][cs.dst.off:cs.dst.off + cs.length] if cs.dst else None
        proto = src if src is not None else dst
        assert proto is not None
        itemsize = proto.itemsize
        rec = self.rec
        if rec is not None:  # profiling: the step's start, message indices of its receives
            t_step, seq, gid, prim = ns_now(), call.desc.seq, cs.gid, prim_code(s)
            rbase = rec.claim_recvs(s.recv_from, ch, seq, len(cs.slices))
        staged: list[np.ndarray] = []
        tmps: list[np.ndarray] = []
        recvs: list[list[Request]] = []
        acc = None
        if s.recv_from:
            direct = not s.reduce and dst is not None
            # Zero-copy (shm): reduce straight out of the peer's slot, then release it.
            # Only for single-receive steps, so holding a slot never waits on another peer.
            can_view = getattr(fabric, "can_view", None) \
                if s.reduce and len(s.recv_from) == 1 else None
            for peer in s.recv_from:
                if can_view is not None and can_view(peer, max(ln for _, ln in cs.slices)
                                                     * itemsize):
                    staged.append(None)  # type: ignore[arg-type]
                    recvs.append([fabric.irecv_view(peer, ch, self._header(call, ln * itemsize),
                                                    ln * itemsize) for _, ln in cs.slices])
                    if dst is None:  # the value must outlive the slot: keep it here
                        raw = self.pool.get(cs.length * itemsize)
                        tmps.append(raw)
                        acc = raw[:cs.length * itemsize].view(proto.dtype)
                    continue
                if direct:
                    target = dst
                else:
                    raw = self.pool.get(cs.length * itemsize)
                    tmps.append(raw)
                    target = raw[:cs.length * itemsize].view(proto.dtype)
                    staged.append(target)
                bview = target.view(np.uint8)
                recvs.append([
                    fabric.irecv(peer, ch, self._header(call, ln * itemsize),
                                 bview[off * itemsize:(off + ln) * itemsize])
                    for off, ln in cs.slices])
        sends: list[Request] = []
        last = len(cs.slices) - 1
        try:
            for k, (off, ln) in enumerate(cs.slices):
                for j, reqs in enumerate(recvs):
                    req = reqs[k]
                    if rec is not None:
                        t_wait = ns_now()
                    while not req.done:
                        yield req
                    if req.error is not None:
                        raise req.error
                    if rec is not None:
                        rec.span(Ev.RECV_WAIT, t_wait, ch, req.peer, seq, gid, prim,
                                 ln * itemsize, rbase[j] + k)
                sl = slice(off, off + ln)
                if s.reduce:
                    assert red is not None
                    if rec is not None:
                        t_red = ns_now()
                    got = [t[sl] if t is not None else rq[k].buf.view(proto.dtype)
                           for t, rq in zip(staged, recvs)]
                    parts = ([src[sl]] if src is not None else []) + got
                    if not s.recv_from:  # local reduce: dst = dst ⊕ src
                        parts = [dst[sl], src[sl]]  # type: ignore[index]
                    target = dst[sl] if dst is not None else \
                        acc[sl] if acc is not None else got[0]
                    red.combine(target, parts[0], parts[1])
                    for extra in parts[2:]:
                        red.combine(target, target, extra)
                    value = target
                    if rec is not None:
                        rec.span(Ev.REDUCE, t_red, ch, -1, seq, gid, prim, ln * itemsize, 0)
                    if staged and staged[0] is None:
                        fabric.release(recvs[0][k])
                elif s.recv_from:
                    value = dst[sl] if dst is not None else staged[0][sl]  # type: ignore[index]
                else:
                    value = src[sl]  # type: ignore[index]
                    if dst is not None and not cs.skip_copy:
                        dst[sl] = value
                if s.send_to:
                    raw = value.view(np.uint8)
                    hdr = self._header(call, raw.nbytes)
                    for peer in s.send_to:
                        # sends to one (peer, channel) leave in program order, even when a
                        # later step has its data first (the IR's matching rule)
                        q = self._turns.get((peer, ch))
                        if q is not None and q[0] is not cs:
                            turn = _Turn(q, cs, peer)
                            while not turn.done:
                                yield turn  # type: ignore[misc]
                        if rec is not None:
                            rec.send(ch, peer, seq, gid, prim, raw.nbytes)
                        sends.append(fabric.isend(peer, ch, hdr, raw))
                        if k == last and q is not None:
                            q.popleft()
            if rec is not None:
                t_wait = ns_now() if sends and not sends[-1].done else 0
            for req in sends:
                while not req.done:
                    yield req
                if req.error is not None:
                    raise req.error
            if rec is not None:
                speer = s.send_to[0] if s.send_to else -1
                if t_wait:
                    rec.span(Ev.SEND_WAIT, t_wait, ch, speer, seq, gid, prim, 0, 0)
                rec.span(Ev.STEP, t_step, ch, s.recv_from[0] if s.recv_from else -1, seq, gid,
                         prim, cs.length * itemsize, speer)
        finally:
            if staged and staged[0] is None:  # views not given back (after an error)
                for req in recvs[0]:
                    if req.done and req.error is None:
                        fabric.release(req)
            for t in tmps:
                self.pool.put(t)

    @staticmethod
    def _header(call: Call, nbytes: int) -> bytes:
        return WireHeader.frame(nbytes, call.prefix)

    # ---- the scheduler ----------------------------------------------------------------
    #
    # Calls are *submitted* (their steps appended to per-channel queues, in issue order)
    # and *driven* by whichever thread holds the driver role, one round at a time. New
    # calls can be submitted while earlier ones are in flight, so an ``isend`` followed
    # by a blocking ``recv`` progresses both, as MPI programs expect.

    def submit(self, calls: list[Call], timeout: float,
               on_done: Callable[[Batch], None] | None = None) -> Batch:
        """Queue ``calls`` as one batch (a group). Caller holds the communicator's lock.

        Memory order: the batch starts only once every batch in flight whose buffers
        overlap its own (where either writes) has completed, as on one NCCL stream."""
        batch = Batch(calls, time.monotonic() + timeout, timeout, on_done)
        reads: list[tuple[int, int]] = []
        writes: list[tuple[int, int]] = []
        for call in calls:
            call.steps_done = [False] * sum(len(c) for c in call.steps)
            rd = wr = 0  # bit masks of the buffers the steps read and write
            for csteps in call.steps:
                for cs in csteps:
                    self._chans.setdefault(call.channel_base + cs.channel, deque()).append(
                        (cs, call, batch))
                    if cs.src is not None:
                        rd |= 1 << cs.src.buf
                    if cs.dst is not None:
                        wr |= 1 << cs.dst.buf
            batch.remaining += len(call.steps_done)
            for b in (Buf.INPUT, Buf.OUTPUT):  # scratch is the call's own
                span = _span(call.bufs[b]) if (rd | wr) >> b & 1 else None
                if span is not None:
                    (writes if wr >> b & 1 else reads).append(span)
        batch.reads, batch.writes = reads, writes
        batch.after = [b for b in self._batches if b.conflicts(batch)]
        self._batches.append(batch)
        if self.rec is not None:
            self.rec.run_begin(calls)
        if batch.remaining == 0:
            self._complete(batch)
        return batch

    @property
    def busy(self) -> bool:
        return bool(self._batches)

    def overlapping(self, bufs: tuple, writes: tuple) -> list[Batch]:
        """Batches in flight that a call on ``bufs`` (arrays or None; ``writes[i]``: the
        call writes ``bufs[i]``) must wait for — the memory-order rule of :meth:`submit`,
        for work that runs outside the executor. Caller holds the lock."""
        probe = Batch([], 0.0, 0.0, None)
        for a, w in zip(bufs, writes):
            span = _span(a)
            if span is not None:
                (probe.writes if w else probe.reads).append(span)
        return [b for b in self._batches if b.conflicts(probe)]

    def _round(self) -> tuple[bool, bool]:
        """Issue what may start, resume what may continue: (moved, a batch completed)."""
        moved = finished = False
        for chid in list(self._chans):
            q = self._chans[chid]
            while q:
                cs, call, batch = q[0]
                if batch.after:  # an earlier batch touching the same memory is running
                    if not all(b.done for b in batch.after):
                        break
                    batch.after = []
                done = call.steps_done
                if any(not done[d] for d in cs.deps):
                    break
                q.popleft()
                if self._claims and cs.step.recv_from:  # this receive takes a probed message
                    self._claims.difference_update((p, chid) for p in cs.step.recv_from)
                if cs.length and cs.step.send_to:
                    for peer in cs.step.send_to:  # claim this step's place in line
                        self._turns.setdefault((peer, chid), deque()).append(cs)
                self._active.append([self._step(cs, call), None, cs, call, batch])
                moved = True
            if not q:
                del self._chans[chid]
        still = []
        active = self._active
        for i, item in enumerate(active):
            gen, req, cs, call, batch = item
            if req is not None and not req.done:
                still.append(item)
                continue
            moved = True
            try:
                item[1] = next(gen)
                still.append(item)
            except StopIteration:
                call.steps_done[cs.gid] = True
                batch.remaining -= 1
                if batch.remaining == 0:
                    epoch = self._epoch
                    self._complete(batch)
                    finished = True
                    if self._epoch != epoch:  # a completion callback cancelled everything
                        return True, True
            except (HeaderMismatch, PeerError) as e:
                self._active = still + active[i + 1:]
                if isinstance(e, HeaderMismatch):
                    err: BaseException = MismatchError(_describe_mismatch(self.rank, e, call))
                else:
                    self._publish_blocked()
                    err = PeerError(e.peer, f"rank {self.rank}: {e} during {call.desc}",
                                    getattr(e, "cause", None))
                self._abort(err)
                return True, True
        self._active = still
        if self._probes and self._match_probes():
            return True, True
        return moved, finished

    # ---- receives from any source --------------------------------------------------------

    def probe(self, channel: int, peers: list[int], test: Callable[[int, int], bool],
              timeout: float, on_done: Callable[[Batch], None] | None = None) -> Batch:
        """A receive from any source, first half: a batch (no calls) that completes once
        ``test(peer, channel)`` — a message from ``peer`` waits on ``channel`` with no
        receive posted for it — holds for one of ``peers``; ``batch.probe.peer`` names
        it. The caller then posts the receive; until a receive from that peer on that
        channel is issued, other probes leave its message alone. Caller holds the lock."""
        batch = Batch([], time.monotonic() + timeout, timeout, on_done)
        batch.probe = Probe(channel, list(peers), test, batch)
        self._batches.append(batch)
        self._probes.append(batch.probe)
        return batch

    def _match_probes(self) -> bool:
        """Complete the probes that find a message (in the order they were made)."""
        hit = False
        for p in list(self._probes):
            for peer in p.peers:
                if (peer, p.channel) in self._claims:
                    continue
                try:
                    found = p.test(peer, p.channel)
                except Exception as e:  # noqa: BLE001 - e.g. no connection to a dead peer
                    self._abort(e)  # every batch fails with it, as for a step's error
                    return True
                if found:
                    self._claims.add((peer, p.channel))
                    p.peer = peer
                    self._probes.remove(p)
                    self._complete(p.batch)
                    hit = True
                    break
        return hit

    def _publish_blocked(self) -> None:
        """What every step waits on, as (generator, request, step id, step, call): read by
        the flight recorder and the doctor."""
        self.blocked = [(g, r, cs.gid, cs, call) for g, r, cs, call, _ in self._active]

    def _complete(self, batch: Batch) -> None:
        if batch.error is None:
            for call in batch.calls:
                if call.post is not None:
                    call.post()
        if self.rec is not None:
            self.rec.run_end(batch.calls)
        batch.done = True
        self._batches.remove(batch)
        if batch.on_done is not None:
            batch.on_done(batch)

    def _abort(self, err: BaseException) -> None:
        """Fail every batch in flight with ``err`` (after ``on_error`` has recorded it)."""
        if self.on_error is not None:
            err = self.on_error(err)
        self.cancel(err)

    def cancel(self, err: BaseException) -> None:
        """Fail every batch in flight with ``err``, recording nothing (the caller says
        why: an abort). Caller holds the lock."""
        self._epoch += 1
        for item in self._active:
            item[0].close()  # runs the steps' finally: staging buffers, shm slots
        self._active, self._chans, self._turns = [], {}, {}
        self._probes, self._claims = [], set()
        for batch in list(self._batches):
            batch.error = err
            self._complete(batch)

    def drive(self, until: Callable[[], bool], lock) -> None:
        """Make progress until ``until()``; ``lock`` (held by the caller) is released
        while sleeping in the transports, so other threads can submit meanwhile."""
        fabric = self.fabric
        next_idle = time.monotonic() + 1.0
        rec = self.rec
        while not until():
            moved, finished = self._round()
            if finished:
                lock.notify_all()
            if moved or fabric.poll():
                continue
            now = time.monotonic()
            late = [b for b in self._batches if now > b.deadline]
            if late:
                self._publish_blocked()
                p = late[0].probe
                self._abort(CollectiveTimeout(
                    f"rank {self.rank}: recv from any source (channel {p.channel}) timed out "
                    f"after {late[0].timeout:g} s: no message from ranks {p.peers}"
                    if p is not None else _describe_timeout(
                        self.rank, [a for a in self.blocked
                                    if any(a[4] is c for c in late[0].calls)],
                        late[0].timeout, getattr(fabric, "peer_name", None))))
                lock.notify_all()
                continue
            if self.on_idle is not None and now > next_idle:
                next_idle = now + 1.0
                try:
                    self.on_idle()
                except (CommAborted, MismatchError) as e:  # aborted; a peer runs another call
                    self._abort(e)
                    lock.notify_all()
                    continue
            self._publish_blocked()  # what the flight recorder reports as "current step"
            nearest = min((b.deadline for b in self._batches), default=now + 0.25)
            if rec is not None:
                t_idle = ns_now()
            lock.release()
            try:
                fabric.wait(min(self.wait_cap, max(0.0, nearest - now)))
            finally:
                lock.acquire()
            if rec is not None and self._batches and self._batches[0].calls:
                c0 = self._batches[0].calls[0]
                rec.span(Ev.IDLE, t_idle, c0.channel_base, -1, c0.desc.seq, -1, 0, 0, 0)
            fabric.poll()

    def run(self, calls: list[Call], timeout: float) -> None:
        """Submit ``calls`` as one batch and drive until it completes (single-threaded)."""
        lock = threading.Condition()
        with lock:
            batch = self.submit(calls, timeout)
            self.drive(lambda: batch.done, lock)
        if batch.error is not None:
            raise batch.error


class Batch:
    """Calls submitted together; complete when all their steps are."""

    __slots__ = ("calls", "deadline", "timeout", "on_done", "remaining", "done", "error",
                 "reads", "writes", "after", "probe")

    def __init__(self, calls: list[Call], deadline: float, timeout: float,
                 on_done: Callable[[Batch], None] | None):
        self.calls, self.deadline, self.timeout, self.on_done = calls, deadline, timeout, on_done
        self.remaining = 0
        self.done = False
        self.error: BaseException | None = None
        self.reads: list[tuple[int, int]] = []   # byte ranges of its calls' buffers
        self.writes: list[tuple[int, int]] = []
        self.after: list[Batch] = []             # earlier batches it must wait for
        self.probe: Probe | None = None          # set for a receive from any source

    def conflicts(self, later: Batch) -> bool:
        """Must ``later`` wait for this batch (its memory is written by either)?"""
        return _overlap(self.writes, later.writes) or _overlap(self.writes, later.reads) \
            or _overlap(self.reads, later.writes)


class Probe:
    """A receive from any source waiting for a message (see :meth:`Executor.probe`)."""

    __slots__ = ("channel", "peers", "test", "batch", "peer")

    def __init__(self, channel: int, peers: list[int], test: Callable[[int, int], bool],
                 batch: Batch):
        self.channel, self.peers, self.test, self.batch = channel, peers, test, batch
        self.peer: int | None = None


def _span(a: np.ndarray | None) -> tuple[int, int] | None:
    if a is None or a.nbytes == 0:
        return None
    start = a.__array_interface__["data"][0]
    return (start, start + a.nbytes)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


class _Turn:
    """Waitable: a step's turn to post its sends to one (peer, channel)."""

    __slots__ = ("queue", "step", "peer")
    is_send = True
    header = bytes(8)
    pos = 0

    def __init__(self, queue: deque, step: CStep, peer: int):
        self.queue, self.step, self.peer = queue, step, peer

    @property
    def done(self) -> bool:
        return self.queue[0] is self.step

    error = None


def _describe_timeout(rank: int, active, timeout: float, name=None) -> str:
    waits = []
    descs = []
    for _, req, _, cs, call in active:
        if req is not None and not req.done:
            what = "receive from" if not req.is_send else "send to"
            peer = name(req.peer) if name is not None else f"rank {req.peer}"
            waits.append(f"{what} {peer} (channel {cs.channel}, step '{cs.step}')")
            if str(call.desc) not in descs:
                descs.append(str(call.desc))
    where = "; ".join(waits[:4]) or "no pending transfer"
    return (f"rank {rank}: {', '.join(descs) or 'collective'} timed out after {timeout:g} s "
            f"waiting to {where}")


def _describe_mismatch(rank: int, e: HeaderMismatch, call: Call) -> str:
    diffs = WireHeader.unpack(e.expected).describe_difference(WireHeader.unpack(e.got), rank,
                                                             e.peer)
    return (f"rank {rank} and rank {e.peer} disagree on {call.desc}: " + "; ".join(diffs)
            + " (ranks must call the same collectives in the same order with matching "
              "count, dtype, op and root)")
