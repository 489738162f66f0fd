"""Rendezvous over the ``torch.distributed`` Store that torch hands the backend creator.

Why torch's store and not ringtree's own: whatever started the job — ``torchrun``
(including its agent store), ``env://``, ``tcp://``, ``file://``, an explicit
``store=`` argument, ``ringtree run`` or ``mpirun`` with ``MASTER_ADDR`` — torch has
already built a working store by the time it calls the creator, and it is namespaced per
process group (a ``PrefixStore``). Adapting it to the few calls a ringtree communicator
makes (``set``, ``get`` with a timeout, ``try_get``, ``add``, ``compare_set``) needs no
second server, no second port and no second secret to distribute.

The communicator's TCP connections are still authenticated: rank 0 draws a random
secret and publishes it through the store (mixed with ``RINGTREE_TOKEN`` when the
launcher set one), so only processes that can read this job's store can join.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from ringtree.bootstrap import environ
from ringtree.bootstrap.store import StoreTimeout


class TorchStore:
    """The interface :class:`ringtree.Communicator` uses, over a c10d ``Store``."""

    def __init__(self, store, timeout: float = 300.0):
        self.store = store
        self.timeout = float(timeout)

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self.wait([key], timeout)
        return bytes(self.store.get(key))

    def try_get(self, key: str) -> bytes | None:
        if not self.store.check([key]):
            return None
        return bytes(self.store.get(key))

    def add(self, key: str, amount: int = 1) -> int:
        return int(self.store.add(key, amount))

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Like ``StoreClient.wait``: a timeout raises ``StoreTimeout`` (torch's stores
        raise a bare ``RuntimeError("Wait timeout")``, which callers waiting in slices,
        such as the rendezvous, must tell from a real failure)."""
        t = self.timeout if timeout is None else float(timeout)
        try:
            self.store.wait(list(keys), timedelta(seconds=t))
        except RuntimeError as e:
            if "timeout" not in str(e).lower() or isinstance(e, StoreTimeout):
                raise
            raise StoreTimeout(f"keys {list(keys)[:3]} not in torch's store after {t:g} s: "
                               f"{e}") from e

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(list(keys)))

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        """Same contract as ``ringtree.bootstrap.store.StoreClient.compare_set`` (None: if absent)."""
        return bytes(self.store.compare_set(key, b"" if expected is None else expected,
                                            desired))

    def delete(self, key: str) -> bool:
        return bool(self.store.delete_key(key))

    def close(self) -> None:
        """Drop the reference (torch owns the store; a TCPStore server must be able to go
        away with the group, e.g. to re-initialise on the same port)."""
        self.store = _Closed()


class _Closed:
    def __getattr__(self, name: str):
        raise RuntimeError("the process group's store was released (group shut down)")


def shared_secret(store: TorchStore, rank: int, key: str = "ringtree/secret") -> bytes:
    """A per-group secret for the TCP handshake, drawn by rank 0."""
    if rank == 0:
        store.set(key, secrets.token_bytes(16))
    nonce = store.get(key)
    token = environ.get("RINGTREE_TOKEN") or ""
    return hashlib.sha256(token.encode() + nonce).digest()


def master_address(store) -> str | None:
    """The host the job's store lives on (to pick the interface peers can reach)."""
    s = store
    for _ in range(8):
        host = getattr(s, "host", None)
        if isinstance(host, str) and host:
            return host
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    return environ.get("MASTER_ADDR") or None
