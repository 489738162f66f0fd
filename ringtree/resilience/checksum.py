"""Per-chunk checksums of the state transfer: CRC-32C where it is compiled, else CRC-32.

CRC-32C (the Castagnoli polynomial 0x1EDC6F41, RFC 3720 appendix B.4; as in iSCSI, ext4
and SCTP) detects every burst error of up to 32 bits, like zlib's CRC-32, and has a
better minimum distance at chunk sizes of a few MiB (Castagnoli, Bräuer & Herrmann,
"Optimization of cyclic redundancy-check codes with 24 and 32 parity bits", IEEE Trans.
Commun. 41(6), 1993). It exists for speed: x86-64's SSE4.2 ``crc32`` instruction computes
it in hardware (``_crc32c.c``, ~10x the table-driven zlib 1.2 on this machine's cores),
with the GIL released. Without the compiled module, zlib's CRC-32 is used.

A value carries its algorithm in bits 32 and up (:data:`ALGO`), so two ranks that
checksum differently (a mixed install) are told apart by :func:`same_algorithm` instead
of every chunk looking corrupt.
"""

from __future__ import annotations

import zlib

from ringtree import kernels

_kernel = kernels.load("ringtree.resilience._crc32c")
if _kernel is not None:
    _crc32c, _hardware = _kernel.crc32c, _kernel.hardware
else:  # not compiled (or built from other sources): zlib's CRC-32, the same guarantees, slower
    _crc32c = None

    def _hardware() -> bool:
        return False

ALGO = 1 if _crc32c is not None else 0  # 1: CRC-32C, 0: zlib's CRC-32
NAMES = {0: "CRC-32 (zlib)", 1: "CRC-32C"}


def name() -> str:
    """The checksum in use, and whether hardware computes it."""
    return NAMES[ALGO] + (" (SSE4.2)" if _hardware() else "")


def chunk_sum(buf) -> int:
    """The checksum of a contiguous buffer, tagged with its algorithm (bits 32+)."""
    crc = _crc32c(buf) if _crc32c is not None else zlib.crc32(buf)
    return (ALGO << 32) | crc


def same_algorithm(a: int, b: int) -> bool:
    """Were the two tagged values computed by the same algorithm?"""
    return (a >> 32) == (b >> 32)
