"""ringtree's exceptions. Every error about a peer names the rank; every error about a
collective names it and its sequence number."""

from __future__ import annotations


class RingtreeError(RuntimeError):
    """Base class of ringtree's runtime errors."""


class PeerError(RingtreeError):
    """A peer closed its connection, reset it, or died. ``cause``: the first failure
    that made the peer close, when it left one (then the peer is not to blame)."""

    def __init__(self, peer: int, message: str, cause: str | None = None):
        super().__init__(message)
        self.peer = peer
        self.cause = cause

    def __reduce__(self):
        return (type(self), (self.peer, str(self), self.cause))


class MismatchError(RingtreeError):
    """Ranks called different collectives (or the same one with different arguments)."""


class CollectiveTimeout(RingtreeError, TimeoutError):
    """A collective did not finish within its deadline."""


class CommAborted(RingtreeError):
    """The communicator was aborted (locally or by another rank's failure)."""


class RendezvousError(RingtreeError):
    """The ranks could not form the communicator: a duplicate rank, disagreeing world
    sizes, or ranks that never arrived within ``RINGTREE_INIT_TIMEOUT``."""
