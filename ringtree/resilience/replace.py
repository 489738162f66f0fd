"""Replace: a new process takes a dead rank's place in a running job (no restart of the
survivors, no new rendezvous).

The survivors call ``comm.replace()``: it revokes ``comm``, agrees on the failed set
(:func:`~ringtree.resilience.agree.agree`) and then waits for one newcomer per failed
rank. A newcomer is a process started with the dead rank's world rank and
``RINGTREE_JOIN=1`` (``ringtree run --max-restarts`` does this); its ``ringtree.init``
calls :func:`join_seat`, which counts it in the store (``<root>/ft/join/<world rank>``,
an incarnation number) and waits for a *seat*. The lowest surviving rank offers each
newcomer its seat (``<root>/ft/seat/<world rank>/<incarnation>``: the child's prefix,
its rank and size, and the world ranks) once the newcomer has counted itself in, then
tells the other survivors (``<child prefix>/seated``); survivors and newcomers then
build the child together, with every rank where it was — the newcomer at the dead
rank's index. ``<root>`` is the prefix of the communicator the chain started from
(``rt/world`` for ``ringtree.init``'s).

Bounds: a newcomer that does not arrive within ``timeout`` (default: the communicator's
init timeout) makes every survivor raise :class:`~ringtree.errors.RecoveryError`, the
same on all (the leader writes the outcome once). ``limit``: more failures than this are
not waited for; the call shrinks instead (``ringtree train --elastic`` passes the
launcher's remaining restarts). The leader is a single writer: if it dies during the
offer the survivors time out (a limit of this version).
"""

from __future__ import annotations

import time

from ringtree.errors import RecoveryError
from ringtree.resilience.agree import agree
from ringtree.resilience.revoke import revoke
from ringtree.resilience.shrink import build_child, shrink
from ringtree.resilience.state import state


def _wait(store, key: str, deadline: float) -> bytes | None:
    pause = 0.002
    while True:
        raw = store.try_get(key)
        if raw is not None or time.monotonic() > deadline:
            return raw
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)


def offer(comm, root: str, seats: list[tuple[int, int]], world: list[int], prefix: str,
          deadline: float) -> list[int]:
    """The leader: a seat (world rank, index in the child of world ranks ``world``) for
    each newcomer that counts itself in before ``deadline``; returns the world ranks that
    did not come. Used by :func:`replace` and :func:`~ringtree.resilience.grow.grow`."""
    store, late = comm.store, []
    wr = ",".join(map(str, world))
    for w, f in seats:
        offered = store.add(f"{root}/ft/offered/{w}", 0)
        while store.add(f"{root}/ft/join/{w}", 0) <= offered:
            if time.monotonic() > deadline:
                late.append(w)
                break
            time.sleep(0.01)
        else:
            store.set(f"{root}/ft/seat/{w}/{offered + 1}",
                      f"{prefix}|{f}|{len(world)}|{wr}".encode())
            store.add(f"{root}/ft/offered/{w}", 1)
    return late


def replace(comm, *, limit: int | None = None, timeout: float | None = None):
    """The survivors' side (see the module docstring): the child of ``comm`` with a
    newcomer in each failed rank's place."""
    revoke(comm, f"rank {comm.rank} replaces failed ranks")
    st = state(comm)
    agree(comm, 1)
    gone = list(st.failed)
    if limit is not None and len(gone) > limit:
        return shrink(comm)
    root = st.root or comm.prefix
    prefix = f"{comm.prefix}/k{st.shrinks + 1}"
    wait = timeout if timeout is not None else (comm.settings.init_timeout or comm.timeout)
    deadline = time.monotonic() + wait
    leader = min(r for r in range(comm.size) if r not in gone)
    if comm.rank == leader:
        late = offer(comm, root, [(comm.world_ranks[f], f) for f in gone],
                     list(comm.world_ranks), prefix, deadline)
        comm.store.set(f"{prefix}/seated", ",".join(map(str, late)).encode() or b"ok")
    seated(comm, prefix, deadline, f"replace: no replacement for world rank(s) {{}} joined "
           f"within {wait:g} s")
    return build_child(comm, list(comm.world_ranks))


def seated(comm, prefix: str, deadline: float, missing: str) -> None:
    """Wait for the leader's word that every newcomer took its seat; ``missing`` (with a
    ``{}`` for the world ranks that did not come) is the error every member raises."""
    raw = _wait(comm.store, f"{prefix}/seated", deadline + 5.0)
    if raw != b"ok":
        who = raw.decode() if raw else "?"
        raise RecoveryError(f"rank {comm.rank}: " + missing.format(who))


def join_seat(store, root: str, world_rank: int, timeout: float) -> tuple[str, int, int,
                                                                           tuple[int, ...]]:
    """The newcomer's side: count in, wait for the seat; (prefix, rank, size, world ranks)."""
    n = store.add(f"{root}/ft/join/{world_rank}", 1)
    raw = _wait(store, f"{root}/ft/seat/{world_rank}/{n}", time.monotonic() + timeout)
    if raw is None:
        raise RecoveryError(f"world rank {world_rank} (replacement {n}) found no seat in the "
                            f"running job within {timeout:g} s: did the survivors call "
                            "replace()?")
    prefix, rank, size, wr = raw.decode().split("|")
    return prefix, int(rank), int(size), tuple(int(w) for w in wr.split(","))
