"""Grow: newcomers join a running communicator in new places (NCCL 2.29's
``ncclCommGrow``; ULFM has no grow).

Every member calls ``comm.grow(k)`` (or ``comm.grow([w, ...])`` naming the newcomers'
world ranks; ``k`` means the next ``k`` world ranks after the communicator's largest).
A newcomer is a process of the same job started with ``RINGTREE_JOIN=1``, its world rank
in ``RINGTREE_RANK`` and the grown size in ``RINGTREE_WORLD_SIZE`` (the launcher's other
variables unchanged: it needs the launcher's store); its ``ringtree.init`` counts itself
in and waits for a seat, exactly as a replacement does
(:func:`~ringtree.resilience.replace.join_seat`). The members first finish every call
they issued on ``comm`` (a barrier), then rank 0 offers each newcomer its seat — after
the members, in the order given — and all of them build the child through the store (no
new rendezvous), members where they were. ``comm`` is released once the child stands,
as after :func:`~ringtree.resilience.shrink.shrink`; state for the newcomers is the
caller's to send (e.g. :func:`~ringtree.resilience.transfer.stream`).

Bounds: a newcomer that does not count in within ``timeout`` (default: the init timeout)
makes every member raise :class:`~ringtree.errors.RecoveryError` naming its world rank,
the same on all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ringtree.resilience.replace import offer, seated
from ringtree.resilience.shrink import build_child
from ringtree.resilience.state import state


def new_world_ranks(comm, newcomers: int | Sequence[int]) -> list[int]:
    """The newcomers' world ranks: ``k`` after the largest, or the list, checked."""
    if isinstance(newcomers, int) and not isinstance(newcomers, bool):
        if newcomers < 1:
            raise ValueError(f"grow: the number of newcomers must be >= 1, got {newcomers}")
        top = max(comm.world_ranks)
        return list(range(top + 1, top + 1 + newcomers))
    new = [int(w) for w in newcomers]
    taken = sorted(set(new) & set(comm.world_ranks))
    if not new or taken or len(set(new)) != len(new) or min(new) < 0:
        raise ValueError(f"grow: newcomers must be distinct world ranks >= 0 not already in "
                         f"the communicator (it holds {list(comm.world_ranks)}), got {new}")
    return new


def grow(comm, newcomers: int | Sequence[int], *, timeout: float | None = None):
    """The members' side (see the module docstring): the child of ``comm`` with the
    newcomers after the members."""
    new = new_world_ranks(comm, newcomers)
    comm.barrier()  # every call issued on comm is done on every rank before it is let go
    st = state(comm)
    root = st.root or comm.prefix
    prefix = f"{comm.prefix}/k{st.shrinks + 1}"
    wait = timeout if timeout is not None else (comm.settings.init_timeout or comm.timeout)
    deadline = time.monotonic() + wait
    world = list(comm.world_ranks) + new
    if comm.rank == 0:
        late = offer(comm, root, [(w, comm.size + j) for j, w in enumerate(new)], world,
                     prefix, deadline)
        comm.store.set(f"{prefix}/seated", ",".join(map(str, late)).encode() or b"ok")
    seated(comm, prefix, deadline, f"grow: no newcomer for world rank(s) {{}} joined "
           f"within {wait:g} s")
    return build_child(comm, world)
