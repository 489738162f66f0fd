"""The store server: one thread, a selectors loop, parked blocking requests."""

from __future__ import annotations

import heapq
import hmac
import itertools
import math
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ringtree.bootstrap.store.protocol import (
    _LEN,
    _NONCE_BYTES,
    HANDSHAKE_TIMEOUT,
    MAGIC,
    MAX_FRAME_BYTES,
    MAX_HELLO_BYTES,
    BadRequest,
    Op,
    Status,
    StoreError,
    _decode,
    _encode,
    _mac,
    float_field,
    int_field,
    key_field,
    text_field,
)
from ringtree.closing import Closing


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


_LISTENER = object()
_WAKER = object()


class StoreServer(Closing):
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

    def __repr__(self) -> str:
        return f"StoreServer({self.host}:{self.port}, keys={len(self._data)})"

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` as this process's server holds it (no connection needed)."""
        return self._data.get(key)

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
        except BadRequest as e:
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
            key, value = key_field(f, 2), f[1]
            data[key] = value
            self._send(conn, _encode(Status.OK))
            self._notify(key)
        elif code == Op.GET:
            key, timeout = key_field(f, 2), float_field(f[1])
            if key in data:
                self._send(conn, _encode(Status.VALUE, [data[key]]))
            else:
                self._park(conn, Op.GET, [key], {key}, timeout)
        elif code == Op.TRY_GET:
            key = key_field(f, 1)
            reply = _encode(Status.VALUE, [data[key]]) if key in data else _encode(Status.NOT_FOUND)
            self._send(conn, reply)
        elif code == Op.ADD:
            key, amount = key_field(f, 2), int_field(f[1])
            old = data.get(key, b"0")
            try:
                new = int(old.decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                raise BadRequest(f"add: key {key!r} holds a non-integer value") from None
            data[key] = str(new).encode("ascii")
            self._send(conn, _encode(Status.VALUE, [data[key]]))
            self._notify(key)
        elif code == Op.WAIT:
            if not f:
                raise BadRequest("wait: missing timeout")
            timeout, keys = float_field(f[0]), [text_field(k) for k in f[1:]]
            missing = {k for k in keys if k not in data}
            if not missing:
                self._send(conn, _encode(Status.OK))
            else:
                self._park(conn, Op.WAIT, keys, missing, timeout)
        elif code == Op.CHECK:
            ok = all(text_field(k) in data for k in f)
            self._send(conn, _encode(Status.OK, [b"\x01" if ok else b"\x00"]))
        elif code == Op.DELETE:
            existed = data.pop(key_field(f, 1), None) is not None
            self._send(conn, _encode(Status.OK, [b"\x01" if existed else b"\x00"]))
        elif code == Op.COMPARE_SET:
            key, has_expected, expected, desired = key_field(f, 4), f[1] == b"\x01", f[2], f[3]
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
            raise BadRequest(f"unknown operation code {code}")

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
