"""Switches in a tree: a leaf switch's side of its parent (SHARP's aggregation trees).

A leaf aggregates the members that use it into one partial per chunk and sends it up as
one contribution of the group at the parent, over one authenticated uplink per job; the
parent's result comes back down and is multicast to the leaf's members. The uplink
recovers losses like a worker (``wire``): every partial carries a fresh serial, the
parent NACKs the serials it lost, and a PROBE after ``PROBE_AFTER`` quiet seconds finds a
lost last partial.
"""

from __future__ import annotations

import selectors
import socket
import time
from typing import TYPE_CHECKING

from ringtree.switch import wire
from ringtree.switch.conn import Conn
from ringtree.switch.slots import Group, ProtocolError
from ringtree.switch.wire import JOIN, JOINED, NACK, PAYLOAD, PROBE, WANT, Kind

if TYPE_CHECKING:
    from ringtree.switch.server import SwitchServer

PROBE_AFTER = 0.004


class Parent:
    """The uplinks of a leaf switch to its parent at ``addr``."""

    def __init__(self, server: SwitchServer, addr: tuple[str, int]):
        self.server, self.addr = server, addr
        self.address = f"{addr[0]}:{addr[1]}"
        self.links: dict[bytes, Conn] = {}               # job -> uplink
        self.by_gid: dict[tuple[int, int], Group] = {}   # (id(uplink), parent gid) -> group

    def join(self, g: Group) -> None:
        """Every local member of ``g`` is here: join its group at the parent."""
        try:
            up = self._link(g.job)
        except (OSError, wire.SwitchError) as e:
            self.server.fail_group(g, f"cannot reach the parent switch {self.address}: {e}")
            return
        up.groups.add(g.gid)
        low = min(u.member for u in g.units)
        self.server.send(up, wire.frame(Kind.JOIN, JOIN.pack(
            g.key, low, g.members, g.expect, g.expect, g.window, g.chunk_bytes)))

    def _link(self, job: bytes) -> Conn:
        if job in self.links:
            return self.links[job]
        srv = self.server
        token = next(t for t in srv.tokens if wire.job_of(t) == job)
        sock = socket.create_connection(self.addr, timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.handshake(sock, token, self.address)
        sock.setblocking(False)
        conn = Conn(sock, self.address, srv.slot_bytes, uplink=True)
        conn.job, conn.token = job, token
        conn.next_frame()
        srv.sel.register(sock, selectors.EVENT_READ, conn)
        self.links[job] = conn
        return conn

    def joined(self, up: Conn, body: bytes) -> None:
        if len(body) != JOINED.size:
            raise ProtocolError("malformed JOINED")
        key, pgid, _, _ = JOINED.unpack(body)
        g = self.server.by_key.get((up.job, key))
        if g is None or g.gid not in up.groups or g.upgid >= 0 or not g.formed:
            raise ProtocolError("JOINED for no pending group")
        g.upgid = pgid
        self.by_gid[(id(up), pgid)] = g
        self.server.joined(g)

    def result_target(self, up: Conn, gid: int, seq: int, flags: int, nbytes: int
                      ) -> memoryview:
        """Where the parent's result for (gid, seq) lands: the set's result if we are
        waiting for it, else scratch (a duplicate)."""
        g = self.by_gid.get((id(up), gid))
        if g is None:
            raise ProtocolError("result for an unknown group")
        st = g.state(seq)
        fresh = st.seq == seq and st.complete and not st.released
        if fresh and st.want and not flags & PAYLOAD:
            raise ProtocolError(f"the parent sent no result for chunk {seq}, which a "
                                f"member wants")
        up.data = (g, -1, seq, fresh, flags)
        return g.result_view(seq) if fresh and nbytes else up.scratch[:nbytes]

    def send_up(self, g: Group, seq: int) -> None:
        up = self.links.get(g.job)
        if up is None or g.upgid < 0:
            return
        st = g.state(seq)
        st.serial = up.serial
        flags = (PAYLOAD if st.payload else 0) | (WANT if st.want else 0)
        head, view = g.frame(Kind.DATA, g.upgid, seq, up.serial, flags)
        up.serial += 1
        up.last_tx = time.monotonic()
        self.server.send(up, head, view)

    def control(self, up: Conn, kind: int, body: bytes) -> None:
        """A small frame from the parent."""
        if kind == Kind.JOINED:
            self.joined(up, body)
        elif kind == Kind.NACK and len(body) == NACK.size:
            first, last = NACK.unpack(body)
            for g in [g for g in self.server.groups.values() if g.gid in up.groups]:
                for pair in g.sets:
                    for st in pair:
                        if st.complete and not st.released and first <= st.serial <= last:
                            self.server.counters["uplink_retransmissions"] += 1
                            self.send_up(g, st.seq)
        elif kind == Kind.ERROR:
            msg = body.decode(errors="replace")
            for g in [g for g in self.server.groups.values() if g.gid in up.groups]:
                self.server.fail_group(g, f"parent switch {self.address}: {msg}")
        else:
            raise ProtocolError(f"unexpected frame kind {kind} from the parent")

    def probe(self, now: float) -> None:
        """A PROBE on every uplink that is quiet with partials outstanding."""
        for up in self.links.values():
            if up.probed == up.serial or now - up.last_tx < PROBE_AFTER:
                continue
            waiting = any(st.complete and not st.released for g in self.server.groups.values()
                          if g.gid in up.groups for pair in g.sets for st in pair)
            if waiting:
                up.probed = up.serial
                self.server.send(up, wire.frame(Kind.PROBE, PROBE.pack(up.serial)))

    def lost(self, conn: Conn) -> None:
        self.links = {j: c for j, c in self.links.items() if c is not conn}
        self.by_gid = {k: g for k, g in self.by_gid.items() if k[0] != id(conn)}
