"""TCP transport: sockets per (peer, channel), opened lazily, full duplex, zero-copy.

- ``RINGTREE_SOCKET_NTHREADS`` × ``RINGTREE_NSOCKS_PERTHREAD`` sockets per (peer,
  channel) (NCCL's names; default 1 × 1, ``tcp_socket.sockets_per_peer``): messages of
  at least 256 KiB are cut into that many contiguous parts, one per socket,
  so several TCP streams share a fat or lossy path.
  Socket buffers: ``RINGTREE_SOCKET_BUFFER`` (default 4 MiB) where the kernel allows it,
  so the kernel holds what a busy rank has queued (``tcp_socket``).
- Per message the Python work is constant (a header, a ``sendmsg``/``recv_into`` per
  socket-buffer's worth): the kernel copies the payload straight from and into NumPy
  memory.

- The lower rank connects, the higher rank accepts (so two ranks that need each other at
  the same moment never open two sockets). A connection introduces itself with a hello:
  magic, communicator id, rank, channel and an HMAC of them under the job token; an
  accepted socket that fails it is closed without being read further (one whose hello is
  valid for another communicator of the job, e.g. an older epoch's, is counted as stale).
- Messages are framed as a 32-byte header followed by the payload. ``sendmsg`` gathers
  header and payload into one system call; receives land straight in the caller's NumPy
  memory (``recv_into``).
- Everything is nonblocking; :meth:`TcpTransport.wait` sleeps in ``poll(2)`` on exactly
  the sockets that have work, so ranks that outnumber cores do not burn CPU.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from collections import deque

import numpy as np

from ringtree.errors import PeerError
from ringtree.transports.base import HEADER_BYTES, HeaderMismatch, Request, Transport
from ringtree.transports.tcp_hello import HELLO as _HELLO
from ringtree.transports.tcp_hello import hello, mac, verdict
from ringtree.transports.tcp_socket import STRIPE_MIN, STRIPE_SHIFT, hang_up, sockets_per_peer, tune


def make_listener(host: str) -> socket.socket:
    """A nonblocking listening socket on ``host`` (any free port)."""
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tune(lst)
    lst.bind((host, 0))
    lst.listen(4096)
    lst.setblocking(False)
    return lst


class _Conn:
    __slots__ = ("peer", "channel", "sock", "up", "sendq", "recvq", "hdr", "hpos", "dead",
                 "out", "deadline", "retry_at")

    def __init__(self, peer: int, channel: int):
        self.peer = peer
        self.channel = channel
        self.sock: socket.socket | None = None
        self.up = False         # connected and introduced: messages may flow
        self.out = b""          # hello bytes still to send while connecting
        self.deadline = 0.0     # connect deadline (monotonic)
        self.retry_at = 0.0
        self.sendq: deque[Request] = deque()
        self.recvq: deque[Request] = deque()
        self.hdr = bytearray(HEADER_BYTES)
        self.hpos = 0
        self.dead: BaseException | None = None


class TcpTransport(Transport):
    name = "tcp"
    hang_up = hang_up

    def __init__(self, rank: int, addresses: list[tuple[str, int]], listener: socket.socket,
                 comm_id: bytes, secret: bytes, connect_timeout: float = 60.0):
        self.rank = rank
        self.addresses = addresses
        self.listener = listener
        self.comm_id = comm_id
        self.secret = secret
        self.connect_timeout = connect_timeout
        self.conns: dict[tuple[int, int], _Conn] = {}
        self.active: set[_Conn] = set()
        self.connecting: set[_Conn] = set()  # our connects in flight (or waiting to retry)
        self.nsocks = sockets_per_peer()
        self.striped: list[tuple[Request, list[Request]]] = []  # split messages in flight
        self.hellos: list[tuple[socket.socket, bytearray]] = []
        self.closed = False

    # ---- connection management -------------------------------------------------------

    def _mac(self, rank: int, channel: int) -> bytes:
        return mac(self.secret, self.comm_id, rank, channel)

    def _conn(self, peer: int, channel: int) -> _Conn:
        key = (peer, channel)
        conn = self.conns.get(key)
        if conn is None:
            conn = self.conns[key] = _Conn(peer, channel)
            if self.rank < peer:
                self._connect(conn)
        return conn

    def _connect(self, conn: _Conn) -> None:
        """Start a nonblocking connect; :meth:`_progress_connect` finishes it. Nothing
        here waits, so a peer that cannot be reached holds up only the steps that need
        it, and those fail at their collective's deadline naming it."""
        if conn.deadline == 0.0:
            conn.deadline = time.monotonic() + self.connect_timeout
        host, port = self.addresses[conn.peer]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tune(sock)
        sock.setblocking(False)
        err = sock.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            sock.close()
            self._connect_failed(conn, OSError(err, os.strerror(err)))
            return
        conn.sock = sock
        conn.out = hello(self.secret, self.comm_id, self.rank, conn.channel)
        self.connecting.add(conn)

    def _progress_connect(self, conn: _Conn) -> bool:
        """Push the hello through a connecting socket; True once it is on its way."""
        sock = conn.sock
        if sock is None:  # waiting to retry
            if time.monotonic() >= conn.retry_at:
                self._connect(conn)
            return False
        try:
            n = sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            if time.monotonic() > conn.deadline:
                sock.close()
                conn.sock = None
                self._connect_failed(conn, TimeoutError(
                    f"no answer within {self.connect_timeout:g} s"))
            return False
        except OSError as e:
            sock.close()
            conn.sock = None
            self._connect_failed(conn, e)
            return False
        conn.out = conn.out[n:]
        if conn.out:
            return True
        self.connecting.discard(conn)
        conn.up = True
        if conn.sendq or conn.recvq:
            self.active.add(conn)
        return True

    def _connect_failed(self, conn: _Conn, e: OSError) -> None:
        # The peer listened before it published its address, so a refusal means its
        # listener is gone: it closed or died. Only silence or a missing route is worth
        # retrying (until the connect deadline).
        host, port = self.addresses[conn.peer]
        refused = isinstance(e, ConnectionRefusedError) or \
            getattr(e, "errno", None) == errno.ECONNREFUSED
        if not refused and time.monotonic() < conn.deadline:
            conn.retry_at = time.monotonic() + 0.05
            self.connecting.add(conn)
            return
        self.connecting.discard(conn)
        how = "is not accepting connections (closed or died)" if refused else \
            "cannot be reached"
        self._die(conn, f"at {host}:{port} {how}: {e}", close=False)

    def _accept(self) -> bool:
        moved = False
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            sock.setblocking(False)
            tune(sock)
            self.hellos.append((sock, bytearray()))
            moved = True
        keep = []
        for sock, buf in self.hellos:
            try:
                data = sock.recv(_HELLO.size - len(buf))
            except (BlockingIOError, InterruptedError):
                keep.append((sock, buf))
                continue
            except OSError:
                sock.close()
                continue
            if not data:
                sock.close()
                continue
            buf += data
            moved = True
            if len(buf) < _HELLO.size:
                keep.append((sock, buf))
                continue
            kind, peer, channel = verdict(bytes(buf), self.secret, self.comm_id,
                                          len(self.addresses))
            if kind != "ours":
                self.stale += kind == "stale"
                sock.close()  # not one of ours: drop without acting on anything it sent
                continue
            conn = self.conns.get((peer, channel))
            if conn is None:
                conn = self.conns[(peer, channel)] = _Conn(peer, channel)
            if conn.sock is not None:
                sock.close()
                continue
            conn.sock = sock
            conn.up = True
            if conn.sendq or conn.recvq:
                self.active.add(conn)
        self.hellos = keep
        return moved

    # ---- the Transport interface ------------------------------------------------------

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        return self._post(peer, channel, header, payload, True)

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        return self._post(peer, channel, header, into, False)

    def _post(self, peer: int, channel: int, header: bytes, buf: np.ndarray,
              send: bool) -> Request:
        if self.nsocks > 1 and buf.nbytes >= STRIPE_MIN and buf.flags.c_contiguous:
            return self._stripe(peer, channel, header, buf, send)
        return self._queue(peer, channel, header, buf, send)

    def _stripe(self, peer: int, channel: int, header: bytes, buf: np.ndarray,
                send: bool) -> Request:
        """One message as ``nsocks`` contiguous parts, part j on the peer's socket j, each
        framed with the message's header. Sender and receiver split alike (the rule
        depends on the size only), and each socket stays FIFO."""
        whole = Request(peer, channel, header, buf, send)
        flat = buf.reshape(-1).view(np.uint8)
        k, n = self.nsocks, flat.nbytes
        cuts = [n * j // k for j in range(k + 1)]
        parts = [self._queue(peer, channel | (j << STRIPE_SHIFT), header,
                             flat[cuts[j]:cuts[j + 1]], send) for j in range(k)]
        self.striped.append((whole, parts))
        self._settle()
        return whole

    def _settle(self) -> None:
        """Finish the split messages whose parts are all done (or fail them)."""
        keep = []
        for whole, parts in self.striped:
            err = next((p.error for p in parts if p.error is not None), None)
            if err is not None:
                whole.fail(err)
            elif all(p.done for p in parts):
                whole.done = True
            else:
                keep.append((whole, parts))
        self.striped = keep

    def _queue(self, peer: int, channel: int, header: bytes, buf: np.ndarray,
               send: bool) -> Request:
        """Queue one framed message on the (peer, channel) socket and push what the
        socket takes now."""
        req = Request(peer, channel, header, buf, send)
        conn = self._conn(peer, channel)
        if conn.dead is not None:
            req.fail(conn.dead)
            return req
        q, pump = (conn.sendq, self._pump_send) if send else (conn.recvq, self._pump_recv)
        q.append(req)
        if conn.up:
            if len(q) == 1:
                pump(conn)
            if q:
                self.active.add(conn)
        return req

    def poll(self) -> bool:
        moved = self._accept() if (self.hellos or self._awaiting_accept()) else False
        for conn in list(self.connecting):
            moved |= self._progress_connect(conn)
        for conn in list(self.active):
            if not conn.up:
                continue
            if conn.sendq:
                moved |= self._pump_send(conn)
            if conn.recvq:
                moved |= self._pump_recv(conn)
            if not conn.sendq and not conn.recvq:
                self.active.discard(conn)
        if self.striped:
            self._settle()
        return moved

    def _awaiting_accept(self) -> bool:
        return any(not c.up and c.dead is None and c not in self.connecting
                   for c in self.conns.values())

    def wait_fds(self) -> list[tuple[int, int]]:
        """(fd, poll mask) of everything whose readiness means progress (for a fabric
        that sleeps on several transports at once)."""
        fds = []
        if self.hellos or self._awaiting_accept():
            fds.append((self.listener.fileno(), select.POLLIN))
            fds += [(sock.fileno(), select.POLLIN) for sock, _ in self.hellos]
        fds += [(c.sock.fileno(), select.POLLOUT) for c in self.connecting if c.sock is not None]
        for conn in self.active:
            if not conn.up:
                continue
            mask = (select.POLLIN if conn.recvq else 0) | (select.POLLOUT if conn.sendq else 0)
            if mask:
                fds.append((conn.sock.fileno(), mask))
        return fds

    def has_message(self, peer: int, channel: int) -> bool:
        """A message (or EOF, which the next receive reports) waits on the connection and
        no receive is posted for it."""
        conn = self.conns.get((peer, channel))
        if conn is None:
            conn = self._conn(peer, channel)  # connect, or expect the peer's connection
        if conn.sock is None or conn.recvq or conn.hpos or conn.dead is not None:
            return False
        try:
            conn.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True  # the receive posted next reports the failure
        return True

    def pending(self) -> bool:
        return bool(self.active) or bool(self.hellos) or bool(self.connecting)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in self.conns.values():
            if conn.sock is not None:
                try:
                    conn.sock.close()
                except OSError:
                    pass
        for sock, _ in self.hellos:
            sock.close()
        try:
            self.listener.close()
        except OSError:
            pass

    # ---- byte pumps -------------------------------------------------------------------

    def _die(self, conn: _Conn, how: str, close: bool = True) -> None:
        where = f"tcp channel {conn.channel & ((1 << STRIPE_SHIFT) - 1)}" + (
            f", socket {conn.channel >> STRIPE_SHIFT}" if conn.channel >> STRIPE_SHIFT else "")
        err = PeerError(conn.peer, f"rank {conn.peer} {how} ({where})")
        conn.dead = err
        for q in (conn.sendq, conn.recvq):
            while q:
                q.popleft().fail(err)
        self.active.discard(conn)
        if close and conn.sock is not None:
            try:
                conn.sock.close()
            except OSError:
                pass

    def _pump_send(self, conn: _Conn) -> bool:
        moved = False
        sock = conn.sock
        assert sock is not None
        while conn.sendq:
            req = conn.sendq[0]
            total = HEADER_BYTES + req.buf.nbytes
            try:
                if req.pos < HEADER_BYTES:
                    parts = [memoryview(req.header)[req.pos:]]
                    if req.buf.nbytes:
                        parts.append(req.buf)
                    n = sock.sendmsg(parts)
                else:
                    n = sock.send(memoryview(req.buf)[req.pos - HEADER_BYTES:])
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                reset = e.errno in (errno.EPIPE, errno.ECONNRESET)
                self._die(conn, "reset the connection" if reset else f"failed: {e}")
                return True
            moved = True
            req.pos += n
            if req.pos < total:
                return moved
            req.done = True
            conn.sendq.popleft()
        return moved

    def _pump_recv(self, conn: _Conn) -> bool:
        moved = False
        sock = conn.sock
        assert sock is not None
        while conn.recvq:
            req = conn.recvq[0]
            try:
                if conn.hpos < HEADER_BYTES:
                    conn.hpos += _fill(sock, conn.hdr, conn.hpos)
                    moved = True
                    if conn.hpos < HEADER_BYTES:
                        return moved
                    if bytes(conn.hdr) != req.header:
                        err = HeaderMismatch(conn.peer, req.header, bytes(conn.hdr))
                        conn.recvq.popleft().fail(err)
                        # the stream is out of step: stop using it, but leave closing to
                        # close(), after the communicator has told every rank why
                        self._die(conn, "sent a message that does not match", close=False)
                        return True
                size = req.buf.nbytes
                if req.pos < size:
                    req.pos += _fill(sock, req.buf, req.pos)
                    moved = True
                    if req.pos < size:
                        return moved
            except (BlockingIOError, InterruptedError):
                return moved
            except EOFError:  # the peer closed its end (see _fill)
                self._die(conn, "closed the connection")
                return True
            except OSError as e:
                self._die(conn, f"reset the connection ({e.strerror})")
                return True
            req.done = True
            conn.hpos = 0
            conn.recvq.popleft()
        return moved


def _fill(sock: socket.socket, buf, pos: int) -> int:
    """Receive what has arrived into ``buf[pos:]``; the byte count, or EOFError if the
    peer closed the stream (``recv`` returned no bytes)."""
    n = sock.recv_into(memoryview(buf)[pos:])
    if n == 0:
        raise EOFError
    return n
