"""Setting up the shared-memory transport: a collective over the ranks of one host.

Each rank creates its doorbell (a small segment and a named pipe), publishes its pid
through the store, maps every co-located peer's doorbell (and probes whether it may read
their memory directly), and, once all have done so (a store barrier), unlinks its names:
from then on nothing of the communicator is visible in ``/dev/shm`` except rings being
created, and a killed job leaves nothing behind.

:data:`SHM` is the transport's record (:mod:`ringtree.transports.registry`): ranks of one
host, where ``/dev/shm`` is writable and named pipes exist.
"""

from __future__ import annotations

import os
import secrets

from ringtree.bootstrap.job import usable_cores
from ringtree.transports import shm_segment as seg
from ringtree.transports.base import LinkModel, Setup, TransportKind
from ringtree.transports.shm import ShmTransport
from ringtree.transports.shm_segment import PeerInfo


def open_shm(setup: Setup, ranks: list[int]) -> ShmTransport:
    """Collective over this rank and ``ranks`` (its shared-memory peers): create our
    doorbell, learn theirs through the store, map them, then unlink the names.

    Env: ``RINGTREE_SHM_SLOTS`` (slots per ring, default 4), ``RINGTREE_SHM_SPIN_US``
    (spin before sleeping; default 50 µs, 0 when the host's ranks outnumber its cores),
    ``RINGTREE_SHM_DIRECT_MIN`` (messages of at least this many bytes are read straight
    from the sender's memory with :mod:`shm_cma`, 0 = never; default 1 MiB when the
    host's ranks outnumber its cores, else 0 — see :mod:`shm_cma` for the measurements).
    """
    seg.clean_stale()
    store, prefix = setup.store, setup.prefix
    nonce = store.compare_set(f"{prefix}/shm/nonce", None, secrets.token_hex(4).encode())
    tag = setup.comm_id[:4].hex() + nonce.decode()
    pid = os.getpid()
    me = PeerInfo(setup.rank, pid, seg.start_time(pid), seg.pid_namespace())
    s, cores = setup.settings, usable_cores()
    crowded = len(ranks) + 1 > cores
    spin = s.shm_spin_us if s.shm_spin_us is not None else 0.0 if crowded else 50.0
    direct = s.shm_direct_min if s.shm_direct_min is not None else 1 << 20 if crowded else 0
    t = ShmTransport(setup.rank, tag, me, {}, slot_bytes=setup.slice_bytes,
                     nslots=s.shm_slots, spin_us=spin, cores=cores, direct_min=direct,
                     yield_us=s.shm_yield_us)
    try:
        store.set(f"{prefix}/shm/info/{setup.rank}", f"{pid},{me.start},{me.ns}".encode())
        for r in ranks:
            raw = store.get(f"{prefix}/shm/info/{r}", timeout=setup.timeout).decode()
            p, st, ns = raw.split(",")
            t.peers[r] = PeerInfo(r, int(p), None if st == "None" else int(st), ns)
        t.attach_peers()
        store.set(f"{prefix}/shm/ready/{setup.rank}", b"1")
        store.wait([f"{prefix}/shm/ready/{r}" for r in ranks], timeout=setup.timeout)
        t.unlink_names()
    except BaseException:
        t.close()
        raise
    return t


def shm_supported() -> bool:
    """Can this machine run the shared-memory transport (``/dev/shm`` and named pipes)?"""
    return os.path.isdir(seg.SHM_DIR) and os.access(seg.SHM_DIR, os.W_OK) \
        and hasattr(os, "mkfifo")


SHM = TransportKind(
    "shm", priority=0, open=lambda setup, peers, _listener: open_shm(setup, peers),
    local=True, usable=shm_supported, unusable="/dev/shm is not usable", shares_memory=True,
    model=LinkModel(alpha=8e-6, overhead=12e-6, beta=1 / 4e9, gamma=1 / 3e9),
    # more ranks than cores on the host: every message costs context switches, so fewer,
    # larger messages win (measured with benchmarks/algorithms.py, 4 ranks on 2 cores)
    crowded=LinkModel(alpha=20e-6, overhead=60e-6, beta=1 / 2.5e9, gamma=1 / 3e9))
