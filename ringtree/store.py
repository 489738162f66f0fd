"""TCP key-value store for rendezvous, with job-token authentication.

This is ringtree's counterpart of ``torch.distributed.TCPStore`` (and of the root socket in
NCCL's ``src/bootstrap.cc``): one :class:`StoreServer` per job (hosted by rank 0 or by the
``ringtree run`` launcher), one :class:`StoreClient` per rank. The API follows torch's Store:
``set``, blocking ``get``, ``add`` (atomic counter), ``compare_set``, ``wait``, ``check``,
``delete``.

Wire protocol (no pickle, ever). Every message is a frame::

    frame  = u32 length ‖ body                      (network byte order)
    body   = u8 code ‖ field*       (code: an Op in requests, a Status in replies)
    field  = u32 length ‖ bytes

Numbers travel as fields holding ``!d`` (timeouts, seconds; ``inf`` = no deadline) or ``!q``
(counter increments). Keys are UTF-8 strings, values raw bytes.

Authentication is an HMAC-SHA256 challenge-response, so the token never crosses the wire:

1. server → client: ``RTSTORE1 ‖ snonce`` (32 random bytes);
2. client → server: ``HELLO(cnonce, HMAC(token, "client" ‖ snonce ‖ cnonce))``;
3. server → client: ``OK(HMAC(token, "server" ‖ snonce ‖ cnonce))`` (the client checks it, so a
   rank never talks to the store of another job) or ``AUTH_FAILED``, then disconnects.

Until step 2 succeeds the server acts on nothing a connection sends and accepts frames of at
most :data:`MAX_HELLO_BYTES`; a connection that has not authenticated within
:data:`HANDSHAKE_TIMEOUT` seconds is dropped.

The server is one thread around a ``selectors`` loop. Blocking ``get``/``wait`` never block it:
the request is parked and answered when its keys are written or its deadline (computed on the
server, so clients do not poll) expires.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import math
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "StoreAuthError",
    "StoreClient",
    "StoreError",
    "StoreServer",
    "StoreTimeout",
]

MAGIC = b"RTSTORE1"
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_FRAME_BYTES = 2 * MAX_VALUE_BYTES + (1 << 20)  # compare_set carries two values
MAX_HELLO_BYTES = 1024
HANDSHAKE_TIMEOUT = 30.0
_NONCE_BYTES = 32
_REPLY_MARGIN = 30.0  # extra client-side patience beyond a server-side deadline
_MAX_LISTED_KEYS = 8

_LEN = struct.Struct("!I")
_F64 = struct.Struct("!d")
_I64 = struct.Struct("!q")


class StoreError(RuntimeError):
    """The store failed or refused a request (the message says which store and why)."""


class StoreAuthError(StoreError):
    """The store and the client do not share the job token."""


class StoreTimeout(StoreError, TimeoutError):
    """A blocking store operation (or connecting to the store) ran out of time."""


class Op(IntEnum):
    HELLO = 1
    SET = 2
    GET = 3
    TRY_GET = 4
    ADD = 5
    WAIT = 6
    CHECK = 7
    DELETE = 8
    COMPARE_SET = 9


class Status(IntEnum):
    OK = 0
    VALUE = 1
    NOT_FOUND = 2
    TIMEOUT = 3
    ERROR = 4
    AUTH_FAILED = 5


# ---------------------------------------------------------------------------- framing


def _encode(code: int, fields: Sequence[bytes] = ()) -> bytes:
    parts = [b"", bytes((code,))]
    for f in fields:
        parts.append(_LEN.pack(len(f)))
        parts.append(f)
    body_len = sum(len(p) for p in parts)
    parts[0] = _LEN.pack(body_len)
    return b"".join(parts)


def _decode(body: bytes) -> tuple[int, list[bytes]]:
    if not body:
        raise ValueError("empty frame")
    code, pos, fields = body[0], 1, []
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated field header")
        (n,) = _LEN.unpack_from(body, pos)
        pos += 4
        if pos + n > len(body):
            raise ValueError("truncated field")
        fields.append(body[pos : pos + n])
        pos += n
    return code, fields


def _mac(key: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(key, role + server_nonce + client_nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("connection closed by the store")
        got += k
    return bytes(buf)


def _recv_frame(sock: socket.socket, limit: int) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, 4))
    if n > limit:
        raise StoreError(f"store sent a {n}-byte frame (limit {limit})")
    return _recv_exact(sock, n)


def _list_keys(keys: Iterable[str]) -> str:
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:_MAX_LISTED_KEYS])
    more = len(keys) - _MAX_LISTED_KEYS
    return shown + (f" (+{more} more)" if more > 0 else "")


# ---------------------------------------------------------------------------- server


class _Conn:
    __slots__ = ("sock", "peer", "rbuf", "wbuf", "nonce", "authed", "closing", "closed", "waiter")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.rbuf = bytearray()
        self.wbuf = bytearray()
        self.nonce = secrets.token_bytes(_NONCE_BYTES)
        self.authed = False
        self.closing = False  # reply queued, then disconnect; nothing more is read
        self.closed = False
        self.waiter: _Waiter | None = None


class _Waiter:
    """A parked GET (one key) or WAIT (several keys) request."""

    __slots__ = ("conn", "op", "keys", "pending", "done")

    def __init__(self, conn: _Conn, op: Op, keys: list[str], pending: set[str]) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.pending = pending
        self.done = False


class _Reject(Exception):
    """A malformed or invalid request: answered with an ERROR reply."""


_LISTENER = object()
_WAKER = object()


class StoreServer:
    """Serve a key-value store on ``host:port`` from a daemon thread.

    ``port=0`` picks a free port; the bound one is in :attr:`port`. Clients must present
    ``token`` (see the module docstring). Use :meth:`close` (or a ``with`` block) to stop.
    """

    def __init__(
        self, host: str = "0.0.0.0", port: int = 0, token: str = "", *, backlog: int = 1024
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as e:
            raise StoreError(f"cannot listen on {host}:{port} for the ringtree store: {e}") from e
        self._listener.setblocking(False)
        self.host: str = host
        self.port: int = self._listener.getsockname()[1]
        self._key = token.encode("utf-8")
        self._data: dict[str, bytes] = {}
        self._watchers: dict[str, list[_Waiter]] = {}
        self._timers: list[tuple[float, int, object]] = []
        self._seq = itertools.count()
        self._conns: set[_Conn] = set()
        self._resume: list[_Conn] = []
        self._stopping = False
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKER)
        self._thread = threading.Thread(
            target=self._run, name=f"ringtree-store:{self.port}", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreServer({self.host}:{self.port}, keys={len(self._data)})"

    def close(self) -> None:
        """Stop serving, disconnect every client and release the port. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10.0)
        self._wake_w.close()

    # -- event loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._sel.select(self._select_timeout()):
                    if key.data is _LISTENER:
                        self._accept()
                    elif key.data is _WAKER:
                        try:
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                    else:
                        self._on_event(key.data, mask)
                self._expire(time.monotonic())
                while self._resume:
                    conn = self._resume.pop()
                    self._guarded(conn, self._process)
        finally:
            for conn in list(self._conns):
                self._drop(conn)
            self._sel.close()
            self._listener.close()
            self._wake_r.close()

    def _select_timeout(self) -> float | None:
        if self._resume:
            return 0.0
        if not self._timers:
            return None
        return max(0.0, self._timers[0][0] - time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: leave the connection in the backlog for later
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}")
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._push_timer(time.monotonic() + HANDSHAKE_TIMEOUT, conn)
            self._send(conn, _LEN.pack(len(MAGIC) + _NONCE_BYTES) + MAGIC + conn.nonce)

    def _on_event(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._guarded(conn, self._flush)
        if mask & selectors.EVENT_READ and not conn.closed and not conn.closing:
            self._guarded(conn, self._read)

    def _guarded(self, conn: _Conn, fn: Callable[[_Conn], None]) -> None:
        """Run one connection's handler; a failure drops that connection, never the server."""
        if conn.closed:
            return
        try:
            fn(conn)
        except Exception:  # isolate one misbehaving client from the others
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        conn.rbuf += data
        if len(conn.rbuf) > 2 * MAX_FRAME_BYTES:  # pipelining far beyond any sane client
            self._drop(conn)
            return
        self._process(conn)

    def _process(self, conn: _Conn) -> None:
        """Handle every complete frame in the read buffer, stopping at a parked request."""
        while not conn.closed and not conn.closing and conn.waiter is None:
            if len(conn.rbuf) < 4:
                return
            (n,) = _LEN.unpack_from(conn.rbuf, 0)
            limit = MAX_FRAME_BYTES if conn.authed else MAX_HELLO_BYTES
            if n > limit:
                self._reply_and_close(
                    conn, Status.ERROR, f"frame of {n} bytes exceeds the limit of {limit}"
                )
                return
            if len(conn.rbuf) < 4 + n:
                return
            body = bytes(conn.rbuf[4 : 4 + n])
            del conn.rbuf[: 4 + n]
            self._handle(conn, body)

    # -- requests ------------------------------------------------------------------------

    def _handle(self, conn: _Conn, body: bytes) -> None:
        try:
            code, fields = _decode(body)
        except ValueError as e:
            self._reply_and_close(conn, Status.ERROR, f"malformed frame: {e}")
            return
        if not conn.authed:
            self._hello(conn, code, fields)
            return
        try:
            self._dispatch(conn, code, fields)
        except _Reject as e:
            self._send(conn, _encode(Status.ERROR, [str(e).encode()]))

    def _hello(self, conn: _Conn, code: int, fields: list[bytes]) -> None:
        if code != Op.HELLO or len(fields) != 2 or len(fields[0]) != _NONCE_BYTES:
            self._reply_and_close(conn, Status.AUTH_FAILED, "expected a HELLO handshake")
            return
        client_nonce, proof = fields
        expected = _mac(self._key, b"client", conn.nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            self._reply_and_close(conn, Status.AUTH_FAILED, "wrong job token")
            return
        conn.authed = True
        server_proof = _mac(self._key, b"server", conn.nonce, client_nonce)
        self._send(conn, _encode(Status.OK, [server_proof]))

    def _dispatch(self, conn: _Conn, code: int, f: list[bytes]) -> None:
        data = self._data
        if code == Op.SET:
            key, value = _key(f, 2), f[1]
            data[key] = value
            self._send(conn, _encode(Status.OK))
            self._notify(key)
        elif code == Op.GET:
            key, timeout = _key(f, 2), _float(f[1])
            if key in data:
                self._send(conn, _encode(Status.VALUE, [data[key]]))
            else:
                self._park(conn, Op.GET, [key], {key}, timeout)
        elif code == Op.TRY_GET:
            key = _key(f, 1)
            reply = _encode(Status.VALUE, [data[key]]) if key in data else _encode(Status.NOT_FOUND)
            self._send(conn, reply)
        elif code == Op.ADD:
            key, amount = _key(f, 2), _int(f[1])
            old = data.get(key, b"0")
            try:
                new = int(old.decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                raise _Reject(f"add: key {key!r} holds a non-integer value") from None
            data[key] = str(new).encode("ascii")
            self._send(conn, _encode(Status.VALUE, [data[key]]))
            self._notify(key)
        elif code == Op.WAIT:
            if not f:
                raise _Reject("wait: missing timeout")
            timeout, keys = _float(f[0]), [_text(k) for k in f[1:]]
            missing = {k for k in keys if k not in data}
            if not missing:
                self._send(conn, _encode(Status.OK))
            else:
                self._park(conn, Op.WAIT, keys, missing, timeout)
        elif code == Op.CHECK:
            ok = all(_text(k) in data for k in f)
            self._send(conn, _encode(Status.OK, [b"\x01" if ok else b"\x00"]))
        elif code == Op.DELETE:
            existed = data.pop(_key(f, 1), None) is not None
            self._send(conn, _encode(Status.OK, [b"\x01" if existed else b"\x00"]))
        elif code == Op.COMPARE_SET:
            key, has_expected, expected, desired = _key(f, 4), f[1] == b"\x01", f[2], f[3]
            current = data.get(key)
            if (current is None and not has_expected) or (
                current is not None and has_expected and current == expected
            ):
                data[key] = desired
                self._send(conn, _encode(Status.VALUE, [desired]))
                self._notify(key)
            else:
                # torch.distributed.Store.compare_set convention: an absent key with an
                # expected value stores nothing and answers ``expected``.
                self._send(conn, _encode(Status.VALUE, [expected if current is None else current]))
        else:
            raise _Reject(f"unknown operation code {code}")

    # -- parking -------------------------------------------------------------------------

    def _park(
        self, conn: _Conn, op: Op, keys: list[str], missing: set[str], timeout: float
    ) -> None:
        if timeout <= 0:
            self._send(conn, _encode(Status.TIMEOUT, [k.encode() for k in sorted(missing)]))
            return
        waiter = _Waiter(conn, op, keys, missing)
        conn.waiter = waiter
        for k in missing:
            self._watchers.setdefault(k, []).append(waiter)
        if math.isfinite(timeout):
            self._push_timer(time.monotonic() + timeout, waiter)

    def _notify(self, key: str) -> None:
        for waiter in self._watchers.pop(key, ()):
            if waiter.done:
                continue
            waiter.pending.discard(key)
            if waiter.pending:
                continue
            # Every awaited key was written at some point; re-check (one may be deleted since).
            missing = {k for k in waiter.keys if k not in self._data}
            if missing:
                waiter.pending = missing
                for k in missing:
                    self._watchers.setdefault(k, []).append(waiter)
                continue
            if waiter.op == Op.GET:
                reply = _encode(Status.VALUE, [self._data[waiter.keys[0]]])
            else:
                reply = _encode(Status.OK)
            self._finish(waiter, reply)

    def _finish(self, waiter: _Waiter, reply: bytes) -> None:
        waiter.done = True
        self._unwatch(waiter)
        conn = waiter.conn
        conn.waiter = None
        if not conn.closed:
            self._send(conn, reply)
            if conn.rbuf:
                self._resume.append(conn)  # pipelined requests behind the parked one

    def _unwatch(self, waiter: _Waiter) -> None:
        for k in waiter.pending:
            lst = self._watchers.get(k)
            if lst is None:
                continue
            try:
                lst.remove(waiter)
            except ValueError:
                pass
            if not lst:
                del self._watchers[k]

    def _push_timer(self, deadline: float, obj: object) -> None:
        heapq.heappush(self._timers, (deadline, next(self._seq), obj))

    def _expire(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, obj = heapq.heappop(self._timers)
            if isinstance(obj, _Waiter):
                if not obj.done:
                    missing = sorted(k for k in obj.keys if k not in self._data)
                    self._finish(obj, _encode(Status.TIMEOUT, [k.encode() for k in missing]))
            elif isinstance(obj, _Conn) and not obj.authed and not obj.closed:
                self._drop(obj)  # never completed the handshake

    # -- output --------------------------------------------------------------------------

    def _send(self, conn: _Conn, frame: bytes) -> None:
        if conn.closed:
            return
        conn.wbuf += frame
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.wbuf:
            try:
                n = conn.sock.send(conn.wbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            del conn.wbuf[:n]
        if conn.closing and not conn.wbuf:
            self._drop(conn)
            return
        events = 0 if conn.closing else selectors.EVENT_READ
        if conn.wbuf:
            events |= selectors.EVENT_WRITE
        self._sel.modify(conn.sock, events or selectors.EVENT_READ, conn)

    def _reply_and_close(self, conn: _Conn, status: Status, message: str) -> None:
        conn.closing = True
        conn.rbuf.clear()
        self._send(conn, _encode(status, [message.encode()]))

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.waiter is not None:
            conn.waiter.done = True
            self._unwatch(conn.waiter)
            conn.waiter = None
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def _text(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        raise _Reject("key is not valid UTF-8") from None


def _key(fields: list[bytes], n: int) -> str:
    if len(fields) != n:
        raise _Reject(f"expected {n} fields, got {len(fields)}")
    return _text(fields[0])


def _float(b: bytes) -> float:
    if len(b) != _F64.size:
        raise _Reject("bad timeout field")
    return _F64.unpack(b)[0]


def _int(b: bytes) -> int:
    if len(b) != _I64.size:
        raise _Reject("bad integer field")
    return _I64.unpack(b)[0]


# ---------------------------------------------------------------------------- client


class StoreClient:
    """A connection to a :class:`StoreServer`, safe to share between threads.

    Connecting is retried until ``connect_timeout`` because the server may not be up yet.
    ``timeout`` is the default deadline of blocking ``get``/``wait``. Requests are serialized
    by a lock, so a thread blocked in ``get`` holds the connection: give threads that wait
    concurrently their own clients.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        *,
        timeout: float = 300.0,
        connect_timeout: float = 60.0,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.timeout = float(timeout)
        self._where = f"{host}:{port}"
        self._lock = threading.Lock()
        self._sock: socket.socket | None = self._connect(token.encode("utf-8"), connect_timeout)

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreClient({self._where})"

    # -- connection ----------------------------------------------------------------------

    def _connect(self, key: bytes, connect_timeout: float) -> socket.socket:
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
            if remaining <= 0:
                raise StoreTimeout(
                    f"could not connect to the ringtree store at {self._where} within "
                    f"{connect_timeout:g}s (last error: {last!r}); is rank 0 or the launcher "
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
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    # -- requests ------------------------------------------------------------------------

    def _request(
        self, op: Op, fields: Sequence[bytes], what: str, wait: float | None = None
    ) -> tuple[int, list[bytes]]:
        frame = _encode(op, fields)
        if wait is None:
            sock_timeout: float | None = self.timeout
        else:
            sock_timeout = wait + _REPLY_MARGIN if math.isfinite(wait) else None
        with self._lock:
            sock = self._sock
            if sock is None:
                raise StoreError(f"{what}: the client of the store at {self._where} is closed")
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
