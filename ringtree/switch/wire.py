"""The switch's wire format: frames, the admission handshake and SHARP's limits.

Every frame is ``kind:u8 | body_len:u32 | body``; bodies are fixed layouts (struct) plus,
for data frames, the payload. Nothing a peer sends is trusted: lengths are bounded before
anything is allocated and every field is range-checked by the server.

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

MAGIC = b"RTSWTCH1"
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
# JOINED: group id, window, chunk bytes
JOINED = struct.Struct("!IHI")
# DATA / RESULT: group id, chunk sequence (never reset), dtype, op, element count, then
# the 32-byte call header (the fingerprint every member must agree on), then the payload
DATA = struct.Struct("!IQBBI32s")
CALL_HEADER_BYTES = 32


class Kind(IntEnum):
    JOIN = 1
    JOINED = 2
    DATA = 3
    RESULT = 4
    ERROR = 5
    LEAVE = 6


class SwitchError(RingtreeError):
    """The switch refused, failed or went away (the message names its address)."""


def mac(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def job_of(token: str) -> bytes:
    """A job's identity at the switch: a digest of its token (never the token itself)."""
    return hashlib.sha256(b"ringtree-switch-job\0" + token.encode()).digest()[:16]


def frame(kind: Kind, body: bytes | bytearray | memoryview = b"") -> bytes:
    return FRAME.pack(kind, len(body)) + bytes(body)


def send_queued(sock, out: deque) -> bool:
    """Write as much of ``out`` (a queue of memoryviews) as the socket takes now, without
    blocking; True if anything was written. OSError means the connection is gone."""
    moved = False
    while out:
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
