"""The per-call path of the all-reduce (docs/design-notes.md, "The per-call cost: one
frame, the array's fields"): ``Communicator.all_reduce`` is its hot
path in one frame (:mod:`ringtree.runtime.protocols.ll_hot`), the C entries read an
ndarray's fields instead of a buffer export once ``_llc.ndlayout`` checked them (else the
buffer protocol), and ``Round.expect`` checks the dtype object that Python no longer
does. Arrays of the hot shape's size in bytes but another dtype, an equal dtype that is
another object, views, read-only and non-contiguous arrays and 2-D shapes, alternated
call by call, give the rank-order fold's exact results with the fields read and with the
buffer protocol, on 2 ranks and on one; probes that disagree leave the fields unread."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.testing import run_ranks


def _calls(comm) -> list:
    """Exact sums of mixed calls (each result against NumPy's), then the seq."""
    n, r = comm.size, comm.rank
    f32 = np.dtype(np.float32)
    meta = np.dtype(np.float32, metadata={"m": 1})  # equal to float32, another object
    results = []
    for k in range(3):
        for in_place in (True, True, False, False):  # the shape kept, then each dtype
            for dt in (f32, np.dtype(np.int32), meta, f32):  # 4 bytes each: one size
                base = (1 << 26) if dt.kind == "i" else 0  # int32: not float32's bits
                x = (np.arange(16) % 5 + r + k + base).astype(dt)
                want = sum((np.arange(16) % 5 + q + k + base) for q in range(n)).astype(dt)
                out = x if in_place else np.zeros_like(x)
                comm.all_reduce(x, out=None if in_place else out)
                results.append(out.tobytes() == want.tobytes())
        x2 = (np.arange(16).reshape(4, 4) % 3 + r).astype(np.float32)  # 2-D, same bytes
        comm.all_reduce(x2)
        results.append(x2.tobytes() ==
                       sum(np.arange(16).reshape(4, 4) % 3 + q for q in range(n))
                       .astype(np.float32).tobytes())
        big = np.full(32, 1.0 + r, np.float32)
        comm.all_reduce(big[::2].copy())  # another size, then the strided view refused:
        errors = []
        for bad in (big[::2], _read_only(16)):
            try:
                comm.all_reduce(bad)
                errors.append("no error")
            except (ValueError, TypeError) as e:
                errors.append(type(e).__name__)
        results.append(errors == ["ValueError", "ValueError"])
    return [all(results), results, comm.seq]


def _read_only(n: int) -> np.ndarray:
    x = np.ones(n, np.float32)
    x.flags.writeable = False
    return x


def _both_ways(comm) -> list:
    from ringtree.transports import _llc, shm_native

    fields = _calls(comm)
    assert not _llc.ndlayout(np.ndarray, ((np.zeros(3), 1, (3,), np.dtype(float), True,
                                           True),))  # a wrong address: not read
    try:
        exported = _calls(comm)
    finally:
        assert _llc.ndlayout(np.ndarray, shm_native._probes())
    return [fields, exported]


@pytest.mark.parametrize("nranks", [1, 2])
def test_all_reduce_per_call_fields_and_buffers(nranks):
    pytest.importorskip("ringtree.transports._llc")
    for rank, got in enumerate(run_ranks(_both_ways, nranks, timeout=120)):
        if isinstance(got, BaseException):
            raise got
        for ok, results, _ in got:
            assert ok, (rank, results)
        assert got[1][2] > got[0][2]  # every call numbered


def test_all_reduce_per_call_without_kernel():
    for got in run_ranks(_calls, 2, timeout=120, env={"RINGTREE_LL_NATIVE": "0"}):
        if isinstance(got, BaseException):
            raise got
        assert got[0], got[1]
