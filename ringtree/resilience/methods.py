"""The communicator's methods for failures: thin wrappers over :mod:`ringtree.resilience`
(the communicator module stays the place of the failure-free path)."""

from __future__ import annotations

from ringtree.resilience.agree import ack_failed, agree, failed_ranks
from ringtree.resilience.grow import grow
from ringtree.resilience.replace import replace
from ringtree.resilience.revoke import is_revoked, revoke
from ringtree.resilience.shrink import shrink


class Resilient:
    """Mixed into :class:`ringtree.Communicator`."""

    def revoke(self) -> None:
        """Revoke for every rank (``MPIX_Comm_revoke``): non-collective; every blocked or
        later call on any rank raises :class:`~ringtree.errors.CommRevoked`."""
        revoke(self)

    def is_revoked(self) -> bool:
        return is_revoked(self)

    def agree(self, flag: int = 1, *, timeout: float | None = None) -> int:
        """AND of ``flag`` over the live ranks, the same on every survivor, with one
        agreed :meth:`failed_ranks` (``MPIX_Comm_agree``). Collective over survivors."""
        return agree(self, flag, timeout=timeout)

    def failed_ranks(self) -> list[int]:
        """Ranks known failed (``MPIX_Comm_get_failed``); agreed ones first."""
        return failed_ranks(self)

    def ack_failed(self, count: int | None = None) -> int:
        """Acknowledge the first ``count`` failures (``MPIX_Comm_ack_failed``)."""
        return ack_failed(self, count)

    def shrink(self, exclude=None, *, min_ranks: int | str = 1):
        """The survivors' communicator (``MPIX_Comm_shrink``, ``ncclCommShrink``);
        ``exclude``: ranks to drop, named by the caller (then no agreement runs)."""
        return shrink(self, exclude, min_ranks=min_ranks)

    def replace(self, *, limit: int | None = None, timeout: float | None = None):
        """The survivors' communicator with a newcomer in each failed rank's place (a
        process started with that world rank and ``RINGTREE_JOIN=1``); see
        :mod:`ringtree.resilience.replace`."""
        return replace(self, limit=limit, timeout=timeout)

    def grow(self, newcomers, *, timeout: float | None = None):
        """This communicator with newcomers after its members (``ncclCommGrow``): ``k``
        or their world ranks; each newcomer is a process started with ``RINGTREE_JOIN=1``
        and its world rank; see :mod:`ringtree.resilience.grow`. Collective over the
        members; this communicator is released once the new one stands."""
        return grow(self, newcomers, timeout=timeout)
