"""The store client: one connection per rank, thread-safe; a dropped connection is
opened again (once) by the next request."""

from __future__ import annotations

import hmac
import math
import secrets
import socket
import threading
import time
from collections.abc import Sequence

from ringtree.bootstrap.store.protocol import (
    _F64,
    _I64,
    _NONCE_BYTES,
    _REPLY_MARGIN,
    HANDSHAKE_TIMEOUT,
    MAGIC,
    MAX_FRAME_BYTES,
    MAX_HELLO_BYTES,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Op,
    Status,
    StoreAuthError,
    StoreError,
    StoreTimeout,
    _decode,
    _encode,
    _list_keys,
    _mac,
    _recv_frame,
)
from ringtree.closing import Closing
from ringtree.settings import current

OP_TIMEOUT = 5.0  # default deadline of a request that does not wait for a key


class StoreClient(Closing):
    """A connection to a :class:`StoreServer`, safe to share between threads.

    Connecting is retried until ``connect_timeout`` because the server may not be up yet.
    ``timeout`` is the default deadline of blocking ``get``/``wait``. Requests are serialized
    by a lock, so a thread blocked in ``get`` holds the connection: give threads that wait
    concurrently their own clients.

    Every request has a deadline, so a store cut off by a network partition makes each
    caller fail instead of hanging: ``get``/``wait`` their own timeout plus a small reply
    margin; everything else (``set``, ``try_get``, ``add``, ``compare_set``, ...) at most
    ``op_timeout`` seconds (``RINGTREE_STORE_OP_TIMEOUT``, default 5; longer for values of
    many megabytes), and that includes waiting for another thread to finish its request. A
    request whose reply does not come in time drops the connection (its request/reply
    pairing is lost) and raises; the next request opens a new one, in one attempt
    bounded by ``op_timeout``; if that fails, requests fail at once until ``op_timeout``
    has passed, then one tries again. So a store that was slow or cut off for a while is
    used again when it is back (a reply that came late under load once left the client
    unusable, and a rank that was forming its communicator then failed with "the client
    is closed" while the others waited for it), and a store that is gone costs one
    refused connection per ``op_timeout``, not a wait per request.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        *,
        timeout: float = 300.0,
        connect_timeout: float = 60.0,
        op_timeout: float | None = None,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.timeout = float(timeout)
        self.op_timeout = float(op_timeout) if op_timeout is not None else \
            (current().store_op_timeout or OP_TIMEOUT)
        self._where = f"{host}:{port}"
        self._lock = threading.Lock()
        self._key = token.encode("utf-8")
        self._closed = False
        self._retry_at = 0.0  # after a failed reconnect: no new attempt before this
        self._sock: socket.socket | None = self._connect(self._key, connect_timeout)

    def __repr__(self) -> str:
        return f"StoreClient({self._where})"

    # -- connection ----------------------------------------------------------------------

    def _connect(self, key: bytes, connect_timeout: float, once: bool = False) -> socket.socket:
        deadline = time.monotonic() + connect_timeout
        delay, last = 0.01, None
        while True:
            remaining = deadline - time.monotonic()
            sock = None
            try:
                sock = socket.create_connection(
                    (self.host, self.port), timeout=max(0.05, min(remaining, 10.0))
                )
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(1.0, min(remaining, HANDSHAKE_TIMEOUT)))
                self._handshake(sock, key)
                sock.settimeout(None)
                return sock
            except (StoreAuthError, _NotAStore):
                if sock is not None:
                    sock.close()
                raise
            except OSError as e:  # refused, reset, unreachable, DNS not ready, timeout, ...
                if sock is not None:
                    sock.close()
                last = e
            remaining = deadline - time.monotonic()
            if remaining <= 0 or once:
                raise StoreTimeout(
                    f"could not connect to the ringtree store at {self._where} within "
                    f"{connect_timeout:.3g}s (last error: {last!r}); is rank 0 or the launcher "
                    "running, and is the address reachable from this host?"
                )
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)

    def _handshake(self, sock: socket.socket, key: bytes) -> None:
        hello = _recv_frame(sock, MAX_HELLO_BYTES)
        if len(hello) != len(MAGIC) + _NONCE_BYTES or not hello.startswith(MAGIC):
            raise _NotAStore(f"the server at {self._where} is not a ringtree store")
        server_nonce = hello[len(MAGIC) :]
        client_nonce = secrets.token_bytes(_NONCE_BYTES)
        proof = _mac(key, b"client", server_nonce, client_nonce)
        sock.sendall(_encode(Op.HELLO, [client_nonce, proof]))
        code, fields = _decode(_recv_frame(sock, MAX_HELLO_BYTES))
        expected = _mac(key, b"server", server_nonce, client_nonce)
        if code == Status.AUTH_FAILED or (
            code == Status.OK and not (fields and hmac.compare_digest(fields[0], expected))
        ):
            raise StoreAuthError(
                f"store at {self._where} refused the job token; "
                "is RINGTREE_TOKEN the same on every rank?"
            )
        if code != Status.OK:
            raise _NotAStore(f"unexpected handshake reply from the store at {self._where}")

    def close(self) -> None:
        """Close the connection (the server keeps every key). Idempotent."""
        with self._lock:
            self._closed = True
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _reopen(self, what: str) -> socket.socket:
        """A new connection in place of a dropped one (lock held; see the class doc)."""
        if self._closed:
            raise StoreError(f"{what}: the client of the store at {self._where} is closed")
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            raise StoreError(f"{what}: no connection to the store at {self._where} (the last "
                             f"attempt failed; the next one in {wait:.1f}s)")
        try:
            self._sock = self._connect(self._key, self.op_timeout, once=True)
        except StoreError as e:
            self._retry_at = time.monotonic() + self.op_timeout
            raise StoreError(f"{what}: the connection to the store at {self._where} was "
                             f"dropped and could not be opened again: {e}") from None
        return self._sock

    # -- requests ------------------------------------------------------------------------

    def _request(
        self, op: Op, fields: Sequence[bytes], what: str, wait: float | None = None
    ) -> tuple[int, list[bytes]]:
        frame = _encode(op, fields)
        if wait is None:  # a quick request: a short deadline (1 s more per MB it carries)
            sock_timeout: float | None = min(self.timeout, self.op_timeout) + len(frame) / 1e6
        else:
            sock_timeout = wait + _REPLY_MARGIN if math.isfinite(wait) else None
        if not self._lock.acquire(timeout=-1 if sock_timeout is None else sock_timeout):
            raise StoreTimeout(f"{what}: the connection to the store at {self._where} stayed "
                               f"busy with another thread's request for {sock_timeout:g}s")
        try:
            sock = self._sock if self._sock is not None else self._reopen(what)
            try:
                sock.settimeout(sock_timeout)
                sock.sendall(frame)
                body = _recv_frame(sock, MAX_FRAME_BYTES)
            except TimeoutError:
                self._abandon()
                raise StoreTimeout(
                    f"{what}: the store at {self._where} did not answer within "
                    f"{sock_timeout:g}s"
                ) from None
            except OSError as e:
                self._abandon()
                raise StoreError(
                    f"{what}: lost the connection to the store at {self._where}: {e}"
                ) from e
        finally:
            self._lock.release()
        code, out = _decode(body)
        if code == Status.ERROR:
            msg = out[0].decode("utf-8", "replace") if out else "unknown error"
            raise StoreError(f"{what}: the store at {self._where} answered: {msg}")
        return code, out

    def _abandon(self) -> None:
        """Drop a connection whose request/reply pairing is no longer known (lock held)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _wait_time(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else float(timeout)
        if math.isnan(t) or t < 0:
            raise ValueError(f"timeout must be >= 0 seconds (or math.inf), got {timeout!r}")
        return t

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` (bytes; a str is UTF-8 encoded) under ``key``, waking its waiters."""
        k, v = _check_key(key), _check_value(value)
        self._request(Op.SET, [k, v], f"set({key!r})")

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` s (default: the client's)."""
        k, t = _check_key(key), self._wait_time(timeout)
        code, out = self._request(Op.GET, [k, _F64.pack(t)], f"get({key!r})", wait=t)
        if code == Status.TIMEOUT:
            raise StoreTimeout(
                f"timed out after {t:g}s waiting for key {key!r} in the store at {self._where}"
            )
        return out[0]

    def try_get(self, key: str) -> bytes | None:
        """Return the value of ``key``, or None if it is not set (never blocks)."""
        code, out = self._request(Op.TRY_GET, [_check_key(key)], f"try_get({key!r})")
        return out[0] if code == Status.VALUE else None

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the decimal counter at ``key`` (absent = 0)."""
        if not isinstance(amount, int) or not -(2**63) <= amount < 2**63:
            raise ValueError(f"add: amount must be a 64-bit int, got {amount!r}")
        _, out = self._request(Op.ADD, [_check_key(key), _I64.pack(amount)], f"add({key!r})")
        return int(out[0])

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` is set; StoreTimeout names the missing ones."""
        encoded, t = [_check_key(k) for k in keys], self._wait_time(timeout)
        if not encoded:
            return
        what = f"wait({_list_keys(keys)})"
        code, out = self._request(Op.WAIT, [_F64.pack(t), *encoded], what, wait=t)
        if code == Status.TIMEOUT:
            missing = [m.decode("utf-8", "replace") for m in out]
            raise StoreTimeout(
                f"timed out after {t:g}s waiting for keys in the store at {self._where}; "
                f"still missing: {_list_keys(missing)}"
            )

    def check(self, keys: list[str]) -> bool:
        """True if every key in ``keys`` is set (never blocks)."""
        _, out = self._request(Op.CHECK, [_check_key(k) for k in keys], "check")
        return out[0] == b"\x01"

    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        _, out = self._request(Op.DELETE, [_check_key(key)], f"delete({key!r})")
        return out[0] == b"\x01"

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        """Atomically set ``key`` to ``desired`` if it holds ``expected`` (None: if absent).

        Returns the value now stored, so success is ``result == desired``. As in
        ``torch.distributed.Store.compare_set``, if the key is absent and ``expected`` is not
        None nothing is stored and ``expected`` is returned.
        """
        has = expected is not None
        exp = _check_value(expected) if has else b""
        fields = [_check_key(key), b"\x01" if has else b"\x00", exp, _check_value(desired)]
        _, out = self._request(Op.COMPARE_SET, fields, f"compare_set({key!r})")
        return out[0]


class _NotAStore(StoreError):
    """The peer does not speak the store protocol (not retried)."""


def _check_key(key: str) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}")
    b = key.encode("utf-8")
    if len(b) > MAX_KEY_BYTES:
        raise ValueError(f"store key of {len(b)} bytes exceeds the limit of {MAX_KEY_BYTES}")
    return b


def _check_value(value: bytes) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    elif not isinstance(value, bytes):
        raise TypeError(f"store values are bytes, got {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(
            f"store value of {len(value)} bytes exceeds the limit of {MAX_VALUE_BYTES}; "
            "the store is for rendezvous metadata, send bulk data over a communicator"
        )
    return value

