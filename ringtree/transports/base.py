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

from abc import ABC, abstractmethod

import numpy as np

from ringtree.core.wire import WireHeader

HEADER_BYTES = WireHeader.SIZE  # the header is opaque here: compared, never parsed


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
    """Moves framed messages to and from a set of peers."""

    name = "transport"

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
    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds until progress may be possible."""

    def fileno_for_wait(self) -> list[int]:
        """File descriptors whose readiness signals progress (for combined waits)."""
        return []

    @abstractmethod
    def close(self) -> None:
        """Close every connection (peers see EOF)."""
