"""The state transfer's per-chunk checksum (CRC-32C where compiled) and its agreement
across ranks."""

from __future__ import annotations

import zlib

import numpy as np

from ringtree.errors import RecoveryError
from ringtree.resilience import checksum
from ringtree.testing import run_ranks


def _crc32c_reference(data: bytes) -> int:
    """Bit-at-a-time CRC-32C (reflected polynomial 0x82F63B78), RFC 3720 B.4."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_checksum_values():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 4099, dtype=np.uint8)
    for view in (data, data[3:], data[5:4000]):  # unaligned starts and odd lengths
        want = (_crc32c_reference(view.tobytes()) if checksum.ALGO == 1
                else zlib.crc32(view.tobytes()))
        assert checksum.chunk_sum(view) == (checksum.ALGO << 32) | want
    if checksum.ALGO == 1:
        assert checksum.chunk_sum(b"123456789") & 0xFFFFFFFF == 0xE3069283  # RFC 3720
    other = data.copy()
    other[100] ^= 1
    assert checksum.chunk_sum(other) != checksum.chunk_sum(data)
    assert not checksum.same_algorithm(1 << 32, 5) and checksum.same_algorithm(7, 5)


def mixed_install(comm):
    """Rank 0 checksums with zlib's CRC-32 (tag 0), the newcomer with CRC-32C (tag 1)."""
    import ringtree.resilience.transfer as transfer

    if comm.rank == 0:
        transfer.chunk_sum = lambda b: zlib.crc32(b)
    else:
        transfer.chunk_sum = lambda b: (1 << 32) | zlib.crc32(b)
    a = np.arange(1 << 16, dtype=np.float32) if comm.rank == 0 else np.zeros(1 << 16,
                                                                            np.float32)
    try:
        transfer.stream(comm, [a], [0], [1], chunk_bytes=64 << 10)
        return "no error"
    except RecoveryError as e:
        return str(e)


def test_a_mixed_install_is_an_error_on_every_rank():
    res = run_ranks(mixed_install, 2, timeout=60)
    for r, msg in enumerate(res):
        assert isinstance(msg, str) and f"rank {r}: state transfer" in msg, res
        assert "source rank 0 checksums with CRC-32 (zlib), rank 1 with CRC-32C" in msg, res

