"""The message header: 32 bytes in front of every payload, the call's fingerprint.

Layout (little-endian, ``<QQIIBBBBi``)::

    nbytes  u64   payload bytes of this message (one slice)
    count   u64   elements per block of the call
    seq     u32   the call's sequence number (per communicator; per (peer, tag) for p2p)
    algo    u32   the algorithm's code (:func:`algo_code`)
    coll    u8    collective code (:mod:`ringtree.ir.collectives`; 200 = send/recv)
    dtype   u8    dtype code
    op      u8    reduction op code (255 = a user op; 0 when nothing reduces)
    flags   u8    the protocol: 0 Simple (framed messages), 1 LL (a shared segment's line)
    root    i32   root rank (the tag for p2p; -1 when there is none)

The receiver names the header it expects; a transport compares the 32 bytes before a byte
of payload lands in user memory, and :meth:`WireHeader.describe_difference` turns a
mismatch into the sentence a :class:`~ringtree.errors.MismatchError` carries. Everything
after ``nbytes`` is fixed for a call (:meth:`WireHeader.call_part`), so framing a slice is
one 8-byte pack and a concatenation.

The call part is also the whole identity of a call elsewhere: the LL protocol packs it into
every line it publishes (:meth:`WireHeader.call_words`, three 64-bit words), and a rank
stalled inside a call writes it to the store for the others to compare
(:mod:`ringtree.runtime.fingerprint`). Every mismatch message is
:meth:`WireHeader.describe_difference`'s.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

_LAYOUT = struct.Struct("<QQIIBBBBi")
_NBYTES = struct.Struct("<Q")
_WORDS = struct.Struct("<3Q")
P2P_CODE = 200
USER_OP = 255
PROTO_SIMPLE, PROTO_LL = 0, 1
PROTO_NAMES = ("Simple", "LL")

_FIELDS = ("message bytes", "count", "sequence number", "algorithm", "collective", "dtype",
           "op", "protocol", "root")


P2P_ALGO = 1  # the algorithm code of send/recv
_ALGO_NAMES: dict[int, str] = {P2P_ALGO: "p2p"}


def algo_code(name: str) -> int:
    """The 32-bit wire code of an algorithm name: the same on every rank, from the name
    alone (CRC-32 with the top bit set; ``p2p`` is 1). Every name encoded here, and every
    algorithm the registry holds, is decoded by :func:`algo_name`."""
    if name == "p2p":
        return P2P_ALGO
    code = zlib.crc32(name.encode()) | 0x80000000
    _ALGO_NAMES.setdefault(code, name)
    return code


def algo_name(code: int) -> str:
    """The algorithm a wire code stands for, as far as this process has met it."""
    return _ALGO_NAMES.get(code, f"an unknown algorithm (code {code:#x})")


class WireHeader(NamedTuple):
    nbytes: int
    count: int
    seq: int
    algo: int
    coll: int
    dtype: int
    op: int
    flags: int
    root: int

    SIZE = _LAYOUT.size

    def pack(self) -> bytes:
        return _LAYOUT.pack(self.nbytes, self.count, self.seq & 0xFFFFFFFF, self.algo,
                            self.coll, self.dtype, self.op & 0xFF, self.flags, self.root)

    def call_part(self) -> bytes:
        """The header without ``nbytes``: what every message of the call shares."""
        return self.pack()[_NBYTES.size:]

    def call_words(self) -> tuple[int, int, int]:
        """The call part as three little-endian 64-bit words (an LL line's header; the
        sequence number is the low half of the second word)."""
        return _WORDS.unpack(self.call_part())

    @classmethod
    def from_call_words(cls, words) -> WireHeader:
        """The header whose :meth:`call_words` are ``words`` (``nbytes`` 0)."""
        return cls.unpack(_NBYTES.pack(0) + _WORDS.pack(*(int(w) for w in words)))

    @staticmethod
    def frame(nbytes: int, call_part: bytes) -> bytes:
        """The header of one message of ``nbytes`` payload bytes."""
        return _NBYTES.pack(nbytes) + call_part

    @staticmethod
    def payload_bytes(raw: bytes) -> int:
        return _NBYTES.unpack_from(raw)[0]

    @classmethod
    def unpack(cls, raw: bytes) -> WireHeader:
        return cls(*_LAYOUT.unpack(raw))

    def describe_difference(self, theirs: WireHeader, me: int, peer: int) -> list[str]:
        """``"count: rank 1 has 12, rank 0 has 10"`` for every field that differs (the
        message size only when nothing else explains it), values by name."""
        diffs = [f"{name}: rank {peer} has {_show(i, t)}, rank {me} has {_show(i, m)}"
                 for i, (name, m, t) in enumerate(zip(_FIELDS, self, theirs)) if m != t]
        if len(diffs) > 1:  # a different count explains a different message size
            diffs = [d for d in diffs if not d.startswith("message bytes")]
        return diffs


def _show(field: int, value: int) -> object:
    """A header field's value by name where it has one."""
    from ringtree.dtypes import DType
    from ringtree.ir.collectives import BY_CODE
    from ringtree.ops import ReduceOp

    if field == 4:
        return "send/recv" if value == P2P_CODE else \
            BY_CODE[value].value if value < len(BY_CODE) else value
    if field == 5:
        dts = list(DType)
        return dts[value].value if value < len(dts) else value
    if field == 6:
        ops = list(ReduceOp)
        return "user op" if value == USER_OP else ops[value].value if value < len(ops) else value
    if field == 3:
        return algo_name(value)
    if field == 7:
        return PROTO_NAMES[value] if value < len(PROTO_NAMES) else value
    return value
