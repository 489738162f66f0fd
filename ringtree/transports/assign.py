"""Which transport carries each peer: ``RINGTREE_TRANSPORT`` = ``auto`` (default) | ``shm`` |
``tcp``.

- ``auto``: peers that published the same host identity (hostname and boot id, see
  :func:`ringtree.bootstrap.job.host_identity`) talk over shared memory, the others over TCP — a
  job spread over several hosts uses both at once.
- ``shm``: every peer over shared memory; an error if some peer is on another host.
- ``tcp``: every peer over TCP.

Every rank must make the same choice (set the variable for the whole job).
"""

from __future__ import annotations

import os

from ringtree.transports.base import Setup
from ringtree.transports.fabric import Fabric
from ringtree.transports.tcp import TcpTransport

CHOICES = ("auto", "shm", "tcp")


def shm_supported() -> bool:
    from ringtree.transports.shm_segment import SHM_DIR

    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) and hasattr(os, "mkfifo")


def plan_routes(choice: str, host_ids: list[str], rank: int) -> tuple[list[int], list[int]]:
    """(shm peers, tcp peers) of ``rank`` given every rank's host identity."""
    others = [r for r in range(len(host_ids)) if r != rank]
    if choice == "tcp":
        return [], others
    if choice == "shm":
        far = [r for r in others if host_ids[r] != host_ids[rank]]
        if far:
            raise ValueError(f"RINGTREE_TRANSPORT=shm, but rank {far[0]} is on another host "
                             f"({host_ids[far[0]]!r}, rank {rank} is on "
                             f"{host_ids[rank]!r}); use auto or tcp")
        return others, []
    near = [r for r in others if host_ids[r] == host_ids[rank]]
    return near, [r for r in others if r not in near]


def build_fabric(setup: Setup, listener) -> Fabric:
    """Connect this rank to its peers: shared memory to those on its host, TCP to the rest."""
    choice = setup.settings.transport
    host_ids = [p.host_id for p in setup.peers]
    near, far = plan_routes(choice, host_ids, setup.rank)
    if near and not shm_supported():
        if choice == "shm":
            raise RuntimeError("RINGTREE_TRANSPORT=shm, but /dev/shm is not usable here")
        near, far = [], sorted(near + far)
    routes = {}
    if far:
        addresses = [(p.host, p.port) for p in setup.peers]
        tcp = TcpTransport(setup.rank, addresses, listener, setup.comm_id, setup.secret,
                           connect_timeout=min(setup.timeout, 60.0))
        routes.update(dict.fromkeys(far, tcp))
    else:
        listener.close()
    if near:
        from ringtree.transports.shm_setup import open_shm

        routes.update(dict.fromkeys(near, open_shm(setup, near)))
    return Fabric(routes)
