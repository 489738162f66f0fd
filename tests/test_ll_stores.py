"""LL's store mode measured on the communicator (``runtime/protocols/ll_stores.py``):
once, at the first LL call whose block streams, the same choice on every rank, applied
to every round on the segment, made before or after, its calls named in the flight
recorder; set by ``RINGTREE_LL_STORES``;
streaming with ``RINGTREE_TUNE=model``; nothing to measure without the kernel; the same
bits in both modes for every LL collective."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.testing import run_ranks
from ringtree.transports import shm_native as native

needs_kernel = pytest.mark.skipif(not native.available(), reason="the kernel was not built")


def _modes(comm) -> set[int]:
    return {k.stores() for k in native.rounds_on(comm.ll.ll)}


def first_calls(comm) -> dict:
    """A small call (no measuring), then one of 16 KiB (the measuring), then another size."""
    x = np.ones(16, np.float32)
    comm.all_reduce(x)
    before = comm.ll.stores.timed
    y = np.ones(4096, np.float32)
    comm.all_reduce(y)
    timed = comm.ll.stores.timed
    comm.all_gather(np.ones(8192, np.float32), out=np.empty(8192 * comm.size, np.float32))
    names = {e["name"] for e in comm.flight.entries()}
    return {"before": before, "chose_stream": timed.chose_first, "names": names,
            "same_timed": comm.ll.stores.timed is timed, "modes": _modes(comm),
            "segment": native.share_nt(comm.ll.ll), "ok": bool((y == comm.size).all())}


@needs_kernel
def test_measured_once_and_applied_to_every_round():
    res = run_ranks(first_calls, 2, timeout=120)
    for r in res:
        assert r["before"] is None and r["same_timed"] and r["ok"], r
        want = native.SHARE_NT if r["chose_stream"] else native.CACHED
        assert r["segment"] == want and r["modes"] == {want}, r
        # the measuring's calls are in the flight recorder under their own name
        assert {"all_reduce", "all_reduce (measuring)", "all_gather"} <= r["names"], r
    assert res[0]["chose_stream"] == res[1]["chose_stream"]


def configured(comm) -> tuple:
    comm.all_reduce(np.ones(1 << 16, np.float32))
    return comm.ll.stores is None, native.share_nt(comm.ll.ll), _modes(comm)


@needs_kernel
def test_the_mode_set_without_measuring():
    for env, want in (({"RINGTREE_LL_STORES": "cache"}, native.CACHED),
                      ({"RINGTREE_LL_STORES": "stream"}, native.SHARE_NT),
                      ({"RINGTREE_TUNE": "model"}, native.SHARE_NT),
                      ({"RINGTREE_TUNE": "model", "RINGTREE_LL_STORES": "cache"},
                       native.CACHED)):
        for r in run_ranks(configured, 2, timeout=60, env=env):
            assert r == (True, want, {want}), (env, r)


def test_nothing_to_measure_without_the_kernel():
    res = run_ranks(lambda c: (c.all_reduce(np.ones(1 << 16, np.float32)),
                               c.ll.stores is None)[1], 2, timeout=60,
                    env={"RINGTREE_LL_NATIVE": "0"})
    assert res == [True, True]


def every_collective(comm) -> list[bytes]:
    """Inexact float32 data through LL's paths: the fold round, the split, all-gather,
    reduce-scatter, broadcast, reduce (the single copy off: the segment's paths only)."""
    rng = np.random.default_rng(comm.rank)
    got = []
    for count in (4096, 3 << 17):  # 16 KiB (the fold round), 1.5 MiB (the split)
        x = rng.standard_normal(count).astype(np.float32)
        got.append(comm.all_reduce(x, out=np.empty_like(x)).tobytes())
    x = rng.standard_normal(6 << 12).astype(np.float32)  # 96 KiB: whole blocks on 2 and 3
    out = np.empty(x.size * comm.size, np.float32)
    got.append(comm.all_gather(x, out=out).tobytes())
    y = np.empty(x.size // comm.size, np.float32)
    got.append(comm.reduce_scatter(x, out=y).tobytes())
    b = x.copy()
    got.append(comm.broadcast(b, 1).tobytes())
    r = comm.reduce(x, 0, out=np.empty_like(x))
    got.append(r.tobytes() if comm.rank == 0 else b"")
    return got


@needs_kernel
@pytest.mark.parametrize("nranks", [2, 3])
def test_the_same_bits_in_both_modes(nranks):
    runs = [run_ranks(every_collective, nranks, timeout=120,
                      env={"RINGTREE_CMA": "0", "RINGTREE_LL_STORES": mode})
            for mode in ("stream", "cache")]
    assert runs[0] == runs[1]
    for r in range(nranks):  # the all-reduces agree across ranks
        assert runs[0][r][:2] == runs[0][0][:2]
