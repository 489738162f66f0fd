"""ringtree's exceptions. Every error about a peer names the rank; every error about a
collective names it and its sequence number."""

from __future__ import annotations


class RingtreeError(RuntimeError):
    """Base class of ringtree's runtime errors."""


class PeerError(RingtreeError):
    """A peer closed its connection, reset it, or died."""

    def __init__(self, peer: int, message: str):
        super().__init__(message)
        self.peer = peer


class MismatchError(RingtreeError):
    """Ranks called different collectives (or the same one with different arguments)."""


class CollectiveTimeout(RingtreeError, TimeoutError):
    """A collective did not finish within its deadline."""


class CommAborted(RingtreeError):
    """The communicator was aborted (locally or by another rank's failure)."""


class RendezvousError(RingtreeError):
    """The ranks could not form the communicator: a duplicate rank, disagreeing world
    sizes, or ranks that never arrived within ``RINGTREE_INIT_TIMEOUT``."""
