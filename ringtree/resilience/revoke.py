"""Revoke (ULFM's ``MPIX_Comm_revoke``, NCCL's ``ncclCommRevoke``): any rank, alone.

The revoking rank (1) writes the revocation to the store, with its kind first, so any
rank that reads the communicator's abort line also reads that it was revoked; (2) hangs
up every link without releasing anything (:meth:`Transport.hang_up`: shared-memory
"closed" words and doorbells, TCP ``shutdown``), which any thread may do while another
thread of this rank is blocked in a call. A peer blocked on us then fails at once
(shared memory wakes it; TCP reads EOF), finds the revocation in the store and raises
:class:`~ringtree.errors.CommRevoked`; as it fails it closes its own links, so ranks that
wait on *it* fail next — the cascade reaches every rank that is inside a call within a
few wake-ups, on the LL and Simple paths alike, whatever the message size. A rank that
is not inside a call raises at its next call (the health check before any work), and a
rank blocked only on ranks outside any call finds the store line at its once-a-second
idle check. No thread is started.

The revoked communicator is never usable again (ULFM's rule); its buffers cannot receive
anything, so nothing stale can land in the communicator :func:`shrink` makes, whose
links, segments and store keys are new (a new prefix, hence a new communicator id).
"""

from __future__ import annotations

import threading

from ringtree import failure
from ringtree.resilience.state import state


def revoke(comm, why: str | None = None) -> None:
    """Revoke ``comm`` for every rank (non-collective, idempotent, any thread)."""
    st = state(comm)
    if st.revoked or comm._closed:
        return
    st.revoked = True
    why = why or f"rank {comm.rank} revoked the communicator"
    failure.revoked_here(comm, why)
    comm.fabric.hang_up(why)
    if comm.ll is not None:
        comm.ll.ll.hang_up()
    comm.fabric.interrupt()
    if _idle(comm):  # nothing of ours runs in the links: release them now
        comm.fabric.close(why)


def _idle(comm) -> bool:
    """No call of this rank is in flight, and the caller is the issuing thread."""
    owner = comm._owner.ident
    mine = owner is None or owner == threading.get_ident()
    return mine and not comm.executor.busy and comm.progress.driver is None and \
        (comm.ll is None or not comm.ll.pending)


def is_revoked(comm) -> bool:
    """Has ``comm`` been revoked, here or (as far as the store says) by another rank?"""
    if state(comm).revoked:
        return True
    try:
        return comm.store.try_get(failure.abort_key(comm) + "_kind") == b"revoked"
    except Exception:  # noqa: BLE001 - the store is gone
        return False
