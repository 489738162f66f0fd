"""A worker's side of the switch: join groups, stream chunks, recover losses, collect results.

One TCP connection per worker carries all of its groups. An all-reduce of ``n`` bytes is
cut into chunks of at most the group's chunk size; at most ``window`` chunks are in
flight (SwitchML's self-clocked window: chunk ``s + window`` goes out only when the
result of ``s`` came back, so a slow worker throttles everyone instead of overflowing the
switch's slots).

Loss recovery (``wire``): every DATA frame carries a fresh serial; the switch NACKs the
serials it lost as soon as a later frame (or a PROBE) shows the gap, and the worker
resends exactly those chunks at once — SwitchML recovers by timeout, which on a loaded
host must be long, so one lost chunk used to stall its slot for tens of milliseconds. A
worker that has sent all it may and heard nothing for ``PROBE_AFTER`` sends one PROBE, so
a lost last frame is found too. No chunk is ever resent on a timer: with TCP underneath,
nothing but the switch's drops can be lost, and a result that is merely late (a slow
peer) costs nothing but the wait.

Everything is nonblocking (``poll``/``wait_fds``) so the executor's fabric can drive it
next to shm and TCP; :meth:`SwitchLink.all_reduce` is the blocking convenience.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque

import numpy as np

from ringtree.dtypes import DType
from ringtree.ops import ReduceOp
from ringtree.switch import wire
from ringtree.switch.wire import DATA, FRAME, JOIN, JOINED, NACK, PROBE, Kind, SwitchError

_EMPTY = memoryview(b"")
PROBE_AFTER = 0.004   # quiet seconds after the last frame before a tail-loss probe
DEFAULT_WINDOW = 8
DEFAULT_CHUNK = 256 << 10


class SwitchOp:
    """One posted all-reduce through the switch: ``recv = ⊕ over members of send``."""

    __slots__ = ("group", "send", "recv", "dtype", "op", "header", "flags", "size",
                 "chunk_elems", "nchunks", "first_seq", "next_chunk", "done_chunks", "got",
                 "done", "error")

    def __init__(self, group: SwitchGroup, send: np.ndarray, recv: np.ndarray, dtype: DType,
                 op: ReduceOp, header: bytes, flags: int = wire.PAYLOAD | wire.WANT):
        self.group, self.send, self.recv = group, send, recv
        self.dtype, self.op, self.flags = dtype, op, flags
        self.header = header.ljust(wire.CALL_HEADER_BYTES, b"\0")[:wire.CALL_HEADER_BYTES]
        self.chunk_elems = max(1, group.chunk_bytes // dtype.itemsize)
        self.size = count = send.size
        self.nchunks = -(-count // self.chunk_elems)
        self.first_seq = -1
        self.next_chunk = 0
        self.done_chunks = 0
        self.got = bytearray(self.nchunks)
        self.done = self.nchunks == 0
        self.error: BaseException | None = None

    def span(self, k: int) -> slice:
        lo = k * self.chunk_elems
        return slice(lo, min(lo + self.chunk_elems, self.size))

    def retarget(self, buf: np.ndarray) -> None:
        """Let the results still to come land in ``buf`` (flat, this op's size and
        storage dtype), and copy there the chunks that are already back."""
        old, self.recv = self.recv, buf
        if old is not buf:
            for k in range(self.nchunks):
                if self.got[k]:
                    buf[self.span(k)] = old[self.span(k)]

    def result(self) -> None:
        if self.error is not None:
            raise self.error


class SwitchGroup:
    """One joined group: its id at the switch, its window, and its chunk sequence."""

    def __init__(self, link: SwitchLink, gid: int, window: int, chunk_bytes: int):
        self.link, self.gid, self.window, self.chunk_bytes = link, gid, window, chunk_bytes
        self.seq = 0                                  # next chunk sequence, never reset
        self.ops: deque[SwitchOp] = deque()          # posted, not yet complete
        self.unsent: deque[SwitchOp] = deque()       # posted, chunks still to send
        self.inflight: dict[int, list] = {}          # seq -> [op, chunk, serial]

    def post(self, send: np.ndarray, recv: np.ndarray, dtype: DType, op: ReduceOp,
             header: bytes = b"", *, contribute: bool = True, want: bool = True) -> SwitchOp:
        """Queue ``recv[:] = switch-reduce(send)``; both flat, ``dtype``'s storage.
        ``send`` must not change until the op is done (a lost chunk is resent from it).
        A member that does not ``contribute`` only checks in (``send`` gives the size and
        is not read); one that does not ``want`` the result gets DONEs (``recv`` is not
        written): the multicast and reduce-scatter roles (``wire``)."""
        if send.size != recv.size:
            raise ValueError(f"send has {send.size} elements, recv {recv.size}")
        why = wire.check_call(op, dtype, send.nbytes, 2)
        if why is not None:
            raise ValueError(why)
        flags = (wire.PAYLOAD if contribute else 0) | (wire.WANT if want else 0)
        o = SwitchOp(self, send.reshape(-1), recv.reshape(-1), dtype, op, header, flags)
        if not o.done:
            self.ops.append(o)
            self.unsent.append(o)
            self.link.pump()
        return o


class SwitchLink:
    """An authenticated connection from one worker to its switch."""

    def __init__(self, address: str, token: str, timeout: float = 300.0):
        host, _, port = address.rpartition(":")
        self.address = address
        self.timeout = float(timeout)
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=min(timeout, 10.0))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.handshake(self.sock, token, address)
        except OSError as e:
            raise SwitchError(f"cannot reach the switch at {address}: {e}") from None
        self.sock.setblocking(False)
        self.groups: dict[int, SwitchGroup] = {}
        self.out: deque = deque()
        self.hdr = bytearray(FRAME.size + DATA.size)
        self.target = memoryview(self.hdr)[:FRAME.size]
        self.pos = 0
        self.phase = "frame"
        self.kind = self.body = 0
        self.landing: tuple | None = None    # the result chunk being received
        self.scratch = memoryview(bytearray(DEFAULT_CHUNK))
        self.error: BaseException | None = None
        self.joined: deque = deque()
        self.serial = 0          # the next DATA frame's serial
        self.last_tx = 0.0       # when the last DATA frame was queued
        self.probed = -1         # self.serial when we last probed
        self.retransmissions = 0
        self.probes = 0

    # ---- joining ---------------------------------------------------------------------

    def join(self, key: bytes, member: int, members: int, local_mask: int, *,
             window: int = DEFAULT_WINDOW, chunk_bytes: int = DEFAULT_CHUNK) -> SwitchGroup:
        """Join group ``key`` as ``member`` of ``members``; returns once it has formed
        (every member the switch tree serves has joined), or raises naming the switch."""
        if len(self.scratch) < chunk_bytes:
            self.scratch = memoryview(bytearray(chunk_bytes))
        body = JOIN.pack(key[:16].ljust(16, b"\0"), member, members, 1 << member,
                         local_mask | 1 << member, window, chunk_bytes)
        self._queue(wire.frame(Kind.JOIN, body))
        deadline = time.monotonic() + self.timeout
        while not self.joined:
            self._drive(deadline, f"forming group {key.hex()[:8]} (member {member} of "
                                  f"{members})", lambda: bool(self.joined))
        _, gid, win, chunk = self.joined.popleft()
        g = SwitchGroup(self, gid, win, chunk)
        self.groups[gid] = g
        return g

    def all_reduce(self, group: SwitchGroup, send: np.ndarray, recv: np.ndarray, dtype: DType,
                   op: ReduceOp, header: bytes = b"") -> None:
        o = group.post(send, recv, dtype, op, header)
        deadline = time.monotonic() + self.timeout
        while not o.done:
            self._drive(deadline, f"all_reduce of {send.nbytes} bytes", lambda: o.done)
        o.result()

    def _drive(self, deadline: float, what: str, done=lambda: False) -> None:
        self.poll()
        if done():  # what we wait for arrived, even if an error came in behind it
            return
        if self.error is not None:
            raise self.error
        left = deadline - time.monotonic()
        if left <= 0:
            err = SwitchError(f"switch {self.address} did not answer within "
                              f"{self.timeout:g} s while {what}")
            self._fail(err)
            raise err
        self.wait(min(left, 0.05))

    # ---- progress -------------------------------------------------------------------

    def pending(self) -> bool:
        return bool(self.out) or any(g.ops for g in self.groups.values())

    def wait_fds(self) -> list[tuple[int, int]]:
        mask = select.POLLIN | (select.POLLOUT if self.out else 0)
        return [(self.sock.fileno() if self.error is None else -1, mask)]

    def wait(self, timeout: float) -> None:
        if self.error is not None:
            return
        p = select.poll()
        for fd, mask in self.wait_fds():
            p.register(fd, mask)
        p.poll(max(0, int(min(timeout, self.next_timer()) * 1000)))

    def next_timer(self) -> float:
        """Seconds until this link wants to be polled again (its tail-loss probe)."""
        if self.probed == self.serial or not any(g.inflight for g in self.groups.values()):
            return 1.0
        return max(0.0, self.last_tx + PROBE_AFTER - time.monotonic())

    def poll(self) -> bool:
        if self.error is not None:
            return False
        moved = self._read()
        moved |= self.pump()
        if self.next_timer() == 0.0:
            self.probed = self.serial
            self.probes += 1
            self._queue(wire.frame(Kind.PROBE, PROBE.pack(self.serial)))
            self._flush()
        return moved

    def pump(self) -> bool:
        """Send every chunk the windows allow."""
        moved = False
        for g in self.groups.values():
            # chunk s may go only once s - window is back: it reuses that slot's set
            # (the next call's chunks follow the previous call's without waiting for
            # its results: calls pipeline through the window like slices do)
            while g.unsent and g.seq - g.window not in g.inflight:
                o = g.unsent[0]
                if o.next_chunk + 1 >= o.nchunks:
                    g.unsent.popleft()
                if o.first_seq < 0:
                    o.first_seq = g.seq
                k = o.next_chunk
                o.next_chunk += 1
                seq = g.seq
                g.seq += 1
                g.inflight[seq] = entry = [o, k, 0]
                self._send_chunk(g, entry, seq)
                moved = True
        return self._flush() or moved

    def _send_chunk(self, g: SwitchGroup, entry: list, seq: int) -> None:
        o, k = entry[0], entry[1]
        sl = o.span(k)
        part = o.send[sl].view(np.uint8) if o.flags & wire.PAYLOAD else _EMPTY
        entry[2] = self.serial
        head = FRAME.pack(Kind.DATA, DATA.size + part.nbytes) + \
            DATA.pack(g.gid, seq, self.serial, o.flags, o.dtype.code, o.op.code,
                      sl.stop - sl.start, o.header)
        self.serial += 1
        self.last_tx = time.monotonic()
        self._queue(head, memoryview(part))

    def _resend(self, first: int, last: int) -> None:
        """The switch lost the frames with serials first..last: send their chunks again."""
        for g in self.groups.values():
            for seq, entry in list(g.inflight.items()):
                if first <= entry[2] <= last:
                    self.retransmissions += 1
                    self._send_chunk(g, entry, seq)
        self._flush()

    def _queue(self, *parts: bytes | memoryview) -> None:
        self.out.extend(memoryview(p) if isinstance(p, bytes) else p for p in parts)

    def _flush(self) -> bool:
        try:
            return wire.send_queued(self.sock, self.out)
        except OSError as e:
            self._fail(SwitchError(f"lost the connection to the switch at "
                                   f"{self.address}: {e}"))
            return False

    def _read(self) -> bool:
        moved = False
        for _ in range(256):
            try:
                n = self.sock.recv_into(self.target[self.pos:])
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                n, why = 0, str(e)
            else:
                why = "it closed the connection"
            if n == 0:
                self._fail(SwitchError(f"lost the switch at {self.address}: {why}"))
                return moved
            moved = True
            self.pos += n
            if self.pos == len(self.target):
                self._advance()
                if self.error is not None:
                    return moved
        return moved

    def _want(self, view: memoryview, phase: str) -> None:
        self.target, self.pos, self.phase = view, 0, phase

    def _advance(self) -> None:
        if self.phase == "frame":
            self.kind, self.body = FRAME.unpack_from(self.hdr)
            if self.body > wire.max_body(max(len(self.scratch), DEFAULT_CHUNK)):
                self._fail(SwitchError(f"switch at {self.address} sent a frame of "
                                       f"{self.body} bytes"))
            elif self.kind == Kind.RESULT:
                self._want(memoryview(self.hdr)[:DATA.size], "data")
            else:
                self._want(memoryview(bytearray(self.body)), "body")
                if self.body == 0:
                    self._advance()
        elif self.phase == "data":
            self._result_header()
        elif self.phase == "payload":
            self._result_done()
        else:
            self._control(bytes(self.target))

    def _control(self, body: bytes) -> None:
        self._want(memoryview(self.hdr)[:FRAME.size], "frame")
        if self.kind == Kind.NACK and len(body) == NACK.size:
            first, last = NACK.unpack(body)
            if first <= last:
                self._resend(first, last)
        elif self.kind == Kind.JOINED and len(body) == JOINED.size:
            self.joined.append(JOINED.unpack(body))
        elif self.kind == Kind.ERROR:
            self._fail(SwitchError(f"switch at {self.address}: "
                                   f"{body.decode(errors='replace')}"))
        else:
            self._fail(SwitchError(f"switch at {self.address} sent frame kind "
                                   f"{self.kind} ({len(body)} bytes)"))

    def _result_header(self) -> None:
        gid, seq, _, _, _, _, _, _ = DATA.unpack_from(self.hdr)
        g = self.groups.get(gid)
        entry = g.inflight.get(seq) if g is not None else None
        nbytes = self.body - DATA.size
        if entry is None:  # not ours (any more): read and forget
            self.landing = None
            self._want(self.scratch[:nbytes], "payload")
        else:
            o, k = entry[0], entry[1]
            into = o.recv
            view = memoryview(into[o.span(k)].view(np.uint8)) if o.flags & wire.WANT \
                else _EMPTY
            if len(view) != nbytes:
                self._fail(SwitchError(f"switch at {self.address} returned {nbytes} bytes "
                                       f"for a {len(view)}-byte chunk"))
                return
            self.landing = (g, seq, o, k, into)
            self._want(view, "payload")
        if not nbytes:
            self._result_done()

    def _result_done(self) -> None:
        landing, self.landing = self.landing, None
        self._want(memoryview(self.hdr)[:FRAME.size], "frame")
        if landing is None:
            return
        g, seq, o, k, into = landing
        if g.inflight.pop(seq, None) is None:
            return
        if o.recv is not into and o.flags & wire.WANT:  # retargeted while it landed
            o.recv[o.span(k)] = into[o.span(k)]
        o.got[k] = 1
        o.done_chunks += 1
        if o.done_chunks == o.nchunks:
            o.done = True
            g.ops.remove(o)

    def _fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
        for g in self.groups.values():
            for o in g.ops:
                if not o.done:
                    o.error, o.done = err, True
            g.ops.clear()
            g.unsent.clear()
            g.inflight.clear()

    def close(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(0.5)
            self.sock.sendall(wire.frame(Kind.LEAVE))
        except OSError:
            pass
        self.sock.close()
        if self.error is None:
            self.error = SwitchError(f"link to the switch at {self.address} is closed")
