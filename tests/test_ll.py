"""The LL protocol on its own (ringtree.transports.shm_ll, runtime.protocols.ll): every
collective it serves,
bitwise against NumPy, on real processes; slow and fast ranks; a killed rank; mismatched
calls; many ranks on few cores."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest
from collective_cases import make_input, op_arg, ops_for, reference_reduce, same_bits

from ringtree.dtypes import DType
from ringtree.errors import MismatchError, PeerError
from ringtree.ir.program import Collective
from ringtree.ir.wire import PROTO_SIMPLE, WireHeader, algo_code
from ringtree.ops import resolve
from ringtree.runtime.protocols.ll import LLCollectives
from ringtree.testing import RankPool, run_ranks
from ringtree.transports.shm_ll import INLINE, open_ll

CELL = 8192
_N = 0


def simple_head(coll: int, dtype: int, op: int, root: int, count: int) -> tuple:
    """The header words a call that runs on Simple announces (algorithm ``direct``)."""
    return WireHeader(0, count, 0, algo_code("direct"), coll, dtype, op, PROTO_SIMPLE,
                      root).call_words()


def _ll(comm, name: str, **kw) -> LLCollectives:
    ll = open_ll(comm.store, f"{comm.prefix}/{name}", comm.rank, comm.size, 30.0,
                 cell_bytes=kw.get("cell", CELL), spin_us=kw.get("spin", 20.0),
                 yield_us=kw.get("yield_us", 2000.0))
    return LLCollectives(ll, kw.get("timeout", 30.0))


def _counts(dt: DType, n: int, coll: str) -> list[int]:
    per = n if coll == "reduce_scatter" else 1
    inline = INLINE // dt.itemsize // per
    cell = CELL // dt.itemsize // per
    return sorted({0, 1, 3, inline, inline + 1, cell - 1, cell})


def matrix(comm, name: str, dtypes: list[str]) -> list[str]:
    c = _ll(comm, name)
    n, r = comm.size, comm.rank
    bad: list[str] = []
    try:
        for dname in dtypes:
            dt = DType(dname)
            for coll in ("all_reduce", "reduce", "reduce_scatter"):
                for op in ops_for(dt):
                    red = resolve(op_arg(op), dt)
                    for count in _counts(dt, n, coll):
                        per = count * n if coll == "reduce_scatter" else count
                        ins = [make_input(q, per, dt, op) for q in range(n)]
                        want = reference_reduce(ins, dt, op)
                        x = ins[r].copy()
                        root = (count + len(op)) % n
                        if coll == "all_reduce":
                            got = c.all_reduce(x, dt, red)
                        elif coll == "reduce":
                            got = c.reduce(x, dt, red, root)
                            if r != root:
                                if not same_bits(x, ins[r]):
                                    bad.append(f"reduce changed a non-root input {dname}")
                                continue
                        else:
                            got = c.reduce_scatter(x, dt, red)
                            want = want[r * count:(r + 1) * count]
                        if not same_bits(got, want):
                            bad.append(f"{coll} {dname} {op} count={count}")
            for count in _counts(dt, n, "all_gather"):
                ins = [make_input(q, count, dt, "move") for q in range(n)]
                got = c.all_gather(ins[r], dt)
                if not same_bits(got, np.concatenate(ins)):
                    bad.append(f"all_gather {dname} count={count}")
                root = count % n
                b = ins[r].copy()
                c.broadcast(b, dt, root)
                if not same_bits(b, ins[root]):
                    bad.append(f"broadcast {dname} count={count} root={root}")
            c.barrier()
    finally:
        c.ll.close()
    return bad


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"n{n}")
def pool(request):
    with RankPool(request.param) as p:
        yield p


def test_every_collective_dtype_and_op(pool):
    global _N
    _N += 1
    dtypes = [d.value for d in DType] if pool.nranks in (2, 3) else \
        ["float32", "bfloat16", "int8", "uint64"]
    for r, bad in enumerate(pool.run_ok(matrix, f"m{_N}", dtypes)):
        assert not bad, f"rank {r}: " + "; ".join(bad[:8])


def agreement(comm, name: str) -> list[bytes]:
    """Random floats (inexact sums): every rank must hold the same bits."""
    c = _ll(comm, name)
    rng = np.random.default_rng(comm.rank)
    out = []
    for count in (2, 12, 700, CELL // 4):
        x = rng.standard_normal(count).astype(np.float32) * 1e3
        out.append(c.all_reduce(x, DType.FLOAT32, resolve("sum", DType.FLOAT32)).tobytes())
    c.ll.close()
    return out


def test_ranks_agree_bitwise(pool):
    global _N
    _N += 1
    res = pool.run_ok(agreement, f"a{_N}")
    assert all(r == res[0] for r in res)


def sleepy(comm, calls: int) -> int:
    """One rank naps at random between calls, the others race ahead; each call's
    result is checked, inline and cell sizes alternating (both parities, both kinds),
    with Simple calls' announcements in between (they shift the parities)."""
    c = _ll(comm, "sleepy", spin=0.0, yield_us=200.0)
    n, r = comm.size, comm.rank
    rng = random.Random(r)
    red = resolve("sum", DType.INT64)
    bad = 0
    for k in range(calls):
        if r == n - 1 and rng.random() < 0.2:
            time.sleep(rng.random() * 0.002)
        elif rng.random() < 0.05:
            time.sleep(rng.random() * 0.0005)
        count = 3 if k % 3 else 900
        if k % 5 == 0:  # calls that run on Simple announce themselves and do not wait
            for _ in range(k % 3 + 1):
                c.ll.announce(simple_head(0, 0, 0, -1, 1))
        x = np.full(count, (k + 1) * (r + 1), np.int64)
        c.all_reduce(x, DType.INT64, red)
        bad += int(not (x == (k + 1) * n * (n + 1) // 2).all())
        if k % 7 == 0:
            g = c.all_gather(np.array([k, r], np.int64), DType.INT64).reshape(n, 2)
            bad += int(not ((g[:, 0] == k).all() and (g[:, 1] == np.arange(n)).all()))
    c.ll.close()
    return bad


def test_sleepy_rank_and_racing_ranks():
    assert run_ranks(sleepy, 3, 1000, timeout=120) == [0, 0, 0]


def killed(comm):
    pids = comm.all_gather(np.array([os.getpid()], np.int64)).reshape(-1).tolist()
    c = _ll(comm, "kill", spin=0.0, yield_us=500.0)
    x = np.ones(2, np.float32)
    for _ in range(20):
        c.all_reduce(x, DType.FLOAT32, resolve("sum", DType.FLOAT32))
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        c.all_reduce(x, DType.FLOAT32, resolve("sum", DType.FLOAT32))
    except PeerError as e:
        return pids, e.peer, str(e)
    return pids, None, "no error"


def test_killed_rank_is_named_and_nothing_is_left():
    res = run_ranks(killed, 3, timeout=60)
    assert isinstance(res[2], BaseException)  # it died
    for r in (0, 1):
        pids, peer, msg = res[r]
        assert peer == 2 and "rank 2" in msg, msg
    left = [f for f in os.listdir("/dev/shm") if any(f"-p{p}-" in f for p in res[0][0])]
    assert not left, left


def mismatched(comm, what: str):
    c = _ll(comm, "mm" + what)
    r = comm.rank
    red = resolve("sum", DType.FLOAT32)
    c.all_reduce(np.ones(4, np.float32), DType.FLOAT32, red)  # in step first
    try:
        if what == "count":
            c.all_reduce(np.ones(5 if r == 1 else 4, np.float32), DType.FLOAT32, red)
        elif what == "dtype":
            dt = DType.FLOAT64 if r == 1 else DType.FLOAT32
            c.all_reduce(np.ones(4, dt.storage), dt, resolve("sum", dt))
        elif what == "protocol":  # rank 1 runs this call on Simple: it only announces it
            op = c.op(Collective.ALL_REDUCE, DType.FLOAT32, 4, red)
            if r == 1:
                c.ll.announce(simple_head(op.coll.code, DType.FLOAT32.code, red.code, -1, 4))
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:  # as the Simple path's idle check does
                    c.ll.check_announced(op.describe)
                    time.sleep(0.01)
            else:
                op.run(np.ones(4, np.float32), np.empty(4, np.float32), red, 30.0)
        else:  # another collective
            if r == 1:
                c.broadcast(np.ones(4, np.float32), DType.FLOAT32, 0)
            else:
                c.all_reduce(np.ones(4, np.float32), DType.FLOAT32, red)
    except MismatchError as e:
        return str(e)
    finally:
        c.ll.close()
    return None


@pytest.mark.parametrize("what", ["count", "dtype", "collective", "protocol"])
def test_mismatch_raises_on_every_rank(what):
    res = run_ranks(mismatched, 3, what, timeout=60)
    for r, msg in enumerate(res):
        assert isinstance(msg, str), f"rank {r}: {msg!r}"
        assert f"{what}: rank" in msg and "rank 1" in msg, msg
        if r != 1:  # rank 1 may find either of the others first
            assert f"rank {r}" in msg, msg


def crowded(comm, calls: int, compiled: bool = False) -> int:
    """``calls`` exact all-reduces with no spinning; ``compiled``: also count it wrong when
    the calls did not run in the compiled kernel."""
    c = _ll(comm, "crowd", spin=0.0, yield_us=2000.0)
    n, r = comm.size, comm.rank
    red = resolve("sum", DType.INT32)
    bad = 0
    for k in range(calls):
        x = np.array([k, r], np.int32)
        c.all_reduce(x, DType.INT32, red)
        bad += int(x[0] != k * n or x[1] != n * (n - 1) // 2)
    if compiled:
        bad += c.op(Collective.ALL_REDUCE, DType.INT32, 2, red).k is None
    c.ll.close()
    return bad


def test_eight_ranks_on_two_cores_complete():
    assert run_ranks(crowded, 8, 2000, timeout=180) == [0] * 8


def test_quiet_reduction_overflows_silently_and_restores_the_error_state():
    import warnings

    from ringtree.ops import quiet

    big = np.full(3, 3e38, np.float32)
    out = np.empty(3, np.float32)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet(np.add, big, big, out)
    assert np.isinf(out).all() and np.geterr() == before
