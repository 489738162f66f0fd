"""The fabric: one object the executor talks to, routing each peer to its transport.

Waiting. The fabric is the one place a rank sleeps, and it sleeps in a *single*
``poll(2)`` over every busy transport's descriptors — TCP's sockets, the shm doorbell pipe
(which a peer writes only while we announce that we sleep) — plus the fabric's own wake-up
pipe. So a mixed job (shm to co-located ranks, TCP to the rest) neither spins nor starves
one side: whichever moves first wakes us. Shared memory first gets its short spin (none
when the cores are oversubscribed). Another thread can cut a sleep short with
:meth:`Fabric.interrupt` (e.g. when it submits new work to the executor).
"""

from __future__ import annotations

import os
import select

import numpy as np

from ringtree.transports.base import Request, Transport

IDLE_NAP = 0.001  # nothing in flight: how long to sleep unless interrupted


class Fabric:
    def __init__(self, routes: dict[int, Transport]):
        self.routes = routes
        self.transports: list[Transport] = []
        for t in routes.values():
            if all(t is not u for u in self.transports):
                self.transports.append(t)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.closers: list = []  # called first by close()

    def add_route(self, peer: int, transport: Transport) -> None:
        """Route ``peer`` (e.g. a CollNet virtual rank, joined lazily) to ``transport``."""
        self.routes[peer] = transport
        if all(t is not transport for t in self.transports):
            self.transports.append(transport)

    def stale(self) -> int:
        """Messages of another communicator of the job (an older epoch) dropped unread."""
        return sum(t.stale for t in self.transports)

    def peer_name(self, peer: int) -> str:
        t = self.routes.get(peer)
        return t.peer_name(peer) if t is not None else f"rank {peer}"

    def transport_for(self, peer: int) -> Transport:
        try:
            return self.routes[peer]
        except KeyError:
            raise ValueError(f"no transport to rank {peer}") from None

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        return self.transport_for(peer).isend(peer, channel, header, payload)

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        return self.transport_for(peer).irecv(peer, channel, header, into)

    # ---- zero-copy receives (shared memory) and probes ---------------------------------

    def can_view(self, peer: int, nbytes: int) -> bool:
        """True if a message of ``nbytes`` from ``peer`` can be read in place."""
        t = self.routes.get(peer)
        return t is not None and t.can_view(peer, nbytes)

    def irecv_view(self, peer: int, channel: int, header: bytes, nbytes: int) -> Request:
        return self.routes[peer].irecv_view(peer, channel, header, nbytes)

    def release(self, req: Request) -> None:
        self.routes[req.peer].release(req)

    def has_message(self, peer: int, channel: int) -> bool:
        return self.transport_for(peer).has_message(peer, channel)

    # ---- progress ---------------------------------------------------------------------

    def poll(self) -> bool:
        moved = False
        for t in self.transports:
            moved |= t.poll()
        return moved

    def interrupt(self) -> None:
        """Wake a thread sleeping in :meth:`wait` (callable from any thread)."""
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # full: a wake-up is pending anyway; closed: nobody sleeps

    def wait(self, timeout: float) -> None:
        """Sleep until some transport may progress, :meth:`interrupt`, or ``timeout``:
        every busy transport's spin, then one ``poll(2)`` over all their descriptors."""
        busy = [t for t in self.transports if t.pending()]
        for t in busy:
            if t.spin_phase():
                return
        ready = []
        try:
            for t in busy:
                if not t.prepare_sleep():
                    return
                ready.append(t)
            p = select.poll()
            if self._wake_r >= 0:
                p.register(self._wake_r, select.POLLIN)
            n = 0
            for fd, mask in (fd for t in busy for fd in t.wait_fds()):
                if fd >= 0:  # a socket closed under us (abort) has no descriptor
                    p.register(fd, mask)
                    n += 1
            if n == 0:  # nothing that could wake us but another thread
                timeout = min(timeout, IDLE_NAP)
            timeout = min([timeout] + [t.nap for t in busy])
            try:
                events = p.poll(max(0, int(timeout * 1000)))
            except InterruptedError:
                events = []
            if any(fd == self._wake_r for fd, _ in events):
                self._drain_wake()
        finally:
            for t in ready:
                t.finish_sleep()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def dead_peers(self) -> set[int]:
        """The peers some transport sees are dead now (:meth:`Transport.dead_peers`)."""
        return set().union(*(t.dead_peers() for t in self.transports))

    def hang_up(self, reason: str) -> None:
        """Every peer's requests to us fail now (each transport's ``hang_up``), naming
        ``reason``; nothing is released, so any thread may call it."""
        for t in self.transports:
            t.leave_reason(reason)
            t.hang_up()

    def close(self, reason: str | None = None) -> None:
        """Close every transport; ``reason``: the first cause of an abort, left where the
        peers can read it (shared memory) so they name that cause, not us."""
        for close in self.closers:  # protocols beside the transports (the LL segment)
            close()
        for t in self.transports:
            if reason:
                t.leave_reason(reason)
            t.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
