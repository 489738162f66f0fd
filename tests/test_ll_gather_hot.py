"""The all-gather in one C call (``Round.ghot``, ``LLRunner.gather_now``): every NumPy
dtype gives its exact bytes with the kernel and without it, on 2 and 3 ranks and 4 ranks
on 2 cores; an output the input is the own block of (in place) gives the same bytes;
arrays it must not take (strided, another dtype, read-only) go the general way with its
answer or error; the flight recorder's entries are written from C;
a late peer (the kernel returns, Python places the blocks) and an absent one (named,
the entry failed); 8 ranks on 2 cores for 2,000 calls."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
from hot_entry_cases import (
    RANKS_AND_KERNEL,
    absent_peer,
    assert_absent_named,
    assert_recorded,
    errors_of,
    recorded,
)

from ringtree.prof.flight import Entry
from ringtree.testing import run_ranks

DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")  # every NumPy dtype ringtree takes


def _part(dtype: str, rank: int, count: int, k: int) -> np.ndarray:
    """Random bytes of ``dtype`` (every bit pattern, NaNs too, for floats)."""
    rng = np.random.default_rng(7919 * k + rank)
    return rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def gathers(comm) -> dict:
    """Repeated all-gathers of every dtype into a separate ``out`` (2-D too), each compared
    byte for byte with the concatenation in rank order, then arrays the fast path must
    not take, then what the flight recorder holds."""
    n, r = comm.size, comm.rank
    wrong = 0
    for dtype in DTYPES:
        for count in (3, 4096):  # inline in the line, and in the cell
            out = np.empty((n, count), dtype)
            for k in range(6):
                x = _part(dtype, r, count, k)
                got = comm.all_gather(x, out=out if k % 2 else out.reshape(-1))
                want = np.concatenate([_part(dtype, q, count, k) for q in range(n)])
                wrong += int(got.tobytes() != want.tobytes() or not np.shares_memory(got, out))
    base = np.arange(8, dtype=np.float32) + 8 * r
    full = np.arange(8 * n, dtype=np.float32)
    results = []
    out = np.zeros(8 * n, np.float32)
    comm.all_gather(base, out=out)  # the warm shape
    inplace = np.zeros(8 * n, np.float32)
    inplace[8 * r:8 * r + 8] = base
    comm.all_gather(inplace[8 * r:8 * r + 8], out=inplace)     # in place
    results.append(inplace.tolist() == full.tolist())
    wide = np.zeros(16, np.float32)
    readonly = np.zeros(8 * n, np.float32)
    readonly.flags.writeable = False
    errors = errors_of(lambda x, bad: comm.all_gather(x, out=bad),  # strided input,
                       ((wide[::2], out), (base, np.zeros(8 * n, np.float64)),  # another
                        (base, readonly)))  # dtype, a read-only output
    return {"wrong": wrong, "general": results, "errors": errors, **recorded(comm, 6)}


@RANKS_AND_KERNEL
def test_gather_hot_path_bytes_refusals_and_flight_recorder(nranks, env):
    res = run_ranks(gathers, nranks, timeout=120, env=env)
    for r, got in enumerate(res):
        assert got["wrong"] == 0 and got["general"] == [True], (r, got)
        assert got["errors"] == ["ValueError", "TypeError", "ValueError"], (r, got)
        assert_recorded(r, got, 6, not env, 24)


def late_and_absent(comm) -> dict:
    """Rank 1 comes 20 ms late to five all-gathers (rank 0's kernel gives up waiting and
    Python sleeps and places the blocks), then skips one: rank 0's names it."""
    x = np.full(1000, comm.rank + 1, np.int32)
    out = np.empty(2000, np.int32)
    comm.all_gather(x, out=out)
    ok = True
    for k in range(5):
        if comm.rank == 1:
            time.sleep(0.02)
        x[:] = 10 * k + comm.rank
        out[:] = -1
        comm.all_gather(x, out=out)
        ok &= out.tolist() == [10 * k] * 1000 + [10 * k + 1] * 1000
    return absent_peer(comm, partial(comm.all_gather, x, out=out), ok)


def test_late_and_absent_peers_on_the_gather_hot_path():
    assert_absent_named(run_ranks(late_and_absent, 2, timeout=60), 7)


def many_calls(comm) -> tuple[int, int]:
    """2,000 all-gathers, each element naming its call and rank: the wrong ones, and how
    many of the flight recorder's entries the kernel wrote."""
    x, out = np.empty(1000, np.int32), np.empty(1000 * comm.size, np.int32)
    wrong = 0
    for k in range(2000):
        x[:] = 16 * k + comm.rank
        comm.all_gather(x, out=out)
        want = 16 * k + np.arange(comm.size, dtype=np.int32)
        wrong += int(not (out.reshape(comm.size, -1) == want[:, None]).all())
    return wrong, sum(type(e) is not Entry for e in comm.flight.ring if e is not None)


def test_eight_ranks_on_two_cores_through_the_gather_hot_path():
    for r, (wrong, from_c) in enumerate(run_ranks(many_calls, 8, timeout=120)):
        assert wrong == 0 and from_c > 100, (r, wrong, from_c)
