"""What a communicator remembers of failures: its agreements, the failed ranks they
decided, how many the caller acknowledged, whether it was revoked.

Kept on the communicator as ``comm._ft`` and made on first use, so a communicator that
never fails carries nothing. Liveness: a rank of this host is dead when its pid (and
start time, so a reused pid does not count) is gone, read from ``/proc``; the pid is the
one the rank published in the store when its shared-memory transport was set up.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FtState:
    agreements: int = 0                     # agree() calls so far (the store keys' number)
    shrinks: int = 0                        # shrink() calls so far (the children's prefix)
    failed: list[int] = field(default_factory=list)  # agreed failures, in decision order
    acked: int = 0                          # ack_failed(): the first ``acked`` of failed
    revoked: bool = False
    root: str = ""                          # the first ancestor's prefix (replace's keys)
    pids: dict[int, tuple[int, int | None] | None] = field(default_factory=dict)


def state(comm) -> FtState:
    st = getattr(comm, "_ft", None)
    if st is None:
        st = comm._ft = FtState()
    return st


def is_dead(comm, rank: int) -> bool:
    """True if ``rank`` of ``comm`` is known dead here: its process on this host is gone.
    False when alive or unknown (a rank of another host, or one without shared memory:
    only a deadline decides about those)."""
    from ringtree.transports import shm_segment as seg

    st = state(comm)
    if rank not in st.pids:
        st.pids[rank] = None
        if comm.peers[rank].host_id == comm.host_id:
            try:
                raw = comm.store.try_get(f"{comm.prefix}/shm/info/{rank}")
            except Exception:  # noqa: BLE001 - the store is gone: nothing to learn here
                raw = None
            if raw:
                pid, start, ns = raw.decode().split(",")
                if ns == seg.pid_namespace():
                    st.pids[rank] = (int(pid), None if start == "None" else int(start))
    known = st.pids[rank]
    return known is not None and not seg.alive(*known)
