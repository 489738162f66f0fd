"""LL through the communicator: the collective matrix under RINGTREE_PROTO=LL, calls that
disagree on the protocol, memory order with async Simple work, a killed rank, many ranks
on few cores, and RINGTREE_PROTO=Simple keeping LL out."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from test_collectives import _assert_clean, movement_cases, reduction_cases

import ringtree
from ringtree.dtypes import DType
from ringtree.ir.program import Collective
from ringtree.testing import RankPool, run_ranks
from ringtree.tuning.proto import THRESHOLDS

LL_ENV = {"RINGTREE_PROTO": "LL"}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"n{n}")
def ll_pool(request):
    with RankPool(request.param, env=LL_ENV) as p:
        yield p


def _sizes(n: int) -> list[int]:
    return [0, 1, 17, 3 * n + 1, 2000]  # inline and cell sizes (all fit LL's cells)


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter", "reduce"])
def test_reductions_on_ll(ll_pool, coll):
    _assert_clean(ll_pool.run(reduction_cases, coll, [d.value for d in DType],
                              _sizes(ll_pool.nranks)))


@pytest.mark.parametrize("coll", ["all_gather", "broadcast", "barrier"])
def test_data_movement_on_ll(ll_pool, coll):
    _assert_clean(ll_pool.run(movement_cases, coll, ["int8", "float16", "float64",
                                                     "bfloat16"], _sizes(ll_pool.nranks)))


def really_ll(comm) -> tuple[bool, str, str]:
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    last = comm.flight.entries(1)[0]
    return comm.ll is not None, last["algo"], last["proto"]


def test_the_pool_runs_ll(ll_pool):
    """The flight recorder shows the Program LL ran (direct) and the protocol."""
    assert all(r == (True, "direct", "LL") for r in ll_pool.run_ok(really_ll))


def memory_order(comm) -> bool:
    """An LL call on memory that async Simple work still writes runs after it."""
    n = comm.size
    x = np.full(1 << 20, 1.0, np.float32)          # Simple (large), async
    w = comm.all_reduce(x, async_op=True)
    comm.all_reduce(x[:4])                          # LL on the same memory
    w.wait(timeout=60)
    y = np.full(3, comm.rank, np.int64)
    v = comm.all_reduce(y, async_op=True)           # LL, async: a completed Work
    v.wait(timeout=60)
    return bool(x[0] == n * n and x[4] == n and (y == n * (n - 1) // 2).all()
                and v.is_completed())


def test_ll_waits_for_async_simple_work_on_its_memory():
    assert run_ranks(memory_order, 3, timeout=120) == [True] * 3


def waiter_runs_the_queue(comm) -> bool:
    """Async LL calls, waited for newest first and then in order: a waiting thread runs
    the queue up to its call itself, in issue order, and every result is exact."""
    n = comm.size
    xs = [np.full(5, comm.rank + k, np.int64) for k in range(6)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    works[2].wait()
    for w in works:
        w.wait()
    return all((x == n * (n - 1) // 2 + n * k).all() for k, x in enumerate(xs)) and \
        comm.ll.pending == 0


def test_waiting_for_async_ll_calls_runs_them_in_issue_order():
    assert run_ranks(waiter_runs_the_queue, 3, timeout=120) == [True] * 3


def disagree(comm):
    """Rank 1's count puts its call on Simple, the others' on LL (with the single copy
    off, which would take rank 1's call on the LL lines from ll_direct_fold.MIN_BYTES)."""
    count = THRESHOLDS[Collective.ALL_REDUCE][1] // 2 if comm.rank == 1 else 4  # 2x the bytes
    try:
        comm.all_reduce(np.ones(count, np.float32), timeout=60)
    except ringtree.RingtreeError as e:
        return type(e).__name__, str(e)
    return None


def test_ranks_that_disagree_on_the_protocol_fail_with_a_mismatch():
    res = run_ranks(disagree, 3, timeout=120, env={"RINGTREE_CMA": "0"})
    for r, got in enumerate(res):
        assert got is not None, f"rank {r} finished"
        name, msg = got
        assert "protocol" in msg and "disagree" in msg, (r, msg)
        if r != 1:
            assert name == "MismatchError", (r, got)


def killed(comm):
    pids = comm.all_gather(np.array([os.getpid()], np.int64)).reshape(-1).tolist()
    x = np.ones(2, np.float32)
    for _ in range(50):
        comm.all_reduce(x)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(3):
            comm.all_reduce(x, timeout=60)
    except ringtree.RingtreeError as e:
        return pids, str(e)
    return pids, "no error"


def test_killed_rank_on_ll_is_named_and_nothing_is_left():
    res = run_ranks(killed, 3, timeout=120)
    for r in (0, 1):
        pids, msg = res[r]
        assert "rank 2" in msg, msg
    left = [f for f in os.listdir("/dev/shm") if any(f"-p{p}-" in f for p in res[0][0])]
    assert not left, left


def crowd(comm, calls: int) -> int:
    n, bad = comm.size, 0
    x = np.zeros(2, np.int32)
    for k in range(calls):
        x[:] = (k, comm.rank)
        comm.all_reduce(x)
        bad += int(x[0] != k * n or x[1] != n * (n - 1) // 2)
    return bad


def test_eight_ranks_on_two_cores_through_the_communicator():
    assert run_ranks(crowd, 8, 2000, timeout=240) == [0] * 8


def no_ll(comm) -> bool:
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    return comm.ll is None and bool((x == comm.size).all())


def test_simple_only_opens_no_segment():
    assert run_ranks(no_ll, 2, timeout=60, env={"RINGTREE_PROTO": "Simple"}) == [True] * 2


def hot_path_spellings(comm) -> list[tuple[str, bool, bool]]:
    """After one call of a shape has run on LL, the same all-reduce written with the op's
    name or ``out=x`` skips the planner too (the hot path), and still sums right."""
    n, planned = comm.size, []
    plan = comm.planner.plan
    comm.planner.plan = lambda spec: planned.append(spec) or plan(spec)
    out = []
    try:
        for name, call in [("default", lambda x: comm.all_reduce(x)),
                           ("op='sum'", lambda x: comm.all_reduce(x, "sum")),
                           ("op='SUM'", lambda x: comm.all_reduce(x, op="SUM")),
                           ("out=x", lambda x: comm.all_reduce(x, out=x)),
                           ("op='max'", lambda x: comm.all_reduce(x, "max"))]:
            got = []
            for _ in range(2):  # the first may plan (a new op); the second must not
                x = np.full(5, comm.rank + 1, np.int32)
                del planned[:]
                y = call(x)
                got.append(not planned)
            want = n * (n + 1) // 2 if "max" not in name else n
            out.append((name, got[1], bool(y is x and (x == want).all())))
    finally:
        comm.planner.plan = plan
    return out


def test_the_hot_path_takes_op_names_and_out_is_the_input(ll_pool):
    for r, rows in enumerate(ll_pool.run_ok(hot_path_spellings)):
        for name, skipped_planner, right in rows:
            assert right, f"rank {r}: {name} gave a wrong result"
            assert skipped_planner, f"rank {r}: {name} went through the planner again"


def block_hot_paths(comm) -> list[str]:
    """all_gather and reduce_scatter into a NumPy ``out``, and broadcast, skip the planner
    from the second call of a shape on (the hot path) and give the general path's results;
    in place, an ``out`` list, a wrong ``out`` still go the general way (and its errors)."""
    n, r, bad, planned = comm.size, comm.rank, [], []
    plan = comm.planner.plan
    comm.planner.plan = lambda spec, grouped=False: planned.append(spec) or plan(spec, grouped)
    try:
        for shape in ((5,), (2, 3)):
            x = np.arange(6, dtype=np.float64)[:int(np.prod(shape))].reshape(shape) + 10 * r
            want_ag = np.stack([x - 10 * r + 10 * q for q in range(n)])
            big = np.stack([x + b for b in range(n)])  # block b of rank r: x + b
            want_rs = sum(x - 10 * r + 10 * q + r for q in range(n))
            for op, want in (("sum", want_rs), ("max", x - 10 * r + 10 * (n - 1) + r)):
                for i in range(2):
                    del planned[:]
                    ag = comm.all_gather(x, out=np.empty((n, *shape)))
                    rs = comm.reduce_scatter(big, op, out=np.empty(shape))
                    if i and planned:
                        bad.append(f"{shape} {op}: planned again")
                    if ag.tobytes() != want_ag.tobytes() or rs.tobytes() != want.tobytes():
                        bad.append(f"{shape} {op}: wrong result")
        for i in range(2):
            del planned[:]
            b = np.full((2, 3), float(r + 7 * i))
            if comm.broadcast(b, root=n - 1) is not b or (b != n - 1 + 7 * i).any():
                bad.append("broadcast: wrong result")
            if i and planned:
                bad.append("broadcast: planned again")
        whole = np.zeros((n, 5))
        whole[r] = r + 1
        comm.all_gather(whole[r], out=whole)  # in place: the general path
        bad += [] if (whole == np.arange(1, n + 1)[:, None]).all() else ["in place"]
        outs = [np.empty(5) for _ in range(n)]
        comm.all_gather(np.full(5, float(r)), out=outs)
        bad += [] if [o[0] for o in outs] == list(range(n)) else ["out list"]
        try:
            comm.all_gather(np.ones(5), out=np.empty(5 * n, np.float32))
            bad.append("a float32 out for float64 accepted")
        except (TypeError, ValueError):
            pass
    finally:
        comm.planner.plan = plan
    return bad


def test_all_gather_reduce_scatter_and_broadcast_take_the_hot_path(ll_pool):
    assert ll_pool.run_ok(block_hot_paths) == [[]] * ll_pool.nranks
