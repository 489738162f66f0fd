"""Aggregation slots: SwitchML's shadow-copy pool with a bitmap pair, in fixed member order.

A group (one communicator's part at one switch) owns ``window`` slots. Chunk sequence
number ``s`` (a per-group counter that is never reset) lands in slot ``s % window`` and
set ``(s // window) & 1``: consecutive uses of a slot alternate between its two sets, so
a slot's previous result stays intact for late retransmissions while the next round
fills the other set (Sapio et al., "Scaling Distributed Machine Learning with In-Network
Aggregation", NSDI'21, §4.3 and ``bitmap_checker.p4``).

A worker sends chunk ``s + window`` only after it received the result of chunk ``s``
(a self-clocked window), so when set x of a slot is reused for ``s + 2·window`` every
member has received the result of ``s``: nothing still needed is overwritten.

Exactly-once: each set keeps a bitmap of the units (connections) that contributed; a
contribution whose bit is already set is a retransmission and is never added again. If
the set is complete its result is sent back to that unit alone.

Determinism: contributions are kept per unit and reduced in unit order (units sorted by
the lowest member they cover) when the last one arrives, so the bits do not depend on
arrival order and are the same on every member and in every run. That costs
``units × chunk`` bytes per set; SwitchML sums in place because integer addition is
associative, floating point is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ringtree.dtypes import DType
from ringtree.ops import ReduceOp, Reducer
from ringtree.switch.wire import DATA, FRAME, PAYLOAD

ACCEPT, DUPLICATE, STALE = "accept", "duplicate", "stale"


class ProtocolError(Exception):
    """A unit broke the protocol (the message says how); its group is failed."""


class CallMismatch(ProtocolError):
    """Two members disagree on the call a chunk belongs to."""


@dataclass(slots=True)
class SlotSet:
    """One of a slot's two sets: the round it holds, who contributed, and the result."""

    seq: int = -1
    bitmap: int = 0
    payload: int = 0           # units that sent elements (the others checked in)
    want: int = 0              # units that want the result (the others get DONE)
    lost: int = 0              # units whose chunk was dropped (their next one is a resend)
    complete: bool = False     # reduced here (at a leaf: the partial is ready to go up)
    released: bool = False     # the final result is in ``result`` and went to the units
    dtype: DType | None = None
    op: ReduceOp | None = None
    nelem: int = 0
    header: bytes = b""
    first_unit: int = -1
    serial: int = -1           # a leaf's uplink: the serial the partial last went up with


@dataclass(slots=True)
class Unit:
    """A connection that joined a group, covering ``mask`` of the group's members."""

    conn: object
    mask: int
    member: int                # lowest member it covers: the reduction order


@dataclass
class Group:
    """One group's slots at one switch."""

    gid: int
    job: bytes
    key: bytes
    members: int
    expect: int                # the member mask that must join before the group forms
    window: int
    chunk_bytes: int
    units: list[Unit] = field(default_factory=list)
    formed: bool = False
    failed: str | None = None
    upgid: int = -1            # the group's id at the parent switch (a leaf's group)

    def __post_init__(self) -> None:
        self.sets = [[SlotSet(), SlotSet()] for _ in range(self.window)]
        self.buf: np.ndarray | None = None
        self.result = np.empty((self.window, 2, self.chunk_bytes), np.uint8)

    # ---- membership ------------------------------------------------------------------

    @property
    def covered(self) -> int:
        m = 0
        for u in self.units:
            m |= u.mask
        return m

    def add_unit(self, conn: object, mask: int, member: int) -> None:
        if mask & self.covered:
            raise ProtocolError(f"member {member} joined group twice")
        if mask & ~self.expect:
            raise ProtocolError(f"member {member} is not one this switch serves for the group")
        self.units.append(Unit(conn, mask, member))
        self.units.sort(key=lambda u: u.member)

    def form(self) -> None:
        """All expected members are here: allocate one row per unit and set."""
        self.formed = True
        self.buf = np.empty((self.window, 2, len(self.units), self.chunk_bytes), np.uint8)

    @property
    def goes_up(self) -> bool:
        """Some members are served by other switches: the partial goes to the parent."""
        return self.expect != (1 << self.members) - 1

    @property
    def full(self) -> int:
        return (1 << len(self.units)) - 1

    def unit_index(self, conn: object) -> int:
        for i, u in enumerate(self.units):
            if u.conn is conn:
                return i
        raise ProtocolError("connection is not a member of the group")

    # ---- a contribution ----------------------------------------------------------------

    def where(self, seq: int) -> tuple[int, int]:
        return seq % self.window, (seq // self.window) & 1

    def classify(self, unit: int, seq: int, dtype: DType, op: ReduceOp, nelem: int,
                 header: bytes) -> str:
        """What a DATA frame is, checked before its payload is read."""
        slot, x = self.where(seq)
        st = self.sets[slot][x]
        if nelem * dtype.itemsize > self.chunk_bytes or nelem <= 0:
            raise ProtocolError(f"chunk of {nelem} {dtype.value} does not fit "
                                f"{self.chunk_bytes}-byte slots")
        if st.seq == seq:
            if st.bitmap >> unit & 1:
                return DUPLICATE
            if (st.dtype, st.op, st.nelem, st.header) != (dtype, op, nelem, header):
                other = self.units[st.first_unit].member
                raise CallMismatch(_mismatch(other, st, self.units[unit].member,
                                             dtype, op, nelem, header))
            return ACCEPT
        first = slot + x * self.window
        if seq == (first if st.seq < 0 else st.seq + 2 * self.window):
            st.seq, st.bitmap, st.lost, st.complete, st.released = seq, 0, 0, False, False
            st.payload = st.want = 0
            st.dtype, st.op, st.nelem, st.header, st.first_unit = dtype, op, nelem, header, unit
            st.serial = -1
            return ACCEPT
        if seq < st.seq:
            return STALE
        raise ProtocolError(f"chunk {seq} from member {self.units[unit].member} is ahead "
                            f"of the window (slot {slot} holds {st.seq})")

    def row(self, unit: int, seq: int) -> memoryview:
        slot, x = self.where(seq)
        st = self.sets[slot][x]
        assert self.buf is not None
        return memoryview(self.buf[slot, x, unit, :st.nelem * st.dtype.itemsize])

    def commit(self, unit: int, seq: int, payload: bool = True, want: bool = True) -> bool:
        """Record unit's frame (its elements if ``payload``); True when this completes
        the set (then the contributions are reduced in unit order)."""
        slot, x = self.where(seq)
        st = self.sets[slot][x]
        st.bitmap |= 1 << unit
        st.payload |= payload << unit
        st.want |= want << unit
        if st.bitmap != self.full:
            return False
        assert self.buf is not None and st.dtype is not None
        st.complete = True
        if not st.payload:  # at a leaf: the elements come from members under another one
            if not self.goes_up:
                raise ProtocolError(f"chunk {seq}: every member checked in, none sent "
                                    f"elements")
            return True
        n = st.nelem * st.dtype.itemsize
        rows = [self.buf[slot, x, u, :n].view(st.dtype.storage) for u in range(len(self.units))
                if st.payload >> u & 1]
        out = self.result[slot, x, :n].view(st.dtype.storage)
        red = Reducer(st.op, st.dtype)
        if len(rows) == 1:
            out[...] = rows[0]
        else:
            red.combine(out, rows[0], rows[1])
            for r in rows[2:]:
                red.combine(out, out, r)
        st.complete = True
        return True

    def result_view(self, seq: int) -> memoryview:
        slot, x = self.where(seq)
        st = self.sets[slot][x]
        assert st.dtype is not None
        return memoryview(self.result[slot, x, :st.nelem * st.dtype.itemsize])

    def frame(self, kind: int, gid: int, seq: int, serial: int = 0, flags: int = PAYLOAD
              ) -> tuple[bytes, memoryview]:
        """The header and payload of the frame carrying set ``seq``'s result (only the
        header without ``PAYLOAD``: a DONE, or a check-in going up)."""
        st = self.state(seq)
        assert st.dtype is not None and st.op is not None
        view = self.result_view(seq) if flags & PAYLOAD else memoryview(b"")
        return FRAME.pack(kind, DATA.size + len(view)) + DATA.pack(
            gid, seq, serial, flags, st.dtype.code, st.op.code, st.nelem, st.header), view

    def state(self, seq: int) -> SlotSet:
        slot, x = self.where(seq)
        return self.sets[slot][x]


def _mismatch(a: int, st: SlotSet, b: int, dtype: DType, op: ReduceOp, nelem: int,
              header: bytes) -> str:
    for name, va, vb in (("dtype", st.dtype.value if st.dtype else None, dtype.value),
                         ("op", st.op.name if st.op else None, op.name),
                         ("elements", st.nelem, nelem)):
        if va != vb:
            return _pair(name, a, va, b, vb)
    return _pair("call header", a, st.header.hex(), b, header.hex())


def _pair(name: str, a: int, va: object, b: int, vb: object) -> str:
    """Both sides of a disagreement, lower member first (the same text on every member)."""
    if b < a:
        a, va, b, vb = b, vb, a, va
    return f"{name}: member {a} has {va}, member {b} has {vb}"


class SlotPool:
    """The switch's fixed budget of aggregation slots, shared by every group and job."""

    def __init__(self, slots: int):
        self.total = slots
        self.used = 0
        self.peak = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    def give(self, n: int) -> None:
        self.used -= n
