"""One peer connection of the switch: a worker, a child switch, or a leaf's uplink.

A connection reads frames into fixed targets (``want``): the frame header, a data
header, then the payload straight into the slot row it belongs to, so a chunk is never
copied on its way in. Everything it knows about loss recovery is two serials: the one
the peer's next DATA frame should carry (``expect``: a larger one means the frames in
between were lost) and, on an uplink, the one our next partial will carry.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections import deque

from ringtree.switch import wire
from ringtree.switch.wire import DATA, FRAME

AUTH_TIMEOUT = 10.0


class Conn:
    """A peer connection and the state of its frame reader."""

    def __init__(self, sock: socket.socket, addr: str, chunk_bytes: int, uplink: bool = False):
        self.sock, self.addr, self.uplink = sock, addr, uplink
        self.job: bytes | None = None
        self.token: str | None = None
        self.nonce = os.urandom(wire.NONCE_BYTES)
        self.deadline = time.monotonic() + AUTH_TIMEOUT
        self.hdr = bytearray(max(FRAME.size + DATA.size, wire.NONCE_BYTES + len(wire.MAGIC)))
        self.target: memoryview = memoryview(self.hdr)[:32]  # auth: the MAC
        self.pos = 0
        self.phase = "auth"
        self.kind = 0
        self.body = 0
        self.data: tuple | None = None   # (group, unit, seq, what) of the payload being read
        self.scratch = memoryview(bytearray(chunk_bytes))
        self.out: deque = deque()
        self.groups: set[int] = set()
        self.closed = False
        self.events = selectors.EVENT_READ
        self.expect = 0                  # serial of the peer's next DATA frame
        self.serial = 0                  # uplink: serial of our next partial
        self.last_tx = 0.0               # uplink: when the last partial went up
        self.probed = -1                 # uplink: self.serial when we last probed

    def want(self, view: memoryview, phase: str) -> None:
        self.target, self.pos, self.phase = view, 0, phase

    def next_frame(self) -> None:
        self.want(memoryview(self.hdr)[:FRAME.size], "frame")

    def gap(self, serial: int, probe: bool = False) -> tuple[int, int] | None:
        """A DATA frame with ``serial`` arrived (or a PROBE saying the next one will carry
        it): the serials lost before it, if any."""
        lost = (self.expect, serial - 1) if serial > self.expect else None
        self.expect = max(self.expect, serial if probe else serial + 1)
        return lost
