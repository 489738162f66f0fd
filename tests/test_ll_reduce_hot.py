"""The reduce in one C call (``Round.rhot``, ``LLRunner.reduce_now``): every dtype and op
the kernel folds gives the root the rank-order fold's exact bytes, in place and into
``out``, with the kernel and without it, at odd sizes, from every root, on 2 and 3 ranks
and 4 ranks on 2 cores, while the other ranks' buffers stay as they were; AVG and float16
take the general way; buffers the entry must not take get the general path's errors;
the flight recorder's entries are written from C; a late peer (the kernel returns,
Python completes the wait and the root folds), an absent one (named, the entry failed)
and a killed one (named); 8 ranks on 2 cores."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
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
from test_ll_scatter_hot import UFUNCS, _cases

from ringtree.testing import run_ranks


def _input(dtype: str, op: str, rank: int, count: int, k: int) -> np.ndarray:
    """Small values (0-3 for a product of four: it fits int8): every fold is exact."""
    rng = np.random.default_rng(7919 * k + 31 * rank + count)
    return rng.integers(0, 4 if op == "prod" else 30, count).astype(dtype)


def _fold(xs: list[np.ndarray], op: str) -> np.ndarray:
    want = xs[0]
    for x in xs[1:]:
        want = UFUNCS[op](want, x)
    return want


def reduces(comm) -> dict:
    """Repeated reduces of every case to every root (the first and last of more than
    two), in place and into ``out`` (2-D too),
    the root's result compared byte for byte with NumPy's fold in rank order, every other
    rank's input and ``out`` compared with what they held; then AVG, buffers the entry
    must not take, and what the flight recorder holds."""
    n, r = comm.size, comm.rank
    wrong = []
    for dtype, op in _cases():
        for count in (1, 3, 1001, 4097):  # inline, odd, over a streamed copy
            for root in range(n) if n <= 2 else (0, n - 1):
                out = np.full((1, count), 99, dtype)
                for k in range(3):
                    xs = [_input(dtype, op, q, count, k) for q in range(n)]
                    x, keep = xs[r].copy(), out.copy()
                    into = k % 2 == 1
                    got = comm.reduce(x, root, op, out=out if into else None)
                    if r == root:
                        ok = got is (out if into else x) and \
                            got.tobytes() == _fold(xs, op).tobytes() and \
                            (not into or x.tobytes() == xs[r].tobytes())
                    else:
                        ok = got is None and x.tobytes() == xs[r].tobytes() and \
                            out.tobytes() == keep.tobytes()
                    if not ok:
                        wrong.append((dtype, op, count, root, k))
    x = np.arange(8, dtype=np.float32) * (r + 1)
    total = np.arange(8, dtype=np.float32) * (n * (n + 1) // 2)
    avg = comm.reduce(x.copy(), 0, "avg")
    general = [r != 0 or avg.tolist() == (total / n).tolist()]
    readonly = x.copy()
    readonly.flags.writeable = False
    cases = ((np.zeros(16, np.float32)[::2], None),          # strided
             (readonly, None),                                # read-only, in place
             (x, np.zeros(8, np.float64)),                    # out of another dtype
             (x, np.zeros(9, np.float32)))                    # out of another size
    comm.reduce(x.copy(), 0)  # the warm shape
    errors = errors_of(lambda xx, bad: comm.reduce(xx, 0, out=bad), cases) if r == 0 else []
    return {"wrong": wrong, "general": general, "errors": errors, **recorded(comm, 2)}


@RANKS_AND_KERNEL
def test_reduce_hot_path_bits_refusals_and_flight_recorder(nranks, env):
    res = run_ranks(reduces, nranks, timeout=120, env=env)
    for r, got in enumerate(res):
        assert got["wrong"] == [] and got["general"] == [True], (r, got)
        if r == 0:  # each the general path's error
            assert got["errors"] == ["ValueError", "ValueError", "TypeError",
                                     "ValueError"], got
        assert_recorded(r, got, 2, not env, 100)


def late_and_absent(comm) -> dict:
    """Rank 1 comes 20 ms late to five reduces to either root (the kernel gives up waiting
    and Python sleeps, then the root folds), then skips one: rank 0's names it."""
    x = np.zeros(1000, np.int32)
    ok = True
    for root in (0, 1):
        comm.reduce(x, root)
        comm.reduce(x, root)
        for k in range(5):
            if comm.rank == 1:
                time.sleep(0.02)
            x[:] = 10 * k + comm.rank
            got = comm.reduce(x, root)
            want = [20 * k + 1] * 1000 if comm.rank == root else [10 * k + comm.rank] * 1000
            ok &= x.tolist() == want and (got is None) == (comm.rank != root)
    return absent_peer(comm, partial(comm.reduce, x, 0), ok)


def test_late_and_absent_peers_on_the_reduce_hot_path():
    assert assert_absent_named(run_ranks(late_and_absent, 2, timeout=60), 15)["from_c"]


def killed(comm) -> tuple[int | None, str]:
    x = np.ones(3000, np.float32)
    return killed_peer(comm, partial(comm.reduce, x, 2))


def test_a_peer_killed_during_the_reduce_kernel_wait_is_named():
    assert_killed_named(run_ranks(killed, 3, timeout=60, env=KILL_ENV))


def many_calls(comm) -> tuple[int, int]:
    """400 reduces, each element naming its call, the root moving every 50 calls: the
    wrong results (or touched non-root buffers), and how many calls the kernel recorded."""
    n, r = comm.size, comm.rank
    x = np.empty(100, np.int32)
    wrong = 0
    for k in range(400):
        root = k // 50 % n
        x[:] = 16 * k + r
        got = comm.reduce(x, root)
        want = n * 16 * k + n * (n - 1) // 2 if r == root else 16 * k + r
        wrong += int(not (x == want).all() or (got is None) != (r != root))
    return wrong, int(comm.flight.native[0])


def test_eight_ranks_on_two_cores_through_the_reduce_entry():
    for r, (wrong, from_c) in enumerate(run_ranks(many_calls, 8, timeout=120)):
        assert wrong == 0 and from_c > 350, (r, wrong, from_c)
