"""A streaming progress engine: one thread runs every call a communicator issues, all
at once, admitting new calls while earlier ones are still moving.

The core's worker runs queued calls one after another. That is right for collectives
but not for point-to-point traffic in ``torch.distributed`` programs: a rank that posts
``isend(big, peer)`` and then ``irecv(buf, peer)``, facing a peer that does the same,
deadlocks if the send must finish before the receive is posted (pitfall 13 of the torch
notes; torchcomms#2992). Here every admitted call's steps are issued as soon as the IR's
rules allow, so sends and receives of different calls progress together, exactly as
inside a ``group()``:

- *In-order issue per channel*: calls are admitted in issue order and their steps are
  appended to per-channel queues, so messages of a (sender, receiver, channel) triple are
  posted in the same order on every rank — the IR's only matching rule.
- *One collective at a time*: a step posts its sends when its data is ready, so two
  collectives in flight on one channel could reach a peer out of program order; the
  next collective starts when the previous one is done. Point-to-point calls (one step
  on a channel of their own, sends posted at issue) run alongside, in issue order.
- *Memory order between calls*: a call whose buffers overlap a running or earlier
  waiting call's (where either writes) waits for it.
- *Deadlines*: each call fails with :class:`~ringtree.CollectiveTimeout` naming the rank,
  the collective, its sequence number and the transfer it was waiting for.
- *Failure*: the first error is recorded through the communicator (other ranks see it in
  the store), every pending call fails with it, and the communicator becomes unusable.

A receive from any source is a *probe*: each peer's connection on the tag's channel is
peeked; the first peer with a message waiting gets an ordinary ``irecv`` posted.

Waiting: the engine sleeps in the transports' ``wait`` while calls are in flight, capped
at :data:`WAIT_CAP` so that calls issued meanwhile are admitted promptly (the transports
offer no wake-up descriptor yet), and on a condition variable when nothing is in flight.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ringtree.comm import P2P_CHANNEL_BASE
from ringtree.errors import CollectiveTimeout, CommAborted, MismatchError, PeerError
from ringtree.executor import Call, CStep, _describe_mismatch, _describe_timeout
from ringtree.transports.base import HeaderMismatch
from ringtree.work import Work

WAIT_CAP = 0.002


def _ranges(call: Call) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(read ranges, write ranges) of a call's buffers, as byte intervals."""
    def span(a) -> tuple[int, int] | None:
        if a is None or a.nbytes == 0:
            return None
        start = a.__array_interface__["data"][0]
        return (start, start + a.nbytes)

    inp, outp, scratch = (call.bufs + [None, None, None])[:3]
    reads = [s for s in (span(inp),) if s is not None]
    if call.desc.name == "send":
        return reads, []
    writes = [s for s in (span(outp), span(scratch)) if s is not None]
    return reads, writes


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)


class _Flight:
    """A call admitted to the engine."""

    __slots__ = ("call", "work", "result", "timeout", "deadline", "done", "left", "reads",
                 "writes", "p2p")

    def __init__(self, call: Call, work: Work, result: Any, timeout: float):
        self.call, self.work, self.result, self.timeout = call, work, result, timeout
        self.deadline = 0.0
        self.done: list[bool] = []
        self.left = 0
        self.reads, self.writes = _ranges(call)
        self.p2p = call.channel_base >= P2P_CHANNEL_BASE

    def conflicts(self, other: _Flight) -> bool:
        return (_overlap(self.writes, other.writes) or _overlap(self.writes, other.reads)
                or _overlap(self.reads, other.writes))


class _Probe:
    """A pending receive from any source on ``channel``."""

    __slots__ = ("channel", "peers", "on_match", "work", "deadline", "timeout")

    def __init__(self, channel: int, peers: list[int], on_match: Callable[[int], None],
                 work: Work, timeout: float):
        self.channel, self.peers, self.on_match = channel, peers, on_match
        self.work, self.timeout = work, timeout
        self.deadline = time.monotonic() + timeout


class ProgressEngine:
    """Runs a communicator's calls on one thread; installs itself as ``comm.submit``."""

    def __init__(self, comm, name: str = "ringtree-engine"):
        self.comm = comm
        self.rank = comm.rank
        self.executor = comm.executor
        self.fabric = comm.fabric
        self._cv = threading.Condition()
        self._incoming: deque[_Flight] = deque()
        self._probes: list[_Probe] = []
        self._stop = False
        self._abort: BaseException | None = None
        self._broken: BaseException | None = None
        self._busy = 0  # calls submitted and not yet finished
        self._store_ok = True
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        comm.submit = self.submit

    # ---- called from any thread --------------------------------------------------------

    def submit(self, call: Call, result: Any, timeout: float) -> Work:
        """Queue ``call``; the returned Work finishes with ``result`` (or the error)."""
        work = Work(call.desc.name)
        with self._cv:
            if self._broken is not None or self._stop:
                err = self._broken or CommAborted(f"rank {self.rank}: engine stopped")
                work._finish(None, err)
                return work
            self._busy += 1
            self._incoming.append(_Flight(call, work, result, timeout))
            self._cv.notify()
        return work

    def probe(self, channel: int, peers: list[int], on_match: Callable[[int], None],
              timeout: float) -> Work:
        """Wait for a message from any of ``peers`` on ``channel``; call ``on_match(peer)``
        (on the engine thread) for the first one found. The Work finishes with the peer."""
        work = Work("recv_anysource")
        with self._cv:
            if self._broken is not None or self._stop:
                work._finish(None, self._broken or CommAborted("engine stopped"))
                return work
            self._busy += 1
            self._probes.append(_Probe(channel, peers, on_match, work, timeout))
            self._cv.notify()
        return work

    def pending(self) -> int:
        return self._busy

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted call has finished; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._busy and self._broken is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Finish what is in flight (up to ``timeout``, then fail it), end the thread."""
        if not self.drain(timeout):
            self.abort(CommAborted(f"rank {self.rank}: shut down with operations still "
                                   f"pending after {timeout:g} s"))
            return
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(1.0, timeout))

    def abort(self, err: BaseException) -> None:
        """Fail everything pending with ``err`` and end the thread."""
        with self._cv:
            self._abort = err
            self._stop = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    # ---- the engine thread -------------------------------------------------------------

    def _main(self) -> None:
        chans: dict[int, deque[tuple[CStep, _Flight]]] = {}
        active: list[list] = []  # [generator, request, cstep, flight]
        flights: list[_Flight] = []
        waiting: deque[_Flight] = deque()  # submitted, not started yet (see _admit_waiting)
        probes: list[_Probe] = []
        next_idle = time.monotonic() + 1.0
        recheck = False  # may a waiting call start? (new calls came, or one finished)
        try:
            while True:
                with self._cv:
                    while (not self._incoming and not flights and not waiting and not probes
                           and not self._probes and not self._stop and self._abort is None):
                        self._cv.wait()
                    if self._abort is not None:
                        raise self._abort
                    if self._stop and not (flights or waiting or self._incoming):
                        return
                    if self._incoming:
                        waiting.extend(self._incoming)
                        self._incoming.clear()
                        recheck = True
                    probes.extend(self._probes)
                    self._probes.clear()
                now = time.monotonic()
                moved = False
                if recheck and waiting:
                    moved = self._admit_waiting(waiting, flights, chans, now)
                recheck = False
                # issue: in order per channel, once a step's dependencies are done
                for q in chans.values():
                    while q:
                        cs, fl = q[0]
                        if any(not fl.done[d] for d in cs.deps):
                            break
                        q.popleft()
                        active.append([self.executor._step(cs, fl.call), None, cs, fl])
                        moved = True
                # advance every step whose request completed
                still = []
                for item in active:
                    gen, req, cs, fl = item
                    if req is not None and not req.done:
                        still.append(item)
                        continue
                    moved = True
                    try:
                        item[1] = next(gen)
                        still.append(item)
                    except StopIteration:
                        fl.done[cs.gid] = True
                        fl.left -= 1
                        if fl.left == 0:
                            flights.remove(fl)
                            self._complete(fl)
                            recheck = True
                    except HeaderMismatch as e:
                        raise MismatchError(_describe_mismatch(self.rank, e, fl.call)) from None
                    except PeerError as e:
                        self._publish_blocked(active)
                        raise PeerError(e.peer, f"rank {self.rank}: {e} during "
                                                f"{fl.call.desc}") from None
                active = still
                if probes:
                    moved |= self._run_probes(probes)
                if moved:
                    continue
                if self.fabric.poll():
                    continue
                now = time.monotonic()
                if now > next_idle:
                    self._publish_blocked(active)
                    self._check_deadlines(now, flights, active, probes)
                    self._check_abort()
                    next_idle = now + 1.0
                else:
                    self._check_deadlines(now, flights, active, probes)
                soonest = min([f.deadline for f in flights] + [p.deadline for p in probes],
                              default=now + WAIT_CAP)
                self.fabric.wait(max(0.0, min(WAIT_CAP, soonest - now)))
                self.fabric.poll()
        except BaseException as e:  # noqa: BLE001 - every pending call gets the error
            self._fail(e, flights, waiting, probes)

    def _admit_waiting(self, waiting: deque, flights: list, chans: dict, now: float) -> bool:
        """Admit what may start now, in issue order within each kind:

        - one collective at a time: a step's sends are posted when its data is ready, so
          two collectives sharing a channel could post their messages to a peer out of
          program order (the next call's first send before this call's last one);
        - point-to-point calls (their own channels, one step each, sends posted at
          issue) whenever no running or earlier waiting call touches their memory.
        """
        moved = False
        blocked = {True: False, False: False}  # kind (p2p?) -> an earlier one waits
        skipped: list[_Flight] = []
        for fl in list(waiting):
            ok = not blocked[fl.p2p] and not any(fl.conflicts(o) for o in flights) \
                and not any(fl.conflicts(o) for o in skipped)
            if ok and not fl.p2p:
                ok = not any(not o.p2p for o in flights)
            if not ok:
                blocked[fl.p2p] = True
                skipped.append(fl)
                continue
            waiting.remove(fl)
            moved = True
            if not self._admit(fl, chans, now):
                flights.append(fl)
        return moved

    def _admit(self, fl: _Flight, chans: dict, now: float) -> bool:
        """Queue a call's steps; True if it had nothing to do (finished at once)."""
        call = fl.call
        steps = [cs for csteps in call.steps for cs in csteps]
        fl.done = [False] * (max((cs.gid for cs in steps), default=-1) + 1)
        fl.left = len(steps)
        fl.deadline = now + fl.timeout
        if self.comm.flight is not None:
            self.comm.flight.started([call])
        if not steps:
            self._complete(fl)
            return True
        for csteps in call.steps:
            for cs in csteps:
                chans.setdefault(call.channel_base + cs.channel, deque()).append((cs, fl))
        return False

    def _complete(self, fl: _Flight) -> None:
        err = None
        try:
            if fl.call.post is not None:
                fl.call.post()
        except BaseException as e:  # noqa: BLE001
            err = e
        if self.comm.flight is not None:
            self.comm.flight.finished([fl.call], err)
        self._finished(fl.work, fl.result, err)

    def _finished(self, work: Work, result: Any, err: BaseException | None) -> None:
        try:
            work._finish(result, err)
        finally:
            with self._cv:
                self._busy -= 1
                self._cv.notify_all()

    def _publish_blocked(self, active) -> None:
        """What every step waits on, in the executor's form (read by ringtree's doctor)."""
        self.executor.blocked = [(g, r, cs.gid, cs, fl.call) for g, r, cs, fl in active]

    def _check_deadlines(self, now: float, flights, active, probes) -> None:
        for fl in flights:
            if now > fl.deadline:
                self._publish_blocked(active)
                mine = [(g, r, cs.gid, cs, f.call) for g, r, cs, f in active if f is fl]
                raise CollectiveTimeout(_describe_timeout(self.rank, mine, fl.timeout))
        for p in probes:
            if now > p.deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank}: recv from any source (channel {p.channel}) timed out "
                    f"after {p.timeout:g} s: no message from ranks {p.peers}")

    def _run_probes(self, probes: list[_Probe]) -> bool:
        moved = False
        for p in list(probes):
            for peer in p.peers:
                if self._has_message(peer, p.channel):
                    probes.remove(p)
                    moved = True
                    err = None
                    try:
                        p.on_match(peer)
                    except BaseException as e:  # noqa: BLE001
                        err = e
                    self._finished(p.work, peer, err)
                    break
        return moved

    def _has_message(self, peer: int, channel: int) -> bool:
        """Is a message from ``peer`` waiting on ``channel`` with no receive posted?"""
        transport = self.fabric.transport_for(peer)
        probe = getattr(transport, "probe", None) or _PROBES.get(transport.name)
        return bool(probe is not None and probe(transport, peer, channel))

    def _check_abort(self) -> None:
        """Has another rank recorded a failure? (Stops asking once the store is gone.)"""
        if not self._store_ok:
            return
        try:
            why = self.comm.store.try_get(self.comm._abort_key())
        except Exception:  # noqa: BLE001 - the store's host may have exited
            self._store_ok = False
            return
        if why:
            raise CommAborted(why.decode(errors="replace"))

    def _fail(self, e: BaseException, flights, waiting, probes) -> None:
        if self._abort is not None and e is self._abort:
            err = e
        else:
            try:
                err = self.comm._fail(e)
            except BaseException:  # noqa: BLE001
                err = e
        if self.comm.flight is not None:
            self.comm.flight.finished([fl.call for fl in flights], err)
        with self._cv:
            self._broken = err
            doomed = list(flights) + list(waiting) + list(self._incoming)
            self._incoming.clear()
            lost_probes = list(probes) + list(self._probes)
            self._probes.clear()
        for fl in doomed:
            self._finished(fl.work, None, err)
        for p in lost_probes:
            self._finished(p.work, None, err)


# ---- probes: "is a message waiting?" per transport (until transports offer ``probe``) ----

def _probe_tcp(t, peer: int, channel: int) -> bool:
    conn = t.conns.get((peer, channel))
    if conn is None:
        conn = t._conn(peer, channel)  # connect, or expect the peer's connection
    if conn.sock is None or conn.recvq or conn.hpos or conn.dead is not None:
        return False
    try:
        conn.sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True  # the receive posted next reports the failure
    return True  # data, or EOF that the receive will report


def _probe_shm(t, peer: int, channel: int) -> bool:
    r = t._ring(peer, channel, False)
    if r.q or r.dead is not None:
        return False
    try:
        from ringtree.transports.shm_ring import HEAD
    except ImportError:  # before the ring moved to its own module
        from ringtree.transports.shm import HEAD  # type: ignore[attr-defined,no-redef]
    return int(r.ctrl[HEAD]) > r.count


_PROBES: dict[str, Callable[[Any, int, int], bool]] = {"tcp": _probe_tcp, "shm": _probe_shm}
