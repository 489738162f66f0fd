"""What a transport gives the executor: nonblocking, ordered, framed point-to-point
messages between two ranks on a channel, and a way to make progress.

Rules every transport follows (DESIGN.md §3):
- messages between (sender, receiver, channel) are delivered in posting order;
- ``isend`` and ``irecv`` never block; ``poll`` moves whatever bytes can move now and
  ``wait`` sleeps (not spins) until something might have changed;
- the receiver names the header it expects; a message whose header differs fails the
  request with :class:`HeaderMismatch` before a byte of its payload lands in user memory;
- a peer that goes away fails its requests with :class:`~ringtree.errors.PeerError`.
"""

from __future__ import annotations

import math
import select
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringtree.ir.wire import WireHeader

HEADER_BYTES = WireHeader.SIZE  # the header is opaque here: compared, never parsed


@dataclass(frozen=True)
class Setup:
    """What a transport needs from its communicator to connect, and nothing more."""

    rank: int
    peers: tuple  # every rank's rendezvous record: .host, .port, .host_id
    store: Any    # the rendezvous store (set / get / compare_set / wait)
    prefix: str   # the communicator's key prefix in the store
    secret: bytes
    comm_id: bytes
    slice_bytes: int
    timeout: float
    settings: Any  # ringtree.settings.Settings


@dataclass(frozen=True)
class LinkModel:
    """LogP/α-β-γ coefficients of one transport (seconds, seconds per byte).

    ``alpha``: latency of one dependent step; ``overhead``: CPU cost of posting and
    completing one message (large in Python: this is what makes log-step algorithms win
    small sizes); ``beta``: per byte a rank sends; ``gamma``: per byte a rank reduces.
    The defaults were fitted to ``ringtree perf`` on a 2-core host (``docs/tuning.md``).
    """

    alpha: float
    overhead: float
    beta: float
    gamma: float


def _always() -> bool:
    return True


@dataclass(frozen=True)
class TransportKind:
    """One transport as :mod:`ringtree.transports.registry` lists it (NCCL's
    ``struct ncclTransport`` in ``ncclTransports[]``, ``src/transport.cc``).

    ``priority``: peers take the first transport (lowest priority) that can connect them
    under ``RINGTREE_TRANSPORT=auto``. ``open(setup, peers, listener)``: connect this rank
    to ``peers``, collectively with them. ``model``: the tuner's coefficients of its links;
    ``crowded``: those when a host runs more ranks than it has cores (None: ``model``).
    ``local``: it reaches ranks on this rank's host only; ``usable()``: it can run on this
    machine at all (``unusable`` says what is missing, for the error of naming it in
    ``RINGTREE_TRANSPORT``). ``listens``: it takes the socket this rank published at
    rendezvous. ``shares_memory``: its peers share this host's memory, so the LL
    protocol's segment can live beside it.
    """

    name: str
    priority: int
    open: Callable[[Setup, list[int], Any], Transport]
    model: LinkModel
    crowded: LinkModel | None = None
    local: bool = False
    usable: Callable[[], bool] = _always
    unusable: str = ""
    listens: bool = False
    shares_memory: bool = False

    def reaches(self, me: Any, peer: Any) -> bool:
        """Could it join the ranks of two rendezvous records
        (:class:`ringtree.bootstrap.rendezvous.Peer`): any two, or two of one host."""
        return not self.local or peer.host_id == me.host_id

    def can_connect(self, me: Any, peer: Any) -> bool:
        """NCCL's ``canConnect(info1, info2)``: may these two ranks talk over it here."""
        return self.reaches(me, peer) and self.usable()


class HeaderMismatch(Exception):
    """The message that arrived is not the one the receiver expected."""

    def __init__(self, peer: int, expected: bytes, got: bytes):
        super().__init__(f"header mismatch from rank {peer}")
        self.peer, self.expected, self.got = peer, expected, got


class Request:
    """One posted send or receive. ``done`` flips once; ``error`` is set on failure."""

    __slots__ = ("peer", "channel", "header", "buf", "pos", "done", "error", "is_send")

    def __init__(self, peer: int, channel: int, header: bytes, buf: np.ndarray, is_send: bool):
        self.peer = peer
        self.channel = channel
        self.header = header
        self.buf = buf
        self.pos = 0
        self.done = False
        self.error: BaseException | None = None
        self.is_send = is_send

    def fail(self, err: BaseException) -> None:
        if not self.done:
            self.error = err
            self.done = True

    def result(self) -> None:
        if self.error is not None:
            raise self.error

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes


class Transport(ABC):
    """Moves framed messages to and from a set of peers: every method the fabric calls.

    Four are required (``isend``, ``irecv``, ``poll``, ``close``); the rest have defaults
    a transport overrides when it can do better (NCCL's ``struct ncclTransport``, gloo's
    ``pair.h``: one table of hooks, the same for every backend).

    Waiting is one protocol, so the fabric can sleep on several transports at once:
    ``spin_phase`` (poll for a while; True if something moved), ``prepare_sleep`` (False:
    something is ready, do not sleep), then a ``poll(2)`` on every transport's
    ``wait_fds`` for at most ``nap`` seconds, then ``finish_sleep``.
    """

    name = "transport"
    nap = math.inf  # longest sleep the transport allows (shm checks peers' liveness)
    stale = 0  # messages of another (older) communicator of the job, dropped unread

    @abstractmethod
    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        """Queue ``header + payload`` to ``peer`` on ``channel``."""

    @abstractmethod
    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        """Queue a receive of exactly ``header`` + ``into.nbytes`` bytes into ``into``."""

    @abstractmethod
    def poll(self) -> bool:
        """Make all progress possible without blocking; True if anything moved."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection (peers see EOF)."""

    def leave_reason(self, text: str) -> None:
        """Before closing because of an abort: leave its first cause where peers read it."""
        return None

    def dead_peers(self) -> set[int]:
        """The peers whose process this transport can see is gone now (shared memory:
        pid and start time); one that cannot tell (TCP: a dead host and a slow one look
        alike) sees none."""
        return set()

    def hang_up(self) -> None:
        """Make every peer's requests to us fail now, as if we had closed, without
        releasing anything a thread of ours may still be using (a revoke from any
        thread); :meth:`close` follows later, on the thread that fails."""
        return None

    def peer_name(self, peer: int) -> str:
        """How errors name ``peer`` (a virtual rank's transport names what plays it)."""
        return f"rank {peer}"

    def pending(self) -> bool:
        """Is a request posted and unfinished? (An idle transport is not waited on.)"""
        return True

    def has_message(self, peer: int, channel: int) -> bool:
        """A message from ``peer`` waits on ``channel`` with no receive posted for it (the
        probe of a receive from any source)."""
        raise NotImplementedError(f"the {self.name} transport cannot probe for messages")

    # ---- zero-copy receives -----------------------------------------------------------

    def can_view(self, peer: int, nbytes: int) -> bool:
        """Can a message of ``nbytes`` from ``peer`` be read in place (``irecv_view``)?"""
        return False

    def irecv_view(self, peer: int, channel: int, header: bytes, nbytes: int) -> Request:
        """Like ``irecv``, but ``req.buf`` becomes the transport's own memory (uint8);
        give it back with :meth:`release` once read."""
        raise NotImplementedError(f"the {self.name} transport has no zero-copy receives")

    def release(self, req: Request) -> None:
        """Give back the memory of a view received with :meth:`irecv_view`."""
        return None

    # ---- waiting ----------------------------------------------------------------------

    def spin_phase(self) -> bool:
        return False

    def prepare_sleep(self) -> bool:
        return True

    def wait_fds(self) -> list[tuple[int, int]]:
        """(fd, poll mask) of everything whose readiness means progress."""
        return []

    def finish_sleep(self, rung: bool = True) -> None:
        """After the sleep (``rung``: woken by a descriptor rather than the timeout)."""
        return None

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, alone, through the protocol above."""
        if self.spin_phase() or not self.prepare_sleep():
            return
        events: list = []
        try:
            fds = self.wait_fds()
            if not fds:
                time.sleep(min(timeout, 0.001))
                return
            p = select.poll()
            for fd, mask in fds:
                p.register(fd, mask)
            try:
                events = p.poll(max(0, int(min(timeout, self.nap) * 1000)))
            except InterruptedError:
                events = [()]
        finally:
            self.finish_sleep(bool(events))
