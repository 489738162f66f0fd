"""A shared-memory ring: one (sender, receiver, channel) connection of the shm transport.

Layout of the segment (see :mod:`ringtree.transports.shm` for the protocol):

- page 0, int64 words: ``[0]`` magic, ``[1]`` slots, ``[2]`` slot bytes; then one cache
  line each for ``head`` (written by the sender only), ``tail`` (receiver only) and the
  two "wake me" flags ``RECV_WAITS`` (receiver) and ``SEND_WAITS`` (sender); from byte 1024
  one 64-byte descriptor per slot: the 32-byte message header, the message length, and
  the sender's address when the payload is to be read from its memory (0: in the slot).
- then ``nslots`` page-aligned slots of ``slot_bytes``.
"""

from __future__ import annotations

import platform
from collections import deque

import numpy as np

from ringtree.errors import PeerError
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_segment as seg
from ringtree.transports.base import HEADER_BYTES, HeaderMismatch, Request

CTRL_BYTES = 4096
DESC_OFF = 1024          # slot descriptors: 64 bytes each, after the counters
MAX_SLOTS = (CTRL_BYTES - DESC_OFF) // 64
HEAD, TAIL = 8, 16       # int64 word indices (cache lines 1 and 2)
RECV_WAITS, SEND_WAITS = 24, 32  # "wake me when head / tail moves" (lines 3 and 4)
MAGIC = 0x52544E47_53484D31
# x86-64 keeps stores in order (payload before head) and loads in order (head before
# payload). Elsewhere we fence around the counters: a best effort, as Python has no
# portable release/acquire (see shm_segment.fence).
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


class ViewRequest(Request):
    """A receive whose payload stays in the ring: ``buf`` is the slot once done; the
    caller must release it (:meth:`Ring.release`)."""

    __slots__ = ("ring", "seq")


class RingFailure(Exception):
    """The ring cannot go on: ``err`` for its requests; ``peer_wide`` if the whole peer
    is unusable (it died under a direct read), not just this connection."""

    def __init__(self, err: PeerError, peer_wide: bool):
        super().__init__(str(err))
        self.err, self.peer_wide = err, peer_wide


def ring_size(nslots: int, slot_bytes: int) -> int:
    return CTRL_BYTES + nslots * slot_bytes


def init_ring(nslots: int, slot_bytes: int):
    """The initialiser of a new ring segment (run before anyone else can map it)."""
    def init(a: np.ndarray) -> None:
        w = a[:CTRL_BYTES].view(np.int64)
        w[0], w[1], w[2] = MAGIC, nslots, slot_bytes
    return init


class Ring:
    """One end of a ring: the sender's (``push``) or the receiver's (``pull``)."""

    __slots__ = ("peer", "channel", "sending", "seg", "ctrl", "desc", "dwords", "slots",
                 "nslots", "slot_bytes", "count", "other", "q", "dead", "held", "waits",
                 "acks")

    def __init__(self, peer: int, channel: int, sending: bool, s: seg.Segment):
        self.peer, self.channel, self.sending, self.seg = peer, channel, sending, s
        self.ctrl = s.words(0, CTRL_BYTES)
        if self.ctrl[0] != MAGIC:
            raise RuntimeError(f"shared-memory ring {s.name} is not a ringtree ring")
        self.nslots, self.slot_bytes = int(self.ctrl[1]), int(self.ctrl[2])
        self.desc = memoryview(s.mm)[DESC_OFF:CTRL_BYTES]
        self.dwords = self.desc.cast("q")
        S = self.slot_bytes
        self.slots = [s.array[CTRL_BYTES + k * S:CTRL_BYTES + (k + 1) * S]
                      for k in range(self.nslots)]
        # sender: count = head, other = last tail seen; receiver: count = next slot to
        # read, other = last head seen, held = slots handed out as views, not released.
        self.count = int(self.ctrl[HEAD if sending else TAIL])
        self.other = int(self.ctrl[TAIL if sending else HEAD])
        self.q: deque[Request] = deque()
        self.dead: BaseException | None = None
        self.held: list[int] = []
        self.waits = False  # our interest flag (RECV_WAITS or SEND_WAITS) is set
        # sender: direct (CMA) sends the receiver has not read yet: (slot seq, request)
        self.acks: deque[tuple[int, Request]] = deque()

    @property
    def busy(self) -> bool:
        return bool(self.q or self.acks)

    def push(self, direct: int) -> bool:
        """Copy queued sends into free slots (or publish them for a direct read if
        ``direct`` and at least that large); complete direct sends that were read.
        True if anything moved (the receiver may want a wake-up)."""
        r = self
        q, ctrl, K, S = r.q, r.ctrl, r.nslots, r.slot_bytes
        head = r.count
        moved = False
        if r.acks:  # direct sends complete when the receiver has read them
            tail = r.other = ctrl[TAIL]
            while r.acks and r.acks[0][0] < tail:
                r.acks.popleft()[1].done = True
                moved = True
        while q:
            if head - r.other >= K:
                r.other = ctrl[TAIL]
                if head - r.other >= K:
                    if not r.waits:  # full: ask for a wake-up when the tail moves
                        r.waits = True
                        ctrl[SEND_WAITS] = 1
                        r.other = ctrl[TAIL]
                        continue
                    break
            req = q[0]
            k = head % K
            buf = req.buf
            nb, pos = buf.nbytes, req.pos
            if pos == 0:
                o = k << 6
                r.desc[o:o + HEADER_BYTES] = req.header
                r.dwords[(k << 3) + 4] = nb
                if direct and nb >= direct:  # the receiver reads it from our memory
                    r.dwords[(k << 3) + 5] = cma.address(buf)
                    r.acks.append((head, q.popleft()))
                    head += 1
                    ctrl[HEAD] = head
                    moved = True
                    continue
                r.dwords[(k << 3) + 5] = 0
            n = nb - pos if nb - pos < S else S
            if n:
                r.slots[k][:n] = buf[pos:pos + n]
            head += 1
            if not _TSO:
                seg.fence()
            ctrl[HEAD] = head
            moved = True
            pos += n
            req.pos = pos
            if pos >= nb:
                req.done = True
                q.popleft()
        r.count = head
        if r.waits and not q and not r.acks:
            r.waits = False
            ctrl[SEND_WAITS] = 0
        elif r.acks and not r.waits:  # wake us when the receiver has read them
            r.waits = True
            ctrl[SEND_WAITS] = 1
        return moved

    def pull(self, pid: int) -> tuple[bool, bool]:
        """Deliver arrived messages to queued receives (``pid``: the sender's, for
        direct reads). Returns (anything moved, tail moved: the sender may want a
        wake-up). Raises :class:`RingFailure`."""
        r = self
        q, K, S = r.q, r.nslots, r.slot_bytes
        rd = r.count
        moved = False
        while q:
            if rd >= r.other and not r._arrived(rd):
                break
            req = q[0]
            k = rd % K
            if type(req) is ViewRequest:  # always one slot: hand it out
                r._take_view(req, k, rd, pid)
                moved = True
                rd += 1
                q.popleft()
                continue
            pos, nb = req.pos, req.buf.nbytes
            if pos == 0:
                r._check_header(req, k, nb)
                # a direct message (always one slot) is read out of the sender's memory;
                # the address word is only meaningful in a message's first slot
                remote = r.dwords[(k << 3) + 5]
                if remote:
                    r._read_direct(pid, req.buf, remote, nb)
                    moved = True
                    rd += 1
                    req.pos = nb
                    req.done = True
                    q.popleft()
                    continue
            moved = True
            n = nb - pos if nb - pos < S else S
            if n:
                req.buf[pos:pos + n] = r.slots[k][:n]
            rd += 1
            pos += n
            req.pos = pos
            if pos >= nb:
                req.done = True
                q.popleft()
        if r.waits and not q:
            r.waits = False
            r.ctrl[RECV_WAITS] = 0
        tail_moved = False
        if moved:
            r.count = rd
            if not r.held:
                r.ctrl[TAIL] = rd
                tail_moved = True
        return moved, tail_moved

    def _arrived(self, rd: int) -> bool:
        """Has the sender published slot ``rd``? When not, ask for a wake-up and look
        once more (the Dekker handshake: a head that moves meanwhile is not missed)."""
        self.other = self.ctrl[HEAD]
        if rd >= self.other:
            if self.waits:
                return False
            self.waits = True
            self.ctrl[RECV_WAITS] = 1
            self.other = self.ctrl[HEAD]
            if rd >= self.other:
                return False
        if not _TSO:
            seg.fence()
        return True

    def _check_header(self, req: Request, k: int, nb: int) -> None:
        """The first slot of a message must carry the header and size ``req`` expects."""
        o = k << 6
        if self.desc[o:o + HEADER_BYTES] != req.header or self.dwords[(k << 3) + 4] != nb:
            got = bytes(self.desc[o:o + HEADER_BYTES])
            self.q.popleft().fail(HeaderMismatch(self.peer, req.header, got))
            raise RingFailure(PeerError(self.peer, f"rank {self.peer} sent a message that "
                                                   f"does not match (shm channel "
                                                   f"{self.channel})"), False)

    def _read_direct(self, pid: int, into: np.ndarray, remote: int, nb: int) -> None:
        try:
            cma.read_into(pid, into, remote, nb)
        except OSError as e:
            raise RingFailure(PeerError(
                self.peer, f"rank {self.peer} died or cannot be read ({e.strerror}; shm "
                           f"channel {self.channel})"), True) from None

    def _take_view(self, req: ViewRequest, k: int, rd: int, pid: int) -> None:
        """Hand slot ``k`` (message ``rd``) to a view receive; it stays held until
        :meth:`release`."""
        nb = req.seq  # the size until it arrives
        self._check_header(req, k, nb)
        remote = self.dwords[(k << 3) + 5]
        if remote:
            self._read_direct(pid, self.slots[k], remote, nb)
        req.buf = self.slots[k][:nb]
        req.seq, req.ring = rd, self
        self.held.append(rd)
        req.done = True

    def release(self, req: ViewRequest) -> bool:
        """Give back a slot handed out by a view receive; True if the tail moved."""
        if req.ring is None:
            return False
        req.ring = None
        self.held.remove(req.seq)
        tail = min(self.held) if self.held else self.count
        if tail != self.ctrl[TAIL]:
            self.ctrl[TAIL] = tail
            return True
        return False

