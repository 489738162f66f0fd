"""Every collective × dtype × op × N ∈ {1,2,3,4,5,8} × sizes, bitwise against NumPy.

One pool of N rank processes serves every case for that N; each test sends one batch of
cases and gets back the list of failures seen by each rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import (
    ALL_DTYPES,
    make_input,
    op_arg,
    ops_for,
    reference_reduce,
    same_bits,
    sizes_for,
)

from ringtree.dtypes import DType
from ringtree.testing import RankPool

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 NumPy arrays need ml_dtypes")

NRANKS = [1, 2, 3, 4, 5, 8]
BIG = (16 << 20) // 4 + 3  # > 16 MiB of float32, not divisible by any N here


def _user_view(a: np.ndarray, dt: DType) -> np.ndarray:
    """Hand bfloat16 to ringtree as a real bfloat16 array, like a user would."""
    return a.view(ml_dtypes.bfloat16) if dt is DType.BFLOAT16 else a


def _check(failures: list, label: str, got: np.ndarray, want: np.ndarray) -> None:
    if not same_bits(got, want):
        bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8)) if got.shape == \
            want.shape else []
        failures.append(f"{label}: {len(bad)} wrong bytes (first at {bad[:3]})")


def reduction_cases(comm, coll: str, dtypes: list[str], sizes: list[int], algo=None):
    n = comm.size
    failures: list[str] = []
    for dname in dtypes:
        dt = DType(dname)
        for op in ops_for(dt):
            for count in sizes:
                for in_place in (False, True):
                    root = (count + len(op)) % n
                    label = f"{coll} {dname} {op} count={count} in_place={in_place} root={root}"
                    try:
                        _one_reduction(comm, coll, dt, op, count, in_place, root, algo,
                                       failures, label)
                    except Exception as e:  # noqa: BLE001 - report per case
                        failures.append(f"{label}: {type(e).__name__}: {e}")
                        return failures
    return failures


def _one_reduction(comm, coll, dt, op, count, in_place, root, algo, failures, label):
    n, r = comm.size, comm.rank
    if coll == "reduce_scatter":
        if count > 1000:  # keep the total (not the per-rank block) at the multi-slice size
            count = count // n + 1
        inputs = [make_input(q, count * n, dt, op) for q in range(n)]
        full = reference_reduce(inputs, dt, op)
        want = full[r * count:(r + 1) * count]
        x = inputs[r].copy()
        if in_place:
            out = x[r * count:(r + 1) * count]
            comm.reduce_scatter(_user_view(x, dt), op_arg(op), out=_user_view(out, dt),
                                algo=algo)
            _check(failures, label, out, want)
        else:
            out = np.empty(count, dtype=dt.storage)
            comm.reduce_scatter(_user_view(x, dt), op_arg(op), out=_user_view(out, dt),
                                algo=algo)
            _check(failures, label, out, want)
            _check(failures, label + " (input preserved)", x, inputs[r])
        return
    inputs = [make_input(q, count, dt, op) for q in range(n)]
    want = reference_reduce(inputs, dt, op)
    x = inputs[r].copy()
    if coll == "all_reduce":
        if in_place:
            comm.all_reduce(_user_view(x, dt), op_arg(op), algo=algo)
            _check(failures, label, x, want)
        else:
            out = np.empty_like(x)
            comm.all_reduce(_user_view(x, dt), op_arg(op), out=_user_view(out, dt), algo=algo)
            _check(failures, label, out, want)
            _check(failures, label + " (input preserved)", x, inputs[r])
    elif coll == "reduce":
        out = None if in_place else np.empty_like(x)
        comm.reduce(_user_view(x, dt), root, op_arg(op),
                    out=None if out is None else _user_view(out, dt), algo=algo)
        if r == root:
            _check(failures, label, x if in_place else out, want)
        if r != root or not in_place:
            _check(failures, label + " (input preserved)", x, inputs[r])


def movement_cases(comm, coll: str, dtypes: list[str], sizes: list[int], algo=None):
    n = comm.size
    failures: list[str] = []
    for dname in dtypes:
        dt = DType(dname)
        for count in sizes:
            root = count % n
            label = f"{coll} {dname} count={count} root={root}"
            try:
                _one_movement(comm, coll, dt, count, root, algo, failures, label)
            except Exception as e:  # noqa: BLE001
                failures.append(f"{label}: {type(e).__name__}: {e}")
                return failures
    return failures


def _one_movement(comm, coll, dt, count, root, algo, failures, label):
    n, r = comm.size, comm.rank
    data = [make_input(q, count, dt, "move") for q in range(n)]
    mine = data[r].copy()
    u = lambda a: _user_view(a, dt)  # noqa: E731
    if coll == "all_gather":
        out = np.empty((n, count), dtype=dt.storage)
        comm.all_gather(u(mine), out=u(out), algo=algo)
        _check(failures, label, out.reshape(-1), np.concatenate(data))
        _check(failures, label + " (input preserved)", mine, data[r])
        buf = np.zeros((n, count), dtype=dt.storage)  # in place: input is my block
        buf[r] = data[r]
        comm.all_gather(u(buf[r]), out=u(buf), algo=algo)
        _check(failures, label + " in place", buf.reshape(-1), np.concatenate(data))
    elif coll == "broadcast":
        x = data[root].copy() if r == root else np.zeros(count, dtype=dt.storage)
        comm.broadcast(u(x), root, algo=algo)
        _check(failures, label, x, data[root])
    elif coll == "gather":
        out = comm.gather(u(mine), root, algo=algo)
        if r == root:
            _check(failures, label, np.asarray(out).view(dt.storage).reshape(-1),
                   np.concatenate(data))
        else:
            assert out is None
    elif coll == "scatter":
        blocks = [make_input(q + 100, count, dt, "move") for q in range(n)]
        x = np.concatenate(blocks) if r == root else None
        out = np.empty(count, dtype=dt.storage)
        comm.scatter(None if x is None else u(x), root, out=u(out), algo=algo)
        _check(failures, label, out, blocks[r])
    elif coll == "all_to_all":
        send = [make_input(100 * r + q, count, dt, "move") for q in range(n)]
        x = np.concatenate(send)
        out = np.empty_like(x)
        comm.all_to_all(u(x), out=u(out), algo=algo)
        want = np.concatenate([make_input(100 * q + r, count, dt, "move") for q in range(n)])
        _check(failures, label, out, want)
        comm.all_to_all(u(x), out=u(x), algo=algo)  # in place
        _check(failures, label + " in place", x, want)
        # uneven: rank r sends (r + q) % 3 rows to rank q
        ss = [(r + q) % 3 for q in range(n)]
        rs = [(q + r) % 3 for q in range(n)]
        rows = [make_input(1000 + 10 * r + q, ss[q] * 2, dt, "move") for q in range(n)]
        x = np.concatenate(rows).reshape(-1, 2) if sum(ss) else np.empty((0, 2), dt.storage)
        got = comm.all_to_all(u(x), send_splits=ss, recv_splits=rs)
        want = [make_input(1000 + 10 * q + r, rs[q] * 2, dt, "move") for q in range(n)]
        _check(failures, label + " uneven", np.asarray(got).view(dt.storage).reshape(-1),
               np.concatenate(want) if want else np.empty(0, dt.storage))
    elif coll == "send_recv":
        nxt, prv = (r + 1) % n, (r - 1) % n
        if n == 1:
            return
        got = np.empty(count, dtype=dt.storage)
        with comm.group():
            comm.send(u(mine), nxt)
            comm.recv(u(got), prv)
        _check(failures, label, got, data[prv])
    elif coll == "barrier":
        comm.barrier()


@pytest.fixture(scope="module", params=NRANKS, ids=lambda n: f"n{n}")
def pool(request):
    with RankPool(request.param) as p:
        yield p


def _assert_clean(results):
    for r, fails in enumerate(results):
        assert not isinstance(fails, BaseException), f"rank {r}: {fails!r}"
        assert not fails, f"rank {r}: " + "\n".join(fails[:10])


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter", "reduce"])
def test_reductions_every_dtype_and_op(pool, coll):
    sizes = sizes_for(pool.nranks)[:4]
    _assert_clean(pool.run(reduction_cases, coll, [d.value for d in ALL_DTYPES], sizes))


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter", "reduce"])
def test_reductions_multi_slice(pool, coll):
    sizes = [sizes_for(pool.nranks)[-1]]
    _assert_clean(pool.run(reduction_cases, coll, ["float32", "bfloat16", "int64"], sizes))


@pytest.mark.parametrize("coll", ["all_gather", "broadcast", "gather", "scatter",
                                  "all_to_all", "send_recv", "barrier"])
def test_data_movement(pool, coll):
    sizes = sizes_for(pool.nranks)
    _assert_clean(pool.run(movement_cases, coll, ["int8", "float16", "float64", "bfloat16"],
                           sizes))


def big_all_reduce(comm):
    x = make_input(comm.rank, BIG, DType.FLOAT32, "sum")
    want = reference_reduce([make_input(q, BIG, DType.FLOAT32, "sum")
                             for q in range(comm.size)], DType.FLOAT32, "sum")
    comm.all_reduce(x)
    gathered = comm.all_gather(x[:: 4096].copy())
    return same_bits(x, want), all(same_bits(g, gathered[0]) for g in gathered)


def test_all_reduce_16mib(pool):
    for r, (exact, agree) in enumerate(pool.run_ok(big_all_reduce)):
        assert exact, f"rank {r}: 16 MiB all_reduce differs from the reference"
        assert agree, f"rank {r}: ranks disagree"


def user_ops(comm):
    n = comm.size
    x = np.arange(10, dtype=np.int32) * (comm.rank + 1)
    comm.all_reduce(x, np.maximum)
    y = np.arange(10, dtype=np.float64) + comm.rank
    comm.all_reduce(y, lambda a, b: np.minimum(a, b))
    return same_bits(x, np.arange(10, dtype=np.int32) * n), same_bits(y, np.arange(10.0))


def test_user_defined_ops(pool):
    for r, res in enumerate(pool.run_ok(user_ops)):
        assert all(res), f"rank {r}: {res}"


def async_and_group(comm):
    n = comm.size
    xs = [np.full(1000, comm.rank + i, dtype=np.int64) for i in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    sync = comm.all_reduce(np.ones(3, np.int64))  # waits behind the async ones
    for w in works:
        w.wait(timeout=60)
        assert w.is_completed()
    with comm.group():
        ys = [comm.all_reduce(np.full(7, i, dtype=np.int64)) for i in range(3)]
    base = n * (n - 1) // 2
    return ([int(x[0]) for x in xs] == [base + i * n for i in range(4)]
            and int(sync[0]) == n and [int(y[0]) for y in ys] == [i * n for i in range(3)])


def test_async_and_group(pool):
    assert all(pool.run_ok(async_and_group))


def split_comms(comm):
    n, r = comm.size, comm.rank
    sub = comm.split(color=r % 2, key=-r)
    none = comm.split(color=-1)
    assert none is None
    members = [q for q in range(n) if q % 2 == r % 2]
    x = np.array([r], dtype=np.int64)
    sub.all_reduce(x)
    res = (sub.size == len(members), sub.rank == sorted(members, reverse=True).index(r),
           int(x[0]) == sum(members))
    sub.close()
    return res


def test_split(pool):
    for r, res in enumerate(pool.run_ok(split_comms)):
        assert all(res), f"rank {r}: {res}"


def determinism(comm):
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(100_003).astype(np.float32)  # inexact sums: order matters
    a, b = x.copy(), x.copy()
    comm.all_reduce(a)
    comm.all_reduce(b)
    everyone = comm.all_gather(a)
    return same_bits(a, b), all(same_bits(e, a) for e in everyone)


def test_bitwise_identical_and_repeatable(pool):
    for r, (repeat, agree) in enumerate(pool.run_ok(determinism)):
        assert repeat and agree, f"rank {r}: repeat={repeat} agree={agree}"
