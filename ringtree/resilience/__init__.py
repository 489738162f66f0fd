"""Surviving failures: revoke, agree, shrink (ULFM's model, NCCL's names where they fit).

- :func:`~ringtree.resilience.revoke.revoke` (``MPIX_Comm_revoke``, ``ncclCommRevoke``):
  non-collective; every blocked or later call on the communicator, on every rank, raises
  :class:`~ringtree.errors.CommRevoked`.
- :func:`~ringtree.resilience.agree.agree` (``MPIX_Comm_agree``): the AND of an integer
  over the ranks that contribute, and one failed set, the same on every survivor.
- :func:`~ringtree.resilience.shrink.shrink` (``MPIX_Comm_shrink``, ``ncclCommShrink``):
  a new communicator over the survivors, without naming the dead (or with an explicit
  exclude list).

Everything here goes through the job's store (the rendezvous key-value server), never
through the communicator's own links, which a revoke has cut: the store is the recovery
protocol's channel, and its single point of failure (see ``docs/fault-tolerance.md``).
The failure-free path is untouched: nothing here runs until a failure or a call.
"""

from __future__ import annotations

from ringtree.resilience.agree import ack_failed, agree, failed_ranks
from ringtree.resilience.revoke import is_revoked, revoke
from ringtree.resilience.shrink import shrink

__all__ = ["ack_failed", "agree", "failed_ranks", "is_revoked", "revoke", "shrink"]
