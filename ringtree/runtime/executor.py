"""The executor: runs one rank's compiled calls (:mod:`ringtree.runtime.plan`) over its transports.

Running follows three rules:

1. *In-order issue*: within a channel, step i+1 is issued no earlier than step i, so the
   messages of a (sender, receiver, channel) triple are posted in program order — the
   IR's matching rule.
2. *Out-of-order completion*: a step waits only for earlier steps that touch the same
   memory (read-after-write, write-after-read, write-after-write). Sends never block a
   channel, so a rank that sends to ``next`` and receives from ``prev`` makes progress
   at any size.
3. *Slicing*: each step's data is cut into slices (at compile time, by the plan) that
   flow recv → reduce → send independently, which pipelines chains and trees (NCCL's
   slices/chunkSteps).

Each issued step is a generator (:func:`ringtree.runtime.step.run_step`, phase by phase)
that yields the request it waits for; the scheduler here resumes steps whose requests
completed and sleeps in the transports' ``wait`` when none can move. Calls are submitted
as they are issued and driven by whichever thread waits (:mod:`ringtree.runtime.progress`).
What it does is reported to an :class:`~ringtree.runtime.observer.Observer` (the profiler),
and what it waits on is read through :meth:`Executor.snapshot` (the flight recorder, the
doctor); nobody else reaches into it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ringtree.errors import CollectiveTimeout, CommAborted, MismatchError, PeerError, RingtreeError
from ringtree.ir.program import Buf
from ringtree.ir.wire import WireHeader
from ringtree.runtime.batch import Batch, Issued, Probe, Waiting
from ringtree.runtime.observer import NO_OBSERVER, Observer
from ringtree.runtime.plan import Call, CStep
from ringtree.runtime.step import BufferPool, run_step
from ringtree.transports.base import HeaderMismatch

__all__ = ["Executor", "Batch", "Probe", "Waiting"]


def _nothing() -> None:
    pass


class Executor:
    """Runs calls of one rank over a fabric (``isend``/``irecv``/``poll``/``wait``)."""

    def __init__(self, rank: int, fabric, *, on_idle: Callable[[], None] | None = None):
        self.rank = rank
        self.fabric = fabric
        self.on_idle = on_idle
        self.pool = BufferPool()
        self.on_error: Callable[[BaseException], BaseException] | None = None
        # called after a batch is added or the observer changes (the communicator's hot
        # entries then look at busy and observer.active again)
        self.on_busy: Callable[[], None] = _nothing
        self.observer: Observer = NO_OBSERVER
        self._chans: dict[int, deque[Issued]] = {}  # channel -> steps not yet issued
        self.turns: dict[tuple[int, int], deque[CStep]] = {}  # (peer, channel) -> senders
        self._active: list[Issued] = []
        self._batches: list[Batch] = []
        self._epoch = 0  # bumped by cancel(): a round in progress must stop
        self._probes: list[Probe] = []           # receives from any source, not matched yet
        self._claims: set[tuple[int, int]] = set()  # (peer, channel) a probe has matched
        # Longest sleep in the transports: calls submitted meanwhile wait for the wake-up
        # (the transports offer no wake-up descriptor), so latency-bound users lower it.
        self.wait_cap = 0.25
        self._waiting: tuple[Waiting, ...] = ()  # as of the last wait (see snapshot)

    def observe(self, observer: Observer | None) -> Observer:
        """Report to ``observer`` from now on (None: to nobody); returns the previous one."""
        old, self.observer = self.observer, observer or NO_OBSERVER
        self.on_busy()
        return old

    def snapshot(self) -> tuple[Waiting, ...]:
        """The running steps and what each waits on, as of the executor's last wait (it
        refreshes this before it sleeps, about once a second while blocked, and on a
        failure). Safe to call from any thread."""
        return self._waiting

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
        for call in calls:
            call.steps_done = [False] * sum(len(c) for c in call.steps)
            rd = wr = 0  # bit masks of the buffers the steps read and write
            for csteps in call.steps:
                for cs in csteps:
                    self._chans.setdefault(call.channel_base + cs.channel, deque()).append(
                        Issued(cs, call, batch))
                    if cs.src is not None:
                        rd |= 1 << cs.src.buf
                    if cs.dst is not None:
                        wr |= 1 << cs.dst.buf
            batch.remaining += len(call.steps_done)
            for b in (Buf.INPUT, Buf.OUTPUT):  # scratch is the call's own
                if (rd | wr) >> b & 1:
                    batch.touch(call.bufs[b], bool(wr >> b & 1))
        batch.after = [b for b in self._batches if b.conflicts(batch)]
        self._batches.append(batch)
        self.on_busy()
        self.observer.run_begin(calls)
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
            probe.touch(a, w)
        return [b for b in self._batches if b.conflicts(probe)]

    def advance(self) -> tuple[bool, bool]:
        """One round: issue what may start, resume what may continue. Returns (anything
        moved, a batch completed). Caller holds the lock."""
        moved = self._issue()
        resumed, finished = self._resume()
        if finished:
            return True, True
        if self._probes and self._match_probes():
            return True, True
        return moved or resumed, False

    def _issue(self) -> bool:
        """Start every step first in its channel whose dependencies are done."""
        moved = False
        for chid in list(self._chans):
            q = self._chans[chid]
            while q:
                item = q[0]
                if item.batch.after and not self._may_start(item.batch):
                    break
                cs, done = item.cs, item.call.steps_done
                if any(not done[d] for d in cs.deps):
                    break
                q.popleft()
                if self._claims and cs.step.recv_from:  # this receive takes a probed message
                    self._claims.difference_update((p, chid) for p in cs.step.recv_from)
                if cs.length and cs.step.send_to:
                    for peer in cs.step.send_to:  # claim this step's place in line
                        self.turns.setdefault((peer, chid), deque()).append(cs)
                item.gen = run_step(self, cs, item.call)
                self._active.append(item)
                moved = True
            if not q:
                del self._chans[chid]
        return moved

    @staticmethod
    def _may_start(batch: Batch) -> bool:
        """Have the earlier batches touching the same memory completed?"""
        if not all(b.done for b in batch.after):
            return False
        batch.after = []
        return True

    def _resume(self) -> tuple[bool, bool]:
        """Resume every step whose awaited request is done: (moved, finished)."""
        moved = finished = False
        still: list[Issued] = []
        active = self._active
        for i, item in enumerate(active):
            req = item.awaited
            if req is not None and not req.done:
                still.append(item)
                continue
            moved = True
            gen = item.gen
            assert gen is not None  # issued
            try:
                item.awaited = next(gen)
                still.append(item)
            except StopIteration:
                if self._step_done(item):
                    return True, True  # a completion callback cancelled everything
                finished = finished or item.batch.done
            except Exception as e:  # noqa: BLE001 - a dead peer or switch, a mismatch, a bug
                self._active = still + active[i + 1:]
                self._abort(self._step_error(e, item.call))
                return True, True
        self._active = still
        return moved, finished

    def _step_done(self, item: Issued) -> bool:
        """Account for a finished step; True if completing its batch cancelled the rest."""
        item.call.steps_done[item.cs.gid] = True
        batch = item.batch
        batch.remaining -= 1
        if batch.remaining:
            return False
        epoch = self._epoch
        self._complete(batch)
        return self._epoch != epoch

    def _step_error(self, e: Exception, call: Call) -> BaseException:
        """What a step raised, as the error every batch fails with: a mismatch or a lost
        peer named with this rank and the call; another of ringtree's runtime errors (a
        dead switch) likewise; anything else (a bug) as it is. Either way the executor
        is left clean, and ``on_error`` records communication failures for every rank."""
        if isinstance(e, HeaderMismatch):
            return MismatchError(_describe_mismatch(self.rank, e, call))
        self._publish()
        if isinstance(e, PeerError):
            return PeerError(e.peer, f"rank {self.rank}: {e} during {call.desc}",
                             getattr(e, "cause", None))
        if isinstance(e, RingtreeError) and not isinstance(e, (CollectiveTimeout, CommAborted,
                                                               MismatchError)):
            try:
                return type(e)(f"rank {self.rank}: {e} during {call.desc}")
            except TypeError:  # a constructor with other arguments: keep it as it is
                return e
        return e

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
        self.on_busy()
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

    # ---- completion and failure -----------------------------------------------------------

    def _publish(self) -> None:
        """Refresh :meth:`snapshot` (one tuple assignment: readers see the old or the new)."""
        self._waiting = tuple(Waiting(a.awaited, a.cs, a.call) for a in self._active)

    def _complete(self, batch: Batch) -> None:
        if batch.error is None:
            for call in batch.calls:
                if call.post is not None:
                    call.post()
        self.observer.run_end(batch.calls)
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
            if item.gen is not None:
                item.gen.close()  # runs the steps' finally: staging buffers, shm slots
        self._active, self._chans, self.turns = [], {}, {}
        self._probes, self._claims = [], set()
        for batch in list(self._batches):
            batch.error = err
            self._complete(batch)

    # ---- driving ---------------------------------------------------------------------------

    def drive(self, until: Callable[[], bool], lock) -> None:
        """Make progress until ``until()``; ``lock`` (held by the caller) is released
        while sleeping in the transports, so other threads can submit meanwhile."""
        fabric = self.fabric
        idle_since = None  # when this rank last stopped making progress
        while not until():
            moved, finished = self.advance()
            if finished:
                lock.notify_all()
            if moved or fabric.poll():
                idle_since = None
                continue
            now = time.monotonic()
            if self._expire(now):
                lock.notify_all()
                continue
            if idle_since is None:
                idle_since = now
            elif self.on_idle is not None and now - idle_since > 1.0:
                # a second without progress: ask the store (abort line, fingerprints).
                # Not while data flows: a store round trip crosses the same links and
                # holds the rank up behind the bulk data in the link's queue (a 64 MiB
                # all-reduce on 4x1 hosts at 200 Mbit/s took 4,421 ms asking every
                # second it spent in here, 4,321 ms asking only when stalled)
                idle_since = now
                if self._idle_check(self.on_idle):
                    lock.notify_all()
                    continue
            self._sleep(now, lock)

    def _expire(self, now: float) -> bool:
        """Fail the oldest batch past its deadline, naming what it waits on."""
        late = [b for b in self._batches if now > b.deadline]
        if not late:
            return False
        self._publish()
        b, p = late[0], late[0].probe
        self._abort(CollectiveTimeout(
            f"rank {self.rank}: recv from any source (channel {p.channel}) timed out "
            f"after {b.timeout:g} s: no message from ranks {p.peers}" if p is not None else
            _describe_timeout(self.rank, [w for w in self._waiting
                                          if any(w.call is c for c in b.calls)], b.timeout,
                              getattr(self.fabric, "peer_name", None))))
        return True

    def _idle_check(self, on_idle: Callable[[], None]) -> bool:
        """Run ``on_idle`` (abort line, mismatch check); True if it failed the batches."""
        try:
            on_idle()
        except (CommAborted, MismatchError) as e:  # aborted; a peer runs another call
            self._abort(e)
            return True
        return False

    def _sleep(self, now: float, lock) -> None:
        """Sleep in the transports (lock released) until something moves or a deadline."""
        self._publish()  # what the flight recorder reports as "current step"
        nearest = min((b.deadline for b in self._batches), default=now + 0.25)
        obs = self.observer
        t0 = obs.clock() if obs.active else 0
        lock.release()
        try:
            self.fabric.wait(min(self.wait_cap, max(0.0, nearest - now)))
        finally:
            lock.acquire()
        if obs.active and self._batches and self._batches[0].calls:
            obs.idle(t0, self._batches[0].calls[0])
        self.fabric.poll()


def _describe_timeout(rank: int, waiting: list[Waiting], timeout: float,
                      name: Callable[[int], str] | None = None) -> str:
    waits = []
    descs: list[str] = []
    for w in waiting:
        req, cs, call = w.req, w.cs, w.call
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
