"""The split all-reduce (a reduce-scatter then an all-gather through LL's segment,
``runtime/protocols/ll_split.py``): the same bits as the rank-order fold, compiled and in
Python, in place and not, streamed with a last part the ranks do not divide, with a peer
that sleeps through the kernel's budgets, kernel and Python ranks in one job, and a peer
killed before a call named by the others."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from test_ll import _ll
from test_ll_native import _input, rank_1_dies

from ringtree.dtypes import DType
from ringtree.ir.program import Collective
from ringtree.ops import resolve
from ringtree.runtime.protocols import ll_split
from ringtree.testing import run_ranks
from ringtree.transports import shm_native

CELL = 8192
CASES = [("float32", "sum"), ("float64", "max"), ("int32", "prod"), ("bfloat16", "sum"),
         ("float16", "sum"), ("uint8", "bxor"), ("float32", "min")]


def _want(n: int, count: int, dt: DType, op: str) -> np.ndarray:
    """The rank-order fold, as LL's Python fold round computes it (one rank at a time)."""
    red = resolve(op, dt)
    want = _input(0, count, dt, op).copy()
    for q in range(1, n):
        red.combine(want, want, _input(q, count, dt, op))
    return want


def split(comm, native: str, sleepy: bool) -> list[str]:
    os.environ["RINGTREE_LL_NATIVE"] = native
    ll_split.SPLIT_MIN = 64  # this process only: every case below runs split
    c = _ll(comm, "split", cell=CELL)
    if sleepy:  # no spin, a short yield: most waits go back to Python and sleep
        c.ll.spin, c.ll.yield_s = 0.0, 20e-6
    n, r = comm.size, comm.rank
    bad = []
    try:
        for dname, op in CASES:
            dt = DType(dname)
            cell = CELL // dt.itemsize
            for count in (cell, 3 * cell + n * 5 + 1, 64 // dt.itemsize + 1):
                red = resolve(op, dt)
                x = _input(r, count, dt, op)
                key = (Collective.ALL_REDUCE, dt, count, red.code, -1)
                for in_place in (True, False):
                    if sleepy and r == 1:
                        time.sleep(0.002)
                    y = x.copy()
                    got = c.all_reduce(y, dt, red, out=None if in_place else
                                       np.empty_like(x))
                    if got.tobytes() != _want(n, count, dt, op).tobytes():
                        bad.append(f"{dname} {op} count={count} in_place={in_place}")
                    if not in_place and y.tobytes() != x.tobytes():
                        bad.append(f"{dname} {op} count={count}: the input changed")
                if not isinstance(c.ops[key].run, ll_split.Split):
                    bad.append(f"{dname} {op} count={count}: not split")
    finally:
        os.environ.pop("RINGTREE_LL_NATIVE", None)
        c.ll.close()
    return bad


@pytest.mark.parametrize("nranks,native,sleepy", [
    (2, "1", False), (2, "0", False), (3, "1", False), (3, "1", True)])
def test_split_all_reduce_gives_the_rank_order_bits(nranks, native, sleepy):
    if native == "1" and not shm_native.available():
        pytest.skip("ringtree.transports._llc not built (no C compiler)")
    assert run_ranks(split, nranks, native, sleepy, timeout=90) == [[]] * nranks


def mixed(comm) -> list[str]:
    return split(comm, "1" if comm.rank == 0 else "0", False)


def test_split_with_kernel_and_python_ranks_in_one_job():
    if not shm_native.available():
        pytest.skip("ringtree.transports._llc not built (no C compiler)")
    assert run_ranks(mixed, 2, timeout=90) == [[], []]


def killed(comm):
    ll_split.SPLIT_MIN = 64
    c = _ll(comm, "sk", cell=CELL, spin=0.0, yield_us=20000.0)  # waits in the kernel
    x = np.ones(3 * CELL, np.float32)  # three parts
    red = resolve("sum", DType.FLOAT32)
    for _ in range(5):
        c.all_reduce(x, DType.FLOAT32, red)
    return rank_1_dies(comm, c, x, red)


def test_a_peer_killed_before_a_split_all_reduce_is_named():
    res = run_ranks(killed, 3, timeout=60)
    assert isinstance(res[1], BaseException)
    for r in (0, 2):
        peer, msg = res[r]
        assert peer == 1 and "rank 1" in msg and "died" in msg, msg
