"""Shrink (ULFM's ``MPIX_Comm_shrink``; NCCL's ``ncclCommShrink`` with an exclude list).

Survivors call ``comm.shrink()``; it revokes ``comm`` (NCCL's ``NCCL_SHRINK_ABORT``:
work in flight is cut, and the dead rank's peers stop waiting), agrees on the failed set
(:func:`~ringtree.resilience.agree.agree`, so nobody names the dead), and builds the
child over the ranks that remain, in their old order (ULFM: "comm_split with the same
colour and key = old rank"). No new rendezvous: the child meets through the parent's
store under the prefix ``<parent>/k<n>``, as :meth:`Communicator.split` does, with the
parent's secret and addresses; its links, segments and communicator id are new, so no
message of the parent can reach it. ``exclude=`` names the ranks to drop instead
(NCCL's ``excludeRanksList``: then no agreement runs, and the caller must pass the same
list on every rank that stays).

A rank that dies during the agreement is decided there (the agreement is uniform); one
that dies while the child is being set up makes the setup fail on the others (its links
fail; or, before it published its address, a watcher writes the child's abort line,
which the rendezvous reads within a second), and :func:`shrink` then agrees again, up to
``retries`` times, which is how a second failure during recovery still ends in one
membership. ``min_ranks``: fewer survivors than this raise
:class:`~ringtree.errors.RecoveryError` (``"majority"``: more than half of the parent).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from ringtree.errors import RecoveryError, RingtreeError
from ringtree.resilience.agree import agree
from ringtree.resilience.revoke import revoke
from ringtree.resilience.state import is_dead, state


def _bound(comm, min_ranks: int | str) -> int:
    if min_ranks == "majority":
        return comm.size // 2 + 1
    if not isinstance(min_ranks, int) or min_ranks < 1:
        raise ValueError(f"shrink: min_ranks must be a positive int or 'majority', "
                         f"got {min_ranks!r}")
    return min_ranks


def _excluded(comm, exclude) -> set[int]:
    gone = {int(r) for r in exclude}
    bad = [r for r in gone if not 0 <= r < comm.size]
    if bad:
        raise ValueError(f"shrink: exclude names ranks {sorted(bad)} outside 0..{comm.size - 1}")
    if comm.rank in gone:
        raise ValueError(f"shrink: rank {comm.rank} is in its own exclude list; excluded "
                         "ranks must not call shrink (as with ncclCommShrink)")
    return gone


def shrink(comm, exclude=None, *, min_ranks: int | str = 1, retries: int = 2):
    """A new communicator over the survivors of ``comm`` (see the module docstring)."""
    need = _bound(comm, min_ranks)
    gone = None if exclude is None else _excluded(comm, exclude)
    revoke(comm, f"rank {comm.rank} shrinks the communicator")
    st = state(comm)
    for attempt in range(retries + 1):
        if gone is None or attempt:
            agree(comm, 1)
            gone = (gone or set()) | set(st.failed)
        ranks = [r for r in range(comm.size) if r not in gone]
        if len(ranks) < need:
            raise RecoveryError(f"rank {comm.rank}: shrink: only {len(ranks)} of {comm.size} "
                                f"ranks survive ({sorted(gone)} failed); at least {need} "
                                f"are required")
        try:
            return build_child(comm, [comm.world_ranks[r] for r in ranks])
        except RingtreeError:
            if attempt == retries:
                raise
    raise AssertionError("unreachable")


def build_child(comm, world_ranks: list[int]):
    """The next child of ``comm`` (prefix ``<parent>/k<n>``) over ``world_ranks`` (this
    rank where its world rank stands); the parent is released once the child stands."""
    st = state(comm)
    st.shrinks += 1
    me = comm.world_ranks[comm.rank]
    prefix = f"{comm.prefix}/k{st.shrinks}"
    others = [r for r, w in enumerate(comm.world_ranks)  # (a replaced rank's seat
              if w in world_ranks and w != me and r not in st.failed]  # is a newcomer's)
    with _watching(comm, others, prefix):
        child = type(comm)(rank=world_ranks.index(me), size=len(world_ranks),
                           store=comm.store, prefix=prefix, secret=comm.secret,
                           timeout=comm.timeout, master_addr=comm.peers[comm.rank].host,
                           world_ranks=tuple(world_ranks))
    child.store_host_rank = comm.store_host_rank
    state(child).root = st.root or comm.prefix
    _release(comm)
    return child


@contextmanager
def _watching(comm, ranks: list[int], prefix: str):
    """While the child forms: a rank of ``ranks`` whose process dies (it never publishes
    its address, so the rendezvous would wait out ``RINGTREE_INIT_TIMEOUT``) gets the
    child's abort line written, which the rendezvous reads within a second; the failed
    construction makes :func:`shrink` agree again. One short-lived thread."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            dead = [r for r in ranks if is_dead(comm, r)]
            if dead:
                try:
                    comm.store.compare_set(f"{prefix}/abort", None,
                                           f"rank {dead[0]} died while the communicator "
                                           f"was being formed".encode())
                except Exception:  # noqa: BLE001 - the store is gone: the wait says so
                    pass
                return

    t = threading.Thread(target=watch, daemon=True, name="ringtree-shrink-watch")
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def _release(comm) -> None:
    """Free the parent's links and threads (it is revoked; its store stays the child's)."""
    if comm._closed:
        return
    comm._fail_pending(comm.health.broken)
    comm.fabric.close()
    comm._closed = True
    comm._hot_off = True
    comm.progress.stop()
    from ringtree.prof import detach

    detach(comm, flush=False)  # the child is being built: a dump due waits for the watcher
