"""Wire protocol of the rendezvous store: frames, codes, limits, errors, the HMAC."""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
from collections.abc import Iterable, Sequence
from enum import IntEnum

from ringtree.errors import RingtreeError

MAGIC = b"RTSTORE1"
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_FRAME_BYTES = 2 * MAX_VALUE_BYTES + (1 << 20)  # compare_set carries two values
MAX_HELLO_BYTES = 1024
HANDSHAKE_TIMEOUT = 30.0
_NONCE_BYTES = 32
_REPLY_MARGIN = 5.0  # extra client-side patience beyond a server-side deadline
_MAX_LISTED_KEYS = 8

_LEN = struct.Struct("!I")
_F64 = struct.Struct("!d")
_I64 = struct.Struct("!q")


class StoreError(RingtreeError):
    """The store failed or refused a request (the message says which store and why)."""


class StoreAuthError(StoreError):
    """The store and the client do not share the job token."""


class StoreTimeout(StoreError, TimeoutError):
    """A blocking store operation (or connecting to the store) ran out of time."""


class Op(IntEnum):
    HELLO = 1
    SET = 2
    GET = 3
    TRY_GET = 4
    ADD = 5
    WAIT = 6
    CHECK = 7
    DELETE = 8
    COMPARE_SET = 9


class Status(IntEnum):
    OK = 0
    VALUE = 1
    NOT_FOUND = 2
    TIMEOUT = 3
    ERROR = 4
    AUTH_FAILED = 5


# ---------------------------------------------------------------------------- framing


def _encode(code: int, fields: Sequence[bytes] = ()) -> bytes:
    parts = [b"", bytes((code,))]
    for f in fields:
        parts.append(_LEN.pack(len(f)))
        parts.append(f)
    body_len = sum(len(p) for p in parts)
    parts[0] = _LEN.pack(body_len)
    return b"".join(parts)


def _decode(body: bytes) -> tuple[int, list[bytes]]:
    if not body:
        raise ValueError("empty frame")
    code, pos, fields = body[0], 1, []
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated field header")
        (n,) = _LEN.unpack_from(body, pos)
        pos += 4
        if pos + n > len(body):
            raise ValueError("truncated field")
        fields.append(body[pos : pos + n])
        pos += n
    return code, fields


def _mac(key: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(key, role + server_nonce + client_nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("connection closed by the store")
        got += k
    return bytes(buf)


def _recv_frame(sock: socket.socket, limit: int) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, 4))
    if n > limit:
        raise StoreError(f"store sent a {n}-byte frame (limit {limit})")
    return _recv_exact(sock, n)


def _list_keys(keys: Iterable[str]) -> str:
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:_MAX_LISTED_KEYS])
    more = len(keys) - _MAX_LISTED_KEYS
    return shown + (f" (+{more} more)" if more > 0 else "")


# ---- request fields (decoded by the server) ------------------------------------------------

class BadRequest(Exception):
    """A malformed or invalid request: answered with an ERROR reply."""


def text_field(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("key is not valid UTF-8") from None


def key_field(fields: list[bytes], n: int) -> str:
    """The key of a request that must have ``n`` fields."""
    if len(fields) != n:
        raise BadRequest(f"expected {n} fields, got {len(fields)}")
    return text_field(fields[0])


def float_field(b: bytes) -> float:
    if len(b) != _F64.size:
        raise BadRequest("bad timeout field")
    return _F64.unpack(b)[0]


def int_field(b: bytes) -> int:
    if len(b) != _I64.size:
        raise BadRequest("bad integer field")
    return _I64.unpack(b)[0]
