"""Buffers at any offset within their pages (a NumPy array from ``malloc`` lies 16 bytes
into its pages, one from the heap anywhere): LL's copies (``_stream.h``, ``cached_copy``
and ``stream_copy``) and the single copy's scratch slots (``_llc.c``, ``PUSH_SLOT``)
give the rank-order fold's bits and the exact gathers at offsets 0, 16, 48 and 2,064,
odd lengths, streaming and cached stores, the segment's paths and the single copy."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from ringtree.testing import run_ranks

OFFSETS = (0, 16, 48, 2064)


def _at(offset: int, count: int, dtype=np.float32) -> np.ndarray:
    """``count`` zeros of ``dtype`` starting ``offset`` bytes into fresh pages."""
    item = np.dtype(dtype).itemsize
    raw = np.frombuffer(mmap.mmap(-1, count * item + offset + 4096), np.uint8)
    return raw[offset:offset + count * item].view(dtype)


def _values(rank: int, count: int) -> np.ndarray:
    """float32 whose sums over a few ranks are inexact in another order."""
    return np.random.default_rng(1000 + rank).standard_normal(count).astype(np.float32)


def at_offsets(comm) -> list[str]:
    bad = []
    n, r = comm.size, comm.rank
    for off in OFFSETS:
        for count in (12_345, 3 * (1 << 16) + 7, 300_001):  # fold round, split, larger
            x = _at(off, count)
            x[:] = _values(r, count)
            want = _values(0, count)
            for q in range(1, n):
                want = want + _values(q, count)
            out = _at((off + 16) % 4096, count)
            comm.all_reduce(x, out=out)
            if out.tobytes() != want.tobytes():
                bad.append(f"all_reduce {count} at {off}: not the rank-order fold")
            comm.all_reduce(x)
            if x.tobytes() != want.tobytes():
                bad.append(f"all_reduce in place {count} at {off}: not the rank-order fold")
        per = 40_001
        x = _at(off, per)
        x[:] = _values(r, per)
        g = _at((off + 48) % 4096, per * n)
        comm.all_gather(x, out=g)
        if g.tobytes() != np.concatenate([_values(q, per) for q in range(n)]).tobytes():
            bad.append(f"all_gather at {off}: wrong")
        b = _at(off, per)
        b[:] = _values(r, per)
        comm.broadcast(b, n - 1)
        if b.tobytes() != _values(n - 1, per).tobytes():
            bad.append(f"broadcast at {off}: wrong")
    return bad


@pytest.mark.parametrize("env", [
    {"RINGTREE_CMA": "0", "RINGTREE_LL_STORES": "cache"},
    {"RINGTREE_CMA": "0", "RINGTREE_LL_STORES": "stream"},
    {"RINGTREE_CMA_MIN": "1"},
], ids=["segment-cached", "segment-streamed", "single-copy"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_any_offset_gives_the_same_bits(nranks, env):
    for r, bad in enumerate(run_ranks(at_offsets, nranks, timeout=120, env=env)):
        assert bad == [], f"rank {r}: {bad}"
