"""The switch's wire format: frames, the admission handshake and SHARP's limits.

Every frame is ``kind:u8 | body_len:u32 | body``; bodies are fixed layouts (struct) plus,
for data frames, the payload. Nothing a peer sends is trusted: lengths are bounded before
anything is allocated and every field is range-checked by the server.

A chunk is complete when every member has sent its DATA frame for it. Members that
contribute send the elements (``PAYLOAD``); a member that only receives — a broadcast's
non-roots, an all-gather's other members — *checks in* with the header alone, which keeps
every member's window clocked by the same chunks. The result (the contributions reduced
in member order, or the one contribution: a multicast) goes to the members that set
``WANT``; the others get a DONE (a RESULT without payload): a reduce-scatter sends each
block to its owner only.

Loss recovery is by gap detection, not timers. Every DATA frame a connection sends carries
the next number of a per-connection *serial* (a retransmission gets a new one), and TCP
delivers frames in order, so a frame the switch lost (``--drop``) shows as a gap in the
serials of the next frame to arrive: the switch answers NACK(first, last) at once and
the sender resends exactly those chunks — TCP's fast retransmit with SACK ranges (RFC 2018)
carried by a NACK, as NACK-based reliable multicast does (RFC 5740). Only the last frame
before a sender falls silent has no successor; a sender that is still waiting a moment
after its last frame sends PROBE(next serial), which reveals that gap too (TCP's tail loss
probe, RFC 8985 §7) and is answered even when nothing is missing.

Admission is the store's HMAC challenge-response: the switch sends a random nonce, the
client answers ``HMAC-SHA256(token, nonce)``; the token never crosses the wire. The
switch holds the tokens of the jobs it serves (``--token``/``--token-file``), learns which
job a client belongs to from the token that verifies, and keys every group by that job,
so two jobs never share a slot even when they use the same group names.

Limits follow the NCCL SHARP plugin and SHARP's documentation (``sharp_plugin.c``:
``reduceSupport`` accepts SUM, MAX and MIN; fp16/fp32/fp64/int32/uint32/int64/uint64 plus
bf16/int8/uint8 with SHARP v3; ``maxCollBytes`` 512 MiB; SwitchML's 32-bit worker bitmap
gives the group-size bound of 32).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections import deque
from enum import IntEnum

from ringtree.dtypes import DType
from ringtree.errors import RingtreeError
from ringtree.ops import ReduceOp

MAGIC = b"RTSWTCH2"
NONCE_BYTES = 32
MAX_MEMBERS = 32                      # SwitchML's worker bitmap is 32 bits
MAX_MESSAGE_BYTES = 512 << 20         # the SHARP plugin's maxCollBytes
MAX_ERROR_BYTES = 4096
SUPPORTED_OPS = (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX)
SUPPORTED_DTYPES = tuple(DType)       # SHARP v3's list: every ringtree dtype
OPS_BY_CODE = {o.code: o for o in SUPPORTED_OPS}
DTYPES_BY_CODE = {d.code: d for d in SUPPORTED_DTYPES}

FRAME = struct.Struct("!BI")          # kind, body length
# JOIN: group key (16 B), member index, members, member mask this unit covers, mask of
# the members that use the same switch, window (chunks in flight), chunk bytes
JOIN = struct.Struct("!16sHHIIHI")
# JOINED: group key, group id, window, chunk bytes
JOINED = struct.Struct("!16sIHI")
# DATA / RESULT: group id, chunk sequence (never reset), the sender's serial (0 in a
# RESULT), flags, dtype, op, element count, then the 32-byte call header (the fingerprint
# every member must agree on), then the payload (only with PAYLOAD set)
DATA = struct.Struct("!IQIBBBI32s")
PAYLOAD = 1   # the frame carries the chunk's elements (else: DATA checks in, RESULT is DONE)
WANT = 2      # DATA: the sender wants the result (else it gets a DONE)
PROBE = struct.Struct("!I")           # the serial the sender's next DATA frame will carry
NACK = struct.Struct("!II")           # serials first..last were lost (first > last: none)
CALL_HEADER_BYTES = 32


class Kind(IntEnum):
    JOIN = 1
    JOINED = 2
    DATA = 3
    RESULT = 4
    ERROR = 5
    LEAVE = 6
    PROBE = 7
    NACK = 8


class SwitchError(RingtreeError):
    """The switch refused, failed or went away (the message names its address)."""


def mac(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def job_of(token: str) -> bytes:
    """A job's identity at the switch: a digest of its token (never the token itself)."""
    return hashlib.sha256(b"ringtree-switch-job\0" + token.encode()).digest()[:16]


def frame(kind: Kind, body: bytes | bytearray | memoryview = b"") -> bytes:
    return FRAME.pack(kind, len(body)) + bytes(body)


def recv_exact(sock, n: int) -> bytes:
    """``n`` bytes from a blocking socket (the handshake); OSError if it closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed during the handshake")
        buf += chunk
    return bytes(buf)


def handshake(sock, token: str, address: str) -> None:
    """The client's side of admission on a blocking socket: read the greeting, answer
    the nonce with the token's MAC. SwitchError names ``address`` if it is no switch."""
    hello = recv_exact(sock, len(MAGIC) + NONCE_BYTES)
    if not hello.startswith(MAGIC):
        raise SwitchError(f"{address} is not a ringtree switch (or a different version)")
    sock.sendall(mac(token, hello[len(MAGIC):]))


def send_queued(sock, out: deque) -> bool:
    """Write as much of ``out`` (a queue of memoryviews) as the socket takes now, without
    blocking; True if anything was written. OSError means the connection is gone."""
    moved = False
    while out:
        if not len(out[0]):  # an empty part (a frame without payload) is written already
            out.popleft()
            continue
        try:
            n = sock.sendmsg(list(out)[:64])
        except (BlockingIOError, InterruptedError):
            break
        moved = True
        while n and out:
            head = out[0]
            if n >= len(head):
                n -= len(head)
                out.popleft()
            else:
                out[0] = head[n:]
                n = 0
    return moved


def max_body(chunk_bytes: int) -> int:
    """Largest legal body for a connection whose chunks are at most ``chunk_bytes``."""
    return max(JOIN.size, DATA.size + chunk_bytes, MAX_ERROR_BYTES)


def check_call(op: ReduceOp | None, dtype: DType, nbytes: int, members: int) -> str | None:
    """Why the switch cannot serve this call, or None. Used by the tuner's fallback too."""
    if op not in SUPPORTED_OPS:
        name = op.name if op is not None else "a user-defined op"
        return f"the switch reduces SUM, MIN and MAX only, not {name}"
    if dtype not in SUPPORTED_DTYPES:
        return f"the switch does not reduce {dtype.value}"
    if nbytes > MAX_MESSAGE_BYTES:
        return f"{nbytes} bytes exceeds the switch's message limit of {MAX_MESSAGE_BYTES}"
    if not 2 <= members <= MAX_MEMBERS:
        return f"a switch group has 2..{MAX_MEMBERS} members, not {members}"
    return None
