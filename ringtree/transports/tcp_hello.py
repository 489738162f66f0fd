"""The hello a TCP link opens with: which communicator it is for, who sends it on which
channel, and an HMAC-SHA256 (RFC 2104) of those under the job's secret.

An accepting rank reads exactly one hello before anything else and sorts it
(:func:`verdict`): ``"ours"`` (this communicator, a valid MAC: the link is taken),
``"stale"`` (a valid MAC for *another* communicator id of the job — an older epoch's link
after a shrink or replace, say: dropped unread and counted), or ``"foreign"`` (anything
else: dropped unread).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

MAGIC = b"RTc1"
HELLO = struct.Struct("<4s16sII16s")


def mac(secret: bytes, comm_id: bytes, rank: int, channel: int) -> bytes:
    msg = comm_id + struct.pack("<II", rank, channel)
    return hmac.new(secret, msg, hashlib.sha256).digest()[:16]


def hello(secret: bytes, comm_id: bytes, rank: int, channel: int) -> bytes:
    return HELLO.pack(MAGIC, comm_id, rank, channel, mac(secret, comm_id, rank, channel))


def verdict(raw: bytes, secret: bytes, comm_id: bytes, npeers: int) -> tuple[str, int, int]:
    """(``"ours"`` / ``"stale"`` / ``"foreign"``, sender's rank, channel) of a hello."""
    magic, cid, peer, channel, got = HELLO.unpack(raw)
    if magic != MAGIC or peer >= npeers or \
            not hmac.compare_digest(got, mac(secret, cid, peer, channel)):
        return "foreign", peer, channel
    return ("ours" if cid == comm_id else "stale"), peer, channel
