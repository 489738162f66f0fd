"""The split all-reduce in one kernel entry (``Round.split``, and ``Round.hot`` on the
communicator's hot path: the reduce-scatter call and the all-gather call with no return
to Python between them): the rank-order bits in place and into ``out``, a peer late for
the first call and one late for the second (each completed by Python), a peer killed
during the wait named, and the entry's refusals."""

from __future__ import annotations

import os
import time
from functools import partial

import numpy as np
import pytest
from hot_entry_cases import KILL_ENV, assert_killed_named, killed_peer, rank_order_sum, rounding

from ringtree.runtime.protocols import ll_split
from ringtree.testing import run_ranks
from ringtree.transports import shm_native

pytestmark = pytest.mark.skipif(not shm_native.available(),
                                reason="ringtree.transports._llc not built (no C compiler)")

COUNT = 66000  # float32: 264 KB, one part (at most a cell), from SPLIT_MIN; 2 and 3 divide it


def _watch(codes: list[int], calls: list[int]) -> None:
    """Record every code Split.after sees, and every call that took Split.__call__."""
    after, call = ll_split.Split.after, ll_split.Split.__call__

    def seen(self, xp, op_out, r, s, timeout):
        codes.append(r)
        return after(self, xp, op_out, r, s, timeout)

    def called(self, *a):
        calls.append(1)
        return call(self, *a)

    ll_split.Split.after, ll_split.Split.__call__ = seen, called


def hot_split(comm, late: bool) -> dict:
    """Float32 sums with rounding in every add through comm.all_reduce, compared bit for
    bit with the rank-order fold. ``late``: rank 1 runs in Python and, for some calls,
    rank 1 comes 2 ms late (rank 0's kernel gives up in the first call) or rank 0 comes
    2 ms late while rank 1 sleeps 3 ms between its two calls (rank 0's kernel gives up
    in the second)."""
    n, r = comm.size, comm.rank
    codes: list[int] = []
    calls: list[int] = []
    _watch(codes, calls)
    if late and r == 1:  # rank 1 runs the split in Python; it sleeps between its calls
        os.environ["RINGTREE_LL_NATIVE"] = "0"  # read when the op is prepared
        fold = ll_split.Split._fold

        def slow_fold(self, p, xb, red):
            if slow[0]:
                time.sleep(0.003)
            return fold(self, p, xb, red)
        ll_split.Split._fold = slow_fold
    if late:  # budgets read when the op is prepared: rank 0's kernel gives up after
        ll = comm.ll.ll  # 50 µs, rank 1 never sleeps (so it is never rung in call s)
        ll.spin, ll.yield_s = 0.0, 50e-6 if r == 0 else 0.5
    slow = [False]
    wrong = 0
    x, y = np.empty(COUNT, np.float32), np.empty(COUNT, np.float32)
    mine = [rounding(r, COUNT, k) for k in range(16)]
    want = [rank_order_sum(n, COUNT, k).view(np.uint32) for k in range(16)]
    comm.barrier()
    for k in range(16):
        x[:] = mine[k]
        if late and 4 <= k < 8 and r == 1:
            time.sleep(0.002)              # rank 0's first call waits past its budgets
        if late and k >= 8:
            slow[0] = True
            if r == 0:
                time.sleep(0.002)          # rank 1 is in its fold by now
        got = comm.all_reduce(x) if k % 8 < 4 else comm.all_reduce(x, out=y)
        slow[0] = False
        wrong += int(not np.array_equal(got.view(np.uint32), want[k]))
        wrong += int(k % 8 >= 4 and not np.array_equal(x, mine[k]))
    second = sum(c >= shm_native.SECOND // 2 for c in codes)
    first = sum(-1 != c < shm_native.SECOND // 2 for c in codes)
    return {"wrong": wrong, "codes": len(codes), "calls": len(calls), "first": first,
            "second": second}


@pytest.mark.parametrize("nranks", [2, 3])
def test_split_on_the_hot_path_gives_the_rank_order_bits(nranks):
    # RINGTREE_TUNE=model: the calls counted are the test's (no measuring calls)
    for r, got in enumerate(run_ranks(hot_split, nranks, False, timeout=90,
                                      env={"RINGTREE_TUNE": "model"})):
        assert got["wrong"] == 0, (r, got)
        # the first two calls of a shape, in place or not, take the general path
        # (Split.__call__), each switch between them one: the other ten are hot
        assert got["calls"] <= 6 and got["codes"] - got["calls"] >= 10, (r, got)


def test_a_peer_late_for_either_call_of_the_split_is_waited_for():
    # RINGTREE_TUNE=model: the split at its size, which the single copy (measured) can take
    res = run_ranks(hot_split, 2, True, timeout=90, env={"RINGTREE_TUNE": "model"})
    for r, got in enumerate(res):
        assert got["wrong"] == 0, (r, got)
    assert res[0]["first"] >= 1 and res[0]["second"] >= 1, res[0]


def killed(comm) -> tuple[int | None, str]:
    return killed_peer(comm, partial(comm.all_reduce, np.ones(COUNT, np.float32)))


def test_a_peer_killed_during_the_split_kernel_wait_is_named():
    assert_killed_named(run_ranks(killed, 3, timeout=60, env=KILL_ENV))


def refusals(comm) -> list[str]:
    """Round.split and Round.pair refuse what does not fit, naming it."""
    from test_ll import _ll

    ll_split.SPLIT_MIN = 64
    c = _ll(comm, "refuse", cell=8192)
    x = np.ones(1000, np.float32)
    c.all_reduce(x, *_sum())
    op = next(iter(c.ops.values())).run
    msgs = []
    for call in (lambda: op.k1.split(x[:10], x[:10], 99, 0, 0, 0),
                 lambda: op.k1.split(x, x[1:].copy(), 99, 0, 0, 0),
                 lambda: op.k1.pair(op.k2, -1, 0),
                 lambda: op.k1.pair(None, 0, 0),
                 lambda: op.k2.split(x, x, 99, 0, 0, 0)):
        try:
            call()
            msgs.append("no error")
        except (ValueError, TypeError) as e:
            msgs.append(str(e))
    c.ll.close()
    return msgs


def _sum():
    from ringtree.dtypes import DType
    from ringtree.ops import resolve
    return DType.FLOAT32, resolve("sum", DType.FLOAT32)


def test_the_split_entry_refuses_what_does_not_fit():
    for msgs in run_ranks(refusals, 2, timeout=60):
        short, other, dst, kind, unpaired = msgs
        assert "split: the input or the output does not fit" in short
        assert "split: the input or the output does not fit" in other
        assert "pair: no skips or places set" in dst
        assert "must be a Round" in kind
        assert "no pair set" in unpaired
