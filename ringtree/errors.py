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
    """The communicator was aborted (locally or by another rank's failure); ``peer`` is
    the rank whose lost connection revealed it, if any."""

    peer: int | None = None


class RendezvousError(RingtreeError):
    """The ranks could not form the communicator: a duplicate rank, disagreeing world
    sizes, or ranks that never arrived within ``RINGTREE_INIT_TIMEOUT``."""


class CommRevoked(CommAborted):
    """The communicator was revoked (``comm.revoke()`` on some rank, ULFM's
    ``MPIX_ERR_REVOKED``): every call on it raises this; ``agree`` and ``shrink`` still
    work, through the store."""


class RecoveryError(RingtreeError):
    """Recovery could not reach one membership: the store is gone, this rank was declared
    failed by the others, or fewer ranks survive than the caller requires."""
