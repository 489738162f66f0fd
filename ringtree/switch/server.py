"""The aggregation switch: one process, one event loop, a fixed pool of slots.

Workers (or child switches) connect over TCP, prove their job's token, and JOIN a group
(one communicator's part); once every member the switch serves for that group has
joined, the group gets ``window`` slots from the pool and each member streams DATA chunks
into them. When a slot set's last contribution arrives, the switch reduces it in member
order (``slots.py``) and sends the RESULT to every member, or, at a leaf switch with a
parent, sends the partial up as one contribution and multicasts the parent's result when
it comes back (SHARP's aggregation trees: leaves aggregate their hosts, a spine the
leaves).

Nothing from the network is trusted: frame lengths are bounded by the slot size before a
byte is buffered, every id is checked against the connection's own job, and a client that
breaks the protocol loses its connection and its group, never another job's slots.
``drop`` discards a seeded fraction of received chunks before they are counted, to
exercise loss recovery: a gap in a connection's serials is NACKed at once (``wire``).
"""

from __future__ import annotations

import random
import selectors
import socket
import time

from ringtree.switch import wire
from ringtree.switch.conn import Conn
from ringtree.switch.slots import ACCEPT, DUPLICATE, CallMismatch, Group, ProtocolError, SlotPool
from ringtree.switch.tree import PROBE_AFTER, Parent
from ringtree.switch.wire import DATA, FRAME, JOIN, JOINED, NACK, PAYLOAD, PROBE, WANT, Kind


class SwitchServer:
    def __init__(self, host: str, port: int, tokens: list[str], *, slots: int = 256,
                 slot_bytes: int = 256 << 10, drop: float = 0.0, seed: int = 0,
                 parent: tuple[str, int] | None = None):
        if not tokens:
            raise ValueError("the switch needs at least one job token (--token/--token-file)")
        if not 0.0 <= drop < 1.0:
            raise ValueError(f"drop must be in [0, 1), got {drop}")
        self.tokens = list(dict.fromkeys(tokens))
        self.slot_bytes = int(slot_bytes)
        self.pool = SlotPool(int(slots))
        self.drop = float(drop)
        self.rng = random.Random(seed)
        self.parent = Parent(self, parent) if parent is not None else None
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.create_server((host, port), backlog=256, reuse_port=False)
        self.lsock.setblocking(False)
        self.address = _fmt(self.lsock.getsockname())
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.groups: dict[int, Group] = {}
        self.by_key: dict[tuple[bytes, bytes], Group] = {}
        self.next_gid = 1
        self.running = True
        self.counters = {"connections": 0, "refused_clients": 0, "protocol_errors": 0,
                         "groups": 0, "chunks_in": 0, "chunks_out": 0, "bytes_in": 0,
                         "bytes_out": 0, "retransmissions": 0, "duplicates": 0, "nacks": 0, "probes": 0,
                         "stale": 0, "dropped": 0, "results": 0, "uplink_retransmissions": 0}

    # ---- the loop ------------------------------------------------------------------

    def serve_forever(self) -> None:
        while self.running:
            timeout = 0.25 if self.parent is None or not self.parent.links else PROBE_AFTER
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._accept()
                    continue
                conn: Conn = key.data
                if mask & selectors.EVENT_WRITE and not conn.closed:
                    self._flush(conn)
                if mask & selectors.EVENT_READ and not conn.closed:
                    self._read(conn)
            self._timers()

    def stop(self) -> None:
        self.running = False

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            if key.data is not None:
                self._close(key.data, None)
        self.sel.close()
        self.lsock.close()

    def report(self) -> str:
        c = dict(self.counters, slots_used=self.pool.used, slots_peak=self.pool.peak,
                 slots_total=self.pool.total)
        return f"ringtree switch {self.address}: " + ", ".join(f"{k}={v}" for k, v in c.items())

    # ---- connections ----------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, addr = self.lsock.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Conn(sock, _fmt(addr), self.slot_bytes)
        self.counters["connections"] += 1
        self.sel.register(sock, selectors.EVENT_READ, conn)
        self.send(conn, wire.MAGIC + conn.nonce)

    def _close(self, conn: Conn, why: str | None) -> None:
        if conn.closed:
            return
        if why is not None:
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(0.2)
                conn.sock.sendall(wire.frame(Kind.ERROR, why.encode()[:wire.MAX_ERROR_BYTES]))
            except OSError:
                pass
        conn.closed = True
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        for gid in list(conn.groups):
            g = self.groups.get(gid)
            if g is not None:
                who = "the parent switch" if conn.uplink else f"member {_member_of(g, conn)} " \
                    f"({conn.addr})"
                self.fail_group(g, f"{who} left group {g.key.hex()[:8]}")
        if conn.uplink and self.parent is not None:
            self.parent.lost(conn)

    def _timers(self) -> None:
        now = time.monotonic()
        for key in list(self.sel.get_map().values()):
            conn = key.data
            if conn is not None and conn.phase == "auth" and now > conn.deadline:
                self.counters["refused_clients"] += 1
                self._close(conn, None)
        if self.parent is not None:
            self.parent.probe(now)

    # ---- reading --------------------------------------------------------------------

    def _read(self, conn: Conn) -> None:
        for _ in range(64):  # bounded work per wakeup, so one sender cannot starve others
            try:
                n = conn.sock.recv_into(conn.target[conn.pos:])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                n = 0
            if n == 0:
                self._close(conn, None)
                return
            conn.pos += n
            if conn.pos < len(conn.target):
                continue
            try:
                self._advance(conn)
            except CallMismatch as e:
                self.counters["protocol_errors"] += 1
                for gid in list(conn.groups):
                    if gid in self.groups:
                        self.fail_group(self.groups[gid], f"mismatched call: {e}")
                self._close(conn, f"mismatched call: {e}")
                return
            except ProtocolError as e:
                self.counters["protocol_errors"] += 1
                self._close(conn, str(e))
                return
            if conn.closed:
                return

    def _advance(self, conn: Conn) -> None:
        if conn.phase == "auth":
            self._authenticate(conn)
        elif conn.phase == "frame":
            conn.kind, conn.body = FRAME.unpack_from(conn.hdr)
            limit = wire.max_body(self.slot_bytes)
            if conn.body > limit:
                raise ProtocolError(f"frame of {conn.body} bytes exceeds the limit of {limit}")
            if conn.kind in (Kind.DATA, Kind.RESULT):
                if conn.body < DATA.size:
                    raise ProtocolError("truncated data frame")
                conn.want(memoryview(conn.hdr)[:DATA.size], "data")
            elif conn.kind in (Kind.JOIN, Kind.JOINED, Kind.ERROR, Kind.LEAVE, Kind.PROBE,
                               Kind.NACK):
                conn.want(memoryview(bytearray(conn.body)), "body")
                if conn.body == 0:
                    self._body(conn)
            else:
                raise ProtocolError(f"unknown frame kind {conn.kind}")
        elif conn.phase == "data":
            self._data_header(conn)
        elif conn.phase == "payload":
            self._payload_done(conn)
        elif conn.phase == "body":
            self._body(conn)

    def _authenticate(self, conn: Conn) -> None:
        got = bytes(conn.target)
        for t in self.tokens:
            if wire.hmac.compare_digest(got, wire.mac(t, conn.nonce)):
                conn.token, conn.job = t, wire.job_of(t)
                conn.next_frame()
                return
        self.counters["refused_clients"] += 1
        raise ProtocolError("refused: the client does not hold a job token this switch serves")

    def _body(self, conn: Conn) -> None:
        body = bytes(conn.target)
        kind = conn.kind
        conn.next_frame()
        if kind == Kind.LEAVE:
            self._close(conn, None)
        elif conn.uplink and self.parent is not None:
            self.parent.control(conn, kind, body)
        elif kind == Kind.JOIN:
            self._join(conn, body)
        elif kind == Kind.PROBE and len(body) == PROBE.size:
            self.counters["probes"] += 1
            self._nack(conn, conn.gap(PROBE.unpack(body)[0], probe=True) or (1, 0))
        else:
            raise ProtocolError(f"unexpected frame kind {kind}")

    def _nack(self, conn: Conn, lost: tuple[int, int]) -> None:
        self.counters["nacks"] += lost[0] <= lost[1]
        self.send(conn, wire.frame(Kind.NACK, NACK.pack(*lost)))

    # ---- groups --------------------------------------------------------------------

    def _join(self, conn: Conn, body: bytes) -> None:
        if len(body) != JOIN.size:
            raise ProtocolError("malformed JOIN")
        key, member, members, mask, local, window, chunk = JOIN.unpack(body)
        full = (1 << members) - 1 if 0 < members <= wire.MAX_MEMBERS else 0
        if not 2 <= members <= wire.MAX_MEMBERS:
            raise ProtocolError(f"a switch group has 2..{wire.MAX_MEMBERS} members, "
                                f"not {members}")
        if not mask or mask & ~full or not local & mask or local & ~full:
            raise ProtocolError(f"member masks {mask:#x}/{local:#x} do not fit {members} members")
        if not 1 <= window <= 1024 or not 0 < chunk <= self.slot_bytes:
            raise ProtocolError(f"window {window} / chunk {chunk} B outside this switch's "
                                f"limits (1..1024 chunks of at most {self.slot_bytes} B)")
        assert conn.job is not None
        g = self.by_key.get((conn.job, key))
        if g is None:
            expect = local if self.parent is not None else full
            g = Group(self.next_gid, conn.job, key, members, expect, window, chunk)
            self.next_gid += 1
            self.groups[g.gid] = g
            self.by_key[(conn.job, key)] = g
            self.counters["groups"] += 1
        elif g.formed:
            raise ProtocolError(f"group {key.hex()[:8]} already formed")
        elif (g.members, g.window, g.chunk_bytes) != (members, window, chunk):
            raise ProtocolError(f"member {member} joins group {key.hex()[:8]} with "
                                f"{members} members/{window}/{chunk} B, others with "
                                f"{g.members}/{g.window}/{g.chunk_bytes} B")
        g.add_unit(conn, mask, member)
        conn.groups.add(g.gid)
        if g.covered == g.expect:
            self._form(g)

    def _form(self, g: Group) -> None:
        if not self.pool.take(g.window):
            self.fail_group(g, f"switch {self.address} is out of aggregation slots "
                               f"({self.pool.used} of {self.pool.total} in use)")
            return
        g.form()
        if g.goes_up and self.parent is not None:
            self.parent.join(g)
        else:
            self.joined(g)

    def joined(self, g: Group) -> None:
        """``g`` is ready (here and, at a leaf, at the parent): tell its members."""
        for u in g.units:
            self.send(u.conn, wire.frame(Kind.JOINED, JOINED.pack(g.key, g.gid, g.window,
                                                                  g.chunk_bytes)))

    def fail_group(self, g: Group, why: str) -> None:
        if self.groups.pop(g.gid, None) is None:
            return
        self.by_key.pop((g.job, g.key), None)
        if g.formed:
            self.pool.give(g.window)
        g.failed = why
        for u in g.units:
            u.conn.groups.discard(g.gid)
            if not u.conn.closed:
                self.send(u.conn, wire.frame(Kind.ERROR, why.encode()[:wire.MAX_ERROR_BYTES]))
        if self.parent is not None:
            up = self.parent.links.get(g.job)
            if up is not None:
                up.groups.discard(g.gid)
                self.parent.by_gid.pop((id(up), g.upgid), None)

    # ---- data ----------------------------------------------------------------------

    def _data_header(self, conn: Conn) -> None:
        gid, seq, serial, flags, dcode, ocode, nelem, header = DATA.unpack_from(conn.hdr)
        dtype, op = wire.DTYPES_BY_CODE.get(dcode), wire.OPS_BY_CODE.get(ocode)
        if dtype is None or op is None:
            raise ProtocolError(f"the switch does not reduce dtype code {dcode} / op code "
                                f"{ocode} (SUM, MIN, MAX on SHARP's dtypes only)")
        nbytes = conn.body - DATA.size
        if nbytes != (nelem * dtype.itemsize if flags & PAYLOAD else 0):
            raise ProtocolError("data frame length does not match its element count")
        if conn.uplink and self.parent is not None:  # the parent's result
            view = self.parent.result_target(conn, gid, seq, flags, nbytes)
        else:
            g = self.groups.get(gid)
            if g is None or g.job != conn.job or gid not in conn.groups or not g.formed:
                raise ProtocolError(f"group {gid} is not one this connection joined")
            unit = g.unit_index(conn)
            what = g.classify(unit, seq, dtype, op, nelem, header)
            self.counters["chunks_in"] += 1
            self.counters["bytes_in"] += nbytes
            if self.drop and self.rng.random() < self.drop:
                what = "dropped"  # lost on the way in: as if never received
            else:
                lost = conn.gap(serial)
                if lost is not None:
                    self._nack(conn, lost)
            conn.data = (g, unit, seq, what, flags)
            view = g.row(unit, seq) if what == ACCEPT and flags & PAYLOAD else \
                conn.scratch[:nbytes]
        conn.want(view, "payload")
        if not nbytes:
            self._payload_done(conn)

    def _payload_done(self, conn: Conn) -> None:
        assert conn.data is not None
        g, unit, seq, what, flags = conn.data
        conn.data = None
        conn.next_frame()
        if g.gid not in self.groups:
            return
        if unit < 0:  # the parent's result
            if what:
                self._release(g, seq)
            return
        st = g.state(seq)
        if what == ACCEPT:
            self.counters["retransmissions"] += st.lost >> unit & 1
            if g.commit(unit, seq, bool(flags & PAYLOAD), bool(flags & WANT)):
                if g.goes_up and self.parent is not None:
                    self.parent.send_up(g, seq)
                else:
                    self._release(g, seq)
        elif what == DUPLICATE:
            self.counters["duplicates"] += 1
            if st.released:
                self._send_result(g, unit, seq)
        elif what == "dropped":
            self.counters["dropped"] += 1
            if st.seq == seq:
                st.lost |= 1 << unit
        else:
            self.counters["stale"] += 1

    def _release(self, g: Group, seq: int) -> None:
        g.state(seq).released = True
        self.counters["results"] += 1
        for unit in range(len(g.units)):
            self._send_result(g, unit, seq)

    def _send_result(self, g: Group, unit: int, seq: int) -> None:
        """The result to a unit that wants it, else a DONE."""
        flags = PAYLOAD if g.state(seq).want >> unit & 1 else 0
        head, view = g.frame(Kind.RESULT, g.gid, seq, flags=flags)
        self.counters["chunks_out"] += 1
        self.counters["bytes_out"] += len(view)
        self.send(g.units[unit].conn, head, view)

    # ---- writing -------------------------------------------------------------------

    def send(self, conn: Conn, *parts: bytes | memoryview) -> None:
        if conn.closed:
            return
        conn.out.extend(memoryview(p) if isinstance(p, bytes) else p for p in parts)
        self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        try:
            wire.send_queued(conn.sock, conn.out)
        except OSError:
            self._close(conn, None)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        if events != conn.events:
            conn.events = events
            try:
                self.sel.modify(conn.sock, events, conn)
            except (KeyError, ValueError):
                pass


def _fmt(addr: tuple) -> str:
    return f"{addr[0]}:{addr[1]}"


def _member_of(g: Group, conn: Conn) -> int:
    for u in g.units:
        if u.conn is conn:
            return u.member
    return -1
