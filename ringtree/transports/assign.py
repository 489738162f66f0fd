"""Which transport carries each peer: ``RINGTREE_TRANSPORT`` = ``auto`` (default) or the
name of a registered transport (:mod:`ringtree.transports.registry`: ``shm``, ``tcp``).

- ``auto``: each peer gets the first transport, in the registry's priority order, that
  can connect it (``TransportKind.can_connect``, NCCL's ``canConnect``): ranks that
  published the same host identity (hostname and boot id, see
  :func:`ringtree.bootstrap.job.host_identity`) talk over shared memory where
  ``/dev/shm`` is usable, the others over TCP — a job spread over several hosts uses both
  at once.
- a name: every peer over that transport; an error if it cannot reach some peer (``shm``
  and a peer on another host) or cannot run on this machine.

Every rank must make the same choice (set the variable for the whole job).
"""

from __future__ import annotations

from collections.abc import Sequence

from ringtree.transports.base import Setup, TransportKind
from ringtree.transports.fabric import Fabric
from ringtree.transports.registry import allowed, network


def routes(choice: str, peers: Sequence, rank: int) -> dict[str, list[int]]:
    """Transport name -> the peers of ``rank`` it carries, given every rank's rendezvous
    record (``.host_id``); only transports that carry a peer appear."""
    kinds = allowed(choice)
    me, out = peers[rank], {}
    for q in range(len(peers)):
        if q == rank:
            continue
        kind = next((k for k in kinds if k.can_connect(me, peers[q])), None)
        if kind is None:
            raise _refusal(choice, kinds[0], peers, rank)
        out.setdefault(kind.name, []).append(q)
    return out


def _refusal(choice: str, kind: TransportKind, peers: Sequence, rank: int) -> Exception:
    """Why ``RINGTREE_TRANSPORT=choice`` (one transport) cannot carry this rank's peers:
    a peer it cannot reach (the first), else the machine cannot run it."""
    far = [q for q in range(len(peers)) if not kind.reaches(peers[rank], peers[q])]
    if far:
        q = far[0]
        return ValueError(f"RINGTREE_TRANSPORT={choice}, but rank {q} is on another host "
                          f"({peers[q].host_id!r}, rank {rank} is on "
                          f"{peers[rank].host_id!r}); use auto or {network().name}")
    return RuntimeError(f"RINGTREE_TRANSPORT={choice}, but {kind.unusable or 'it cannot run'} "
                        "here")


def build_fabric(setup: Setup, listener) -> Fabric:
    """Connect this rank to its peers, each over the transport :func:`routes` gives it."""
    choice = setup.settings.transport
    kinds = {k.name: k for k in allowed(choice)}
    plan = routes(choice, setup.peers, setup.rank)
    opened = {}
    # the least preferred (the network) first, as before: its peers may be connecting
    for name in sorted(plan, key=lambda n: -kinds[n].priority):
        transport = kinds[name].open(setup, plan[name], listener)
        opened.update(dict.fromkeys(plan[name], transport))
    if not any(kinds[name].listens for name in plan):
        listener.close()
    return Fabric(opened)
