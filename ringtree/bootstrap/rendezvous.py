"""Forming a communicator through the store: claim a rank, agree on the size, meet.

Each rank, under the communicator's prefix:

1. *claims* its rank: ``compare_set(claim/<rank>, None, "<size>|pid P on HOST")``. A second
   process with the same rank finds the first one's claim and fails at once, naming both
   processes (``RINGTREE_RANK=1`` given twice);
2. *agrees on the size*: the first claim of any rank fixes it under ``size``; a rank that
   says otherwise fails at once, naming both sizes and who said each;
3. publishes its address under ``peer/<rank>`` and waits for everyone's, in one-second
   slices, checking ``abort`` in between. A failure in 1–2 is written to ``abort`` (first
   writer wins), so every waiting rank raises the same message within about a second;
4. gives up after ``RINGTREE_INIT_TIMEOUT`` seconds (default: the collective timeout),
   naming the ranks that never arrived.

Like NCCL's bootstrap (``bootstrapInit``: every rank reports to the root, which checks
``nranks``) and torchrun's rendezvous, which rejects a duplicate node id.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from ringtree.errors import CommAborted, RendezvousError

__all__ = ["Peer", "meet"]

_SLICE = 1.0


def _whoami() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _fail(store, prefix: str, message: str) -> RendezvousError:
    try:
        store.compare_set(f"{prefix}/abort", None, message.encode())
    except Exception:  # noqa: BLE001 - the store may be gone; the local error still stands
        pass
    return RendezvousError(message)


def meet(store, prefix: str, rank: int, size: int, me: bytes, timeout: float) -> list[bytes]:
    """Publish ``me`` as this rank's address record and return every rank's, in rank order."""
    who = _whoami()
    claim = f"{size}|{who}".encode()
    held = store.compare_set(f"{prefix}/claim/{rank}", None, claim)
    if held != claim:
        _, _, other = held.decode(errors="replace").partition("|")
        raise _fail(store, prefix,
                    f"rank {rank} was started twice: by {other} and by {who}; every process "
                    "of a job needs its own rank (check RINGTREE_RANK / the launcher's rank "
                    "variables)")
    agreed = store.compare_set(f"{prefix}/size", None, claim)
    if agreed != claim:
        their_size, _, other = agreed.decode(errors="replace").partition("|")
        if int(their_size) != size:
            raise _fail(store, prefix,
                        f"the ranks disagree on the world size: {other} says {their_size}, "
                        f"rank {rank} ({who}) says {size}")
    store.set(f"{prefix}/peer/{rank}", me)
    keys = [f"{prefix}/peer/{r}" for r in range(size)]
    deadline = time.monotonic() + timeout
    from ringtree.bootstrap.store import StoreTimeout

    while True:
        why = store.try_get(f"{prefix}/abort")
        if why:
            raise CommAborted(f"rank {rank}: could not form the communicator: {why.decode()}")
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timeout=max(1e-3, min(_SLICE, left)))
            break
        except StoreTimeout:
            if left <= _SLICE:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                if missing:
                    raise RendezvousError(
                        f"rank {rank}: rank(s) {_ranks(missing)} of {size} never arrived "
                        f"within RINGTREE_INIT_TIMEOUT={timeout:g}s (did they crash or not "
                        "start, or were they given another master address or port?)"
                    ) from None
    why = store.try_get(f"{prefix}/abort")
    if why:  # a late duplicate or a wrong size: do not start with a broken job
        raise CommAborted(f"rank {rank}: could not form the communicator: {why.decode()}")
    return [store.get(k, timeout=max(timeout, 1.0)) for k in keys]


@dataclass(frozen=True)
class Peer:
    """What a rank published at rendezvous: ``host:port|host_id``."""

    rank: int
    host: str
    port: int
    host_id: str

    @classmethod
    def parse(cls, rank: int, record: bytes) -> Peer:
        addr, _, hid = record.decode().partition("|")
        h, _, p = addr.rpartition(":")
        return cls(rank, h, int(p), hid)


def wait_count(store, key: str, n: int, timeout: float) -> bool:
    """Wait (gently) until the counter ``key`` reaches ``n``; False after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = store.try_get(key)
        if raw is not None and int(raw) >= n:
            return True
        time.sleep(0.02)
    return False
