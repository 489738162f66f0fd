"""The reduce-scatter in one C call (``Round.shot``, ``LLRunner.scatter_now``): every
dtype and op the kernel folds gives the rank-order fold's exact bytes with the kernel and
without it, at odd sizes, on 2 and 3 ranks and 4 ranks on 2 cores; AVG, float16 and
arrays the entry must not take (strided, overlapping, another dtype, read-only) go the
general way with its answer or error; the flight recorder's entries are written from C;
a late peer (the kernel returns, Python folds), an absent one (named, the entry failed)
and a killed one (named)."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import pytest
from hot_entry_cases import (
    KILL_ENV,
    RANKS_AND_KERNEL,
    absent_peer,
    assert_absent_named,
    assert_killed_named,
    assert_recorded,
    errors_of,
    killed_peer,
    recorded,
)

from ringtree.testing import run_ranks

INTS = ("int8", "uint8", "int32", "uint32", "int64", "uint64")
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def _cases():
    for dtype in INTS + ("float32", "float64", "float16"):  # float16: the general path
        for op in UFUNCS:
            if op in ("band", "bor", "bxor") and dtype not in INTS:
                continue
            yield dtype, op


def _input(dtype: str, op: str, rank: int, n: int, count: int, k: int) -> np.ndarray:
    """Small values (0-3, products of three of them fit int8): every fold is exact."""
    rng = np.random.default_rng(7919 * k + 31 * rank + count)
    return rng.integers(0, 4 if op == "prod" else 40, n * count).astype(dtype)


def scatters(comm) -> dict:
    """Repeated reduce-scatters of every case into a separate ``out`` (2-D too), each
    compared byte for byte with NumPy's fold in rank order, then arrays the entry must
    not take, then what the flight recorder holds."""
    n, r = comm.size, comm.rank
    wrong = []
    for dtype, op in _cases():
        for count in (1, 3, 1001, 4097):  # inline, odd, over a streamed copy
            out = np.empty((1, count), dtype)
            for k in range(4):
                xs = [_input(dtype, op, q, n, count, k) for q in range(n)]
                want = xs[0]
                for q in range(1, n):
                    want = UFUNCS[op](want, xs[q])
                got = comm.reduce_scatter(xs[r], op, out=out if k % 2 else out.reshape(-1))
                if got.tobytes() != want[r * count:(r + 1) * count].tobytes() or \
                        not np.shares_memory(got, out):
                    wrong.append((dtype, op, count, k))
    x = np.arange(8 * n, dtype=np.float32) * (r + 1)
    out = np.zeros(8, np.float32)
    full = np.arange(8 * n, dtype=np.float32) * (n * (n + 1) // 2)
    comm.reduce_scatter(x, out=out)  # the warm shape
    general = [out.tolist() == full[8 * r:8 * r + 8].tolist()]
    inplace = x.copy()  # out is x's own block: the general path
    comm.reduce_scatter(inplace, out=inplace[8 * r:8 * r + 8])
    general.append(inplace[8 * r:8 * r + 8].tolist() == full[8 * r:8 * r + 8].tolist())
    avg = comm.reduce_scatter(x, "avg", out=np.zeros(8, np.float32))
    general.append(avg.tolist() == (full[8 * r:8 * r + 8] / n).tolist())
    wide = np.zeros(16 * n, np.float32)
    readonly = np.zeros(8, np.float32)
    readonly.flags.writeable = False
    errors = errors_of(lambda xx, bad: comm.reduce_scatter(xx, out=bad),  # strided input,
                       ((wide[::2], out), (x, np.zeros(8, np.float64)),  # another dtype,
                        (x, readonly), (x, np.zeros(9, np.float32))))  # read-only, size
    return {"wrong": wrong, "general": general, "errors": errors, **recorded(comm, 4)}


@RANKS_AND_KERNEL
def test_scatter_hot_path_bits_refusals_and_flight_recorder(nranks, env):
    res = run_ranks(scatters, nranks, timeout=120, env=env)
    for r, got in enumerate(res):
        assert got["wrong"] == [] and got["general"] == [True] * 3, (r, got)
        assert got["errors"] == ["ValueError", "TypeError", "ValueError", "ValueError"], \
            (r, got)
        assert_recorded(r, got, 4, not env, 20)


def late_and_absent(comm) -> dict:
    """Rank 1 comes 20 ms late to five reduce-scatters (rank 0's kernel gives up waiting
    and Python sleeps, stages its own block and folds), then skips one: rank 0's names
    it."""
    x = np.zeros(2000, np.int32)
    out = np.empty(1000, np.int32)
    comm.reduce_scatter(x, out=out)
    comm.reduce_scatter(x, out=out)
    ok = True
    for k in range(5):
        if comm.rank == 1:
            time.sleep(0.02)
        x[:1000], x[1000:] = 10 * k + comm.rank, 100 * k + comm.rank
        out[:] = -1
        comm.reduce_scatter(x, out=out)
        ok &= out.tolist() == [(20 * k + 1) if comm.rank == 0 else (200 * k + 1)] * 1000
    return absent_peer(comm, partial(comm.reduce_scatter, x, out=out), ok)


def test_late_and_absent_peers_on_the_scatter_hot_path():
    assert_absent_named(run_ranks(late_and_absent, 2, timeout=60), 8)


def killed(comm) -> tuple[int | None, str]:
    x = np.ones(3000 * comm.size, np.float32)
    out = np.empty(3000, np.float32)
    return killed_peer(comm, partial(comm.reduce_scatter, x, out=out))


def test_a_peer_killed_during_the_scatter_kernel_wait_is_named():
    assert_killed_named(run_ranks(killed, 3, timeout=60, env=KILL_ENV))


def broadcasts(comm) -> dict:
    """In-place broadcasts from every root (``Round.bshot``): random bytes of every dtype,
    1-D and 2-D, each compared with the root's; a late root and a late receiver (the
    kernel returns, Python completes the wait and copies); arrays the entry must not take
    (strided: refused; a read-only root's buffer: sent) go the general way."""
    n, r = comm.size, comm.rank
    wrong = []
    for dtype in INTS + ("float16", "float32", "float64"):
        for count in (1, 3, 1001, 4097):
            for root in range(n):
                for k in range(4):
                    rng = np.random.default_rng(k + 10 * root + count)
                    want = rng.integers(0, 256, count * np.dtype(dtype).itemsize,
                                        dtype=np.uint8).view(dtype)
                    x = want.copy() if r == root else np.zeros(count, dtype)
                    comm.broadcast(x if k % 2 else x.reshape(1, -1), root=root)
                    if x.tobytes() != want.tobytes():
                        wrong.append((dtype, count, root, k))
    late = 0
    for k in range(6):
        if r == k % 2:
            time.sleep(0.02)
        x = np.full(1000, k, np.int64) if r == 0 else np.zeros(1000, np.int64)
        comm.broadcast(x, root=0)
        late += int(x.tolist() != [k] * 1000)
    try:  # strided: refused on every rank
        comm.broadcast(np.zeros(16, np.int64)[::2], root=0)
        general = ["no error"]
    except ValueError as e:
        general = [type(e).__name__]
    x = np.full(8, 5 if r == 0 else 0, np.int64)
    x.flags.writeable = r != 0  # a read-only root's buffer: sent by the general path
    comm.broadcast(x, root=0)
    general.append(x.tolist() == [5] * 8)
    return {"wrong": wrong, "late": late, "general": general,
            "from_c": int(comm.flight.native[0])}


@pytest.mark.parametrize("nranks,env", [(2, {}), (3, {}), (2, {"RINGTREE_LL_NATIVE": "0"})],
                         ids=["kernel-2", "kernel-3", "python-2"])
def test_broadcast_hot_path_bytes_late_peers_and_refusals(nranks, env):
    for r, got in enumerate(run_ranks(broadcasts, nranks, timeout=120, env=env)):
        assert got["wrong"] == [] and got["late"] == 0, (r, got)
        assert got["general"] == ["ValueError", True], (r, got)
        assert (got["from_c"] >= 100) == (not env), (r, got)


def many_calls(comm) -> tuple[int, int]:
    """500 reduce-scatters and 500 broadcasts, each element naming its call: the wrong
    ones, and how many calls the kernel recorded."""
    n, r = comm.size, comm.rank
    x, out, b = np.empty(100 * n, np.int32), np.empty(100, np.int32), np.empty(100, np.int32)
    wrong = 0
    for k in range(500):
        x[:] = 16 * k + r + np.arange(100 * n, dtype=np.int32) // 100
        comm.reduce_scatter(x, out=out)
        wrong += int(not (out == n * (16 * k + r) + n * (n - 1) // 2).all())
        root = k // 100 % n  # a root for 100 calls: the one entry keeps the last one
        b[:] = k if r == root else -1
        comm.broadcast(b, root=root)
        wrong += int(not (b == k).all())
    return wrong, int(comm.flight.native[0])


def test_eight_ranks_on_two_cores_through_the_one_entry_paths():
    for r, (wrong, from_c) in enumerate(run_ranks(many_calls, 8, timeout=120)):
        assert wrong == 0 and from_c > 900, (r, wrong, from_c)
