"""ringtree as a torch.distributed backend: every collective against gloo, same inputs.

One pool of 2 ranks (and a small one of 3 for subgroups and uneven splits) runs all cases;
each case runs the operation on the ringtree group (WORLD) and on a gloo group over the
same ranks and compares the outputs bitwise (inputs are small integers, so sums are exact
in any order).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from datetime import timedelta  # noqa: E402

from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def pool():
    with TorchRankPool(2, pg_timeout=60) as p:
        yield p


@pytest.fixture(scope="module")
def pool3():
    with TorchRankPool(3, pg_timeout=60) as p:
        yield p


def _both(ctx, fn):
    """fn(group) on ringtree, then on gloo; returns (ringtree result, gloo result)."""
    return fn(ctx.group), fn(ctx.gloo)


def _data(rank, n=7, dtype=torch.float32, shift=0):
    """Small integers, different per rank: sums and products are exact in any order."""
    return (torch.arange(n, dtype=torch.float64) % 5 + rank * 3 + 1 + shift).to(dtype)


# ---- registration and identity ------------------------------------------------------------

def _identity(ctx):
    pg = ctx.group
    return (type(pg).__name__, pg.name(), dist.get_backend(), pg.group_name, pg.group_desc,
            pg.rank(), pg.size(), dist.get_rank(), dist.get_world_size())


def test_registered_backend_and_group_identity(pool):
    res = pool.run_ok(_identity)
    for r, (cls, name, backend, gname, gdesc, rank, size, grank, gsize) in enumerate(res):
        assert cls == "RingtreeProcessGroup"
        assert name == backend == "ringtree"
        assert gname == "0" and gdesc == "default_pg"
        assert (rank, size, grank, gsize) == (r, 2, r, 2)


# ---- all_reduce: every op, every dtype ----------------------------------------------------

_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def _all_reduce_ops(ctx):
    out = {}
    for name in _OPS:
        op = getattr(dist.ReduceOp, name)
        dtypes = [torch.int32, torch.int64, torch.uint8] if name.startswith("B") else \
            [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
             torch.bfloat16, torch.int8, torch.uint8]
        for dt in dtypes:
            if name == "AVG" and not dt.is_floating_point:
                continue  # gloo's integer AVG truncates differently from NCCL's
            def run(g, dt=dt, op=op):
                t = _data(ctx.rank, 9, dt)
                dist.all_reduce(t, op=op, group=g)
                return t
            out[(name, str(dt))] = _both(ctx, run)
    return out


def test_all_reduce_every_op_and_dtype_matches_gloo(pool):
    for res in pool.run_ok(_all_reduce_ops):
        for key, (mine, gloo) in res.items():
            assert mine.dtype == gloo.dtype, key
            assert torch.equal(mine, gloo), (key, mine, gloo)


def _premul_sum(ctx):
    res = {}
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for factor in (0.5, torch.tensor([2.0])):
            t = _data(ctx.rank, 6, dt)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
            f = float(factor) if not isinstance(factor, torch.Tensor) else factor.item()
            expect = sum(_data(r, 6, torch.float64) * f
                         for r in range(ctx.size)).to(dt)
            res[(str(dt), f)] = (t, expect)
    return res


def test_premul_sum(pool):
    """gloo has no PREMUL_SUM: compare against the definition (exact for these values)."""
    for res in pool.run_ok(_premul_sum):
        for key, (got, expect) in res.items():
            assert torch.equal(got, expect), (key, got, expect)


def _all_reduce_shapes(ctx):
    out = []
    for shape in [(), (0,), (1,), (3, 5), (2, 3, 4), (1000,), (70000,)]:
        base = torch.arange(torch.Size(shape).numel(), dtype=torch.float32)
        base = (base % 13 + ctx.rank).reshape(shape)
        out.append(_both(ctx, lambda g, b=base: _reduced(b.clone(), g)))
    return out


def _reduced(t, g):
    dist.all_reduce(t, group=g)
    return t


def test_all_reduce_shapes_and_sizes(pool):
    for res in pool.run_ok(_all_reduce_shapes):
        for mine, gloo in res:
            assert mine.shape == gloo.shape and torch.equal(mine, gloo)


def _special_tensors(ctx):
    res = {}
    # non-contiguous: every other column of a matrix (gloo reads the wrong elements here)
    m = torch.arange(24, dtype=torch.float32).reshape(4, 6) + ctx.rank * 100
    view = m[:, ::2]
    assert not view.is_contiguous()
    dist.all_reduce(view)
    expect = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    expect[:, ::2] = expect[:, ::2] * 2 + 100
    res["noncontiguous"] = (m, expect + torch.tensor([0, ctx.rank * 100.0] * 3))
    # complex (torch hands the group a real view)
    def cplx(g):
        t = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (ctx.rank + 1)
        dist.all_reduce(t, group=g)
        return t
    res["complex"] = _both(ctx, cplx)
    # gloo reduces neither int16 nor bool: compare with the definition
    t = torch.tensor([1, -2, 300, 32767, -32768], dtype=torch.int16) * (ctx.rank + 1)
    dist.all_reduce(t)
    res["int16 sum (wraps)"] = (t, torch.tensor([3, -6, 900, 32765, -32768],
                                                dtype=torch.int16))
    t = torch.tensor([1, -2, 300, 32767], dtype=torch.int16) * (ctx.rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    res["int16 min"] = (t, torch.tensor([1, -4, 300, -2], dtype=torch.int16))
    for op, expect in (("MAX", [True, False, True, True]), ("MIN", [False, False, True, False]),
                       ("SUM", [True, False, True, True])):
        b = torch.tensor([ctx.rank == 0, False, True, ctx.rank == 1])
        dist.all_reduce(b, op=getattr(dist.ReduceOp, op))
        res[f"bool {op}"] = (b, torch.tensor(expect))
    def bcast_bool(g):
        t = torch.tensor([ctx.rank == 0, True, False])
        dist.broadcast(t, 0, group=g)
        return t
    res["broadcast bool"] = _both(ctx, bcast_bool)
    return res


def test_noncontiguous_complex_int16_bool(pool):
    for res in pool.run_ok(_special_tensors):
        for key, (mine, gloo) in res.items():
            assert torch.equal(mine, gloo), (key, mine, gloo)


def _zero_copy(ctx):
    """A contiguous tensor is reduced in place: its storage never moves."""
    t = _data(ctx.rank, 4096)
    ptr = t.data_ptr()
    dist.all_reduce(t)
    bf = _data(ctx.rank, 4096, torch.bfloat16)
    bptr = bf.data_ptr()
    dist.all_reduce(bf)
    return ptr == t.data_ptr() and bptr == bf.data_ptr(), bf


def test_zero_copy_and_bfloat16(pool):
    res = pool.run_ok(_zero_copy)
    assert all(same for same, _ in res)
    expect = sum(_data(r, 4096, torch.float64) for r in range(2))
    assert torch.equal(res[0][1], expect.to(torch.bfloat16))


def _blocking_calls_stay_on_the_caller(ctx):
    """``dist.all_reduce(t)`` (torch's asyncOp False) runs on the calling thread: nothing
    is queued for the LL thread; ``async_op=True`` is (it must progress unwaited)."""
    ll = ctx.group.comm.ll
    queued = []
    submit = ll.submit
    ll.submit = lambda *a, **k: queued.append(1) or submit(*a, **k)
    try:
        t = _data(ctx.rank, 16)
        for _ in range(3):
            dist.all_reduce(t)
        dist.broadcast(t, 0)
        dist.barrier()
        blocking = len(queued)
        dist.all_reduce(t, async_op=True).wait()
    finally:
        ll.submit = submit
    return blocking, len(queued), t


def test_blocking_collectives_run_on_the_calling_thread(pool):
    res = pool.run_ok(_blocking_calls_stay_on_the_caller)
    assert [r[:2] for r in res] == [(0, 1), (0, 1)]
    assert torch.equal(res[0][2], res[1][2])


# ---- the other collectives --------------------------------------------------------------

def _collectives(ctx):
    n, r = ctx.size, ctx.rank
    res = {}

    for root in range(n):
        def bcast(g, root=root):
            t = _data(ctx.rank, 5)
            dist.broadcast(t, src=root, group=g)
            return t
        res[f"broadcast root {root}"] = _both(ctx, bcast)

        def red(g, root=root):
            t = _data(ctx.rank, 5)
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX, group=g)
            return t if r == root else None  # other ranks' buffers are unspecified
        res[f"reduce root {root}"] = _both(ctx, red)

        def gather(g, root=root):
            lst = [torch.zeros(4) for _ in range(n)] if r == root else None
            dist.gather(_data(ctx.rank, 4), gather_list=lst, dst=root, group=g)
            return lst
        res[f"gather root {root}"] = _both(ctx, gather)

        def scatter(g, root=root):
            out = torch.zeros(3, dtype=torch.int64)
            lst = [torch.arange(3) + 10 * k for k in range(n)] if r == root else None
            dist.scatter(out, scatter_list=lst, src=root, group=g)
            return out
        res[f"scatter root {root}"] = _both(ctx, scatter)

    def all_gather(g):
        out = [torch.zeros(3, 2) for _ in range(n)]
        dist.all_gather(out, _data(ctx.rank, 6).reshape(3, 2), group=g)
        return out
    res["all_gather"] = _both(ctx, all_gather)

    def all_gather_into(g):
        out = torch.zeros(n * 5, dtype=torch.float64)
        dist.all_gather_single(out, _data(ctx.rank, 5, torch.float64), group=g)
        return out
    res["all_gather_single"] = _both(ctx, all_gather_into)

    def all_gather_into_2d(g):  # gloo takes only the flat form
        out = torch.zeros(n, 5, dtype=torch.int32) if g is ctx.group else \
            torch.zeros(n * 5, dtype=torch.int32)
        dist.all_gather_single(out, _data(ctx.rank, 5, torch.int32), group=g)
        return out.reshape(n, 5)
    res["all_gather_into_tensor stacked"] = _both(ctx, all_gather_into_2d)

    def reduce_scatter(g):
        out = torch.zeros(4)
        dist.reduce_scatter(out, [_data(ctx.rank, 4, shift=k) for k in range(n)], group=g)
        return out
    res["reduce_scatter"] = _both(ctx, reduce_scatter)

    def reduce_scatter_tensor(g):
        out = torch.zeros(3, dtype=torch.float64)
        inp = _data(ctx.rank, 3 * n, torch.float64)
        dist.reduce_scatter_single(out, inp, op=dist.ReduceOp.SUM, group=g)
        return out, inp
    res["reduce_scatter_single"] = _both(ctx, reduce_scatter_tensor)

    def reduce_scatter_avg(g):
        out = torch.zeros(3, dtype=torch.float32)
        dist.reduce_scatter_single(out, _data(ctx.rank, 3 * n), op=dist.ReduceOp.AVG, group=g)
        return out
    res["reduce_scatter_tensor avg"] = _both(ctx, reduce_scatter_avg)

    def all_to_all_single(g):
        out = torch.zeros(2 * n, 3)
        dist.all_to_all_single(out, _data(ctx.rank, 6 * n).reshape(2 * n, 3), group=g)
        return out
    res["all_to_all_single"] = _both(ctx, all_to_all_single)

    def all_to_all_splits(g):
        send = [k + 1 + r for k in range(n)]          # rows for each peer
        recv = [r + 1 + k for k in range(n)]          # rows from each peer
        inp = (torch.arange(sum(send) * 2, dtype=torch.float32) + 100 * r).reshape(-1, 2)
        out = torch.zeros(sum(recv), 2)
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send,
                               group=g)
        return out
    res["all_to_all_single splits"] = _both(ctx, all_to_all_splits)

    def all_to_all_list(g):
        ins = [torch.full((3,), float(10 * r + k)) for k in range(n)]
        outs = [torch.zeros(3) for _ in range(n)]
        dist.all_to_all(outs, ins, group=g)
        return outs
    res["all_to_all list"] = _both(ctx, all_to_all_list)

    # gloo needs equal sizes here; ringtree takes any: check against the definition
    ins = [torch.full((k + 1 + r,), float(10 * r + k)) for k in range(n)]
    outs = [torch.zeros(r + 1 + k) for k in range(n)]
    dist.all_to_all(outs, ins)
    res["all_to_all list uneven"] = (outs, [torch.full((r + 1 + k,), float(10 * k + r))
                                            for k in range(n)])

    def coalesced(g):
        ts = [_data(ctx.rank, 3), _data(ctx.rank, 5, shift=1)]
        with dist._coalescing_manager(group=g):
            for t in ts:
                dist.all_reduce(t, group=g)
        return ts
    res["coalescing manager"] = _both(ctx, coalesced)

    def all_reduce_coalesced(g):
        import warnings

        ts = [_data(ctx.rank, 4), _data(ctx.rank, 2, shift=2)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX, group=g)
        return ts
    res["all_reduce_coalesced"] = _both(ctx, all_reduce_coalesced)
    return res


def test_collectives_match_gloo(pool):
    for res in pool.run_ok(_collectives):
        for key, (mine, gloo) in res.items():
            _assert_same(mine, gloo, key)


def _assert_same(a, b, key):
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), key
        for x, y in zip(a, b):
            _assert_same(x, y, key)
    elif a is None:
        assert b is None, key
    else:
        assert a.dtype == b.dtype and torch.equal(a, b), (key, a, b)


def _async_and_futures(ctx):
    t = _data(ctx.rank, 8)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert work.wait() is True and work.is_completed() and work.is_success()
    chained = dist.all_reduce(_data(ctx.rank, 3), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2).wait()
    # is_completed() tells the truth: not while rank 1 has not joined, yes after wait()
    import time

    dist.barrier(group=ctx.gloo)
    if ctx.rank == 1:
        time.sleep(0.5)
    late = dist.all_reduce(torch.ones(2), async_op=True)
    pending = late.is_completed()
    late.wait()
    states = (pending, late.is_completed())
    return value[0] is t, t, chained, states


def test_async_work_future_resolves_to_outputs(pool):
    res = pool.run_ok(_async_and_futures)
    assert res[0][3] == (False, True)
    for same, t, chained, _ in res:
        assert same
        assert torch.equal(t, _data(0, 8)
                           + _data(1, 8))
        assert torch.equal(chained, 2 * (_data(0, 3)
                                         + _data(1, 3)))


# ---- point to point -------------------------------------------------------------------------

def _p2p(ctx):
    r, other = ctx.rank, 1 - ctx.rank
    res = {}
    # blocking send/recv
    if r == 0:
        dist.send(torch.arange(5.0), 1)
        got = torch.zeros(5)
        dist.recv(got, 1, tag=3)
    else:
        got = torch.zeros(5)
        dist.recv(got, 0)
        dist.send(got * 2, 0, tag=3)
    res["send/recv"] = got
    # both ranks isend then irecv large messages: must not deadlock
    big = torch.full((3 << 20,), float(r + 1))   # 12 MiB each way
    into = torch.zeros_like(big)
    s = dist.isend(big, other)
    q = dist.irecv(into, other)
    s.wait()
    q.wait()
    res["isend/irecv big"] = bool(torch.all(into == other + 1))
    # batch_isend_irecv ring exchange
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(r)), other),
           dist.P2POp(dist.irecv, (buf := torch.zeros(4)), other)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    res["batch"] = buf
    # p2p inside torch's coalescing manager: one Work for the lot (start/end_coalescing)
    into2 = torch.zeros(3)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.isend(torch.full((3,), float(10 + r)), other)
        dist.irecv(into2, other)
    cm.wait()
    res["coalesced p2p"] = into2
    # receive from any source
    if r == 1:
        dist.send(torch.tensor([42.0]), 0, tag=7)
        res["anysource"] = None
    else:
        x = torch.zeros(1)
        src = dist.recv(x, tag=7)
        res["anysource"] = (src, x.item())
    # send/recv of objects
    if r == 0:
        dist.send_object_list([{"a": 1}, "two"], dst=1)
    else:
        objs = [None, None]
        dist.recv_object_list(objs, src=0)
        res["objects"] = objs
    return res


def test_point_to_point(pool):
    r0, r1 = pool.run_ok(_p2p)
    assert torch.equal(r1["send/recv"], torch.arange(5.0))
    assert torch.equal(r0["send/recv"], torch.arange(5.0) * 2)
    assert r0["isend/irecv big"] and r1["isend/irecv big"]
    assert torch.equal(r0["batch"], torch.full((4,), 1.0))
    assert torch.equal(r1["batch"], torch.zeros(4))
    assert torch.equal(r0["coalesced p2p"], torch.full((3,), 11.0))
    assert torch.equal(r1["coalesced p2p"], torch.full((3,), 10.0))
    assert r0["anysource"] == (1, 42.0)
    assert r1["objects"] == [{"a": 1}, "two"]


# ---- objects, barrier -----------------------------------------------------------------------

def _objects(ctx):
    r, n = ctx.rank, ctx.size
    res = {}
    for name, g in (("ringtree", ctx.group), ("gloo", ctx.gloo)):
        objs = [None] * n
        dist.all_gather_object(objs, {"rank": r, "payload": "x" * (r * 1000)}, group=g)
        lst = [f"from {r}", r] if r == 0 else [None, None]
        dist.broadcast_object_list(lst, src=0, group=g)
        gathered = [None] * n if r == 1 else None
        dist.gather_object(("g", r), gathered, dst=1, group=g)
        out = [None]
        dist.scatter_object_list(out, [[k] * k for k in range(n)] if r == 0 else None,
                                 src=0, group=g)
        dist.barrier(group=g)
        res[name] = (objs, lst, gathered, out)
    return res


def test_object_collectives_and_barrier(pool):
    for res in pool.run_ok(_objects):
        assert res["ringtree"] == res["gloo"]


# ---- groups ----------------------------------------------------------------------------------

def _subgroups(ctx):
    r = ctx.rank
    # made by its members only (first: torch names such groups by the number of groups
    # each member already has, so members must have made the same groups before)
    local = dist.new_group([1, 2], use_local_synchronization=True) if r else None
    sub = dist.new_group([0, 2], group_desc="edges")
    gsub = dist.new_group([0, 2], backend="gloo")
    res = {"member": sub is not dist.GroupMember.NON_GROUP_MEMBER}
    if res["member"]:
        res["backend"] = dist.get_backend(sub)
        res["desc"] = sub.group_desc
        res["grank"] = dist.get_rank(sub)
        for name, g in (("ringtree", sub), ("gloo", gsub)):
            t = torch.full((3,), float(r + 1))
            dist.all_reduce(t, group=g)
            b = torch.full((2,), float(r))
            dist.broadcast(b, src=2, group=g)
            res[name] = (t, b)
    # uneven all_to_all over 3 ranks
    def a2a(g):
        send = [(r + k) % 3 for k in range(3)]
        recv = [(k + r) % 3 for k in range(3)]
        inp = torch.arange(sum(send), dtype=torch.float64) + 10 * r
        out = torch.zeros(sum(recv), dtype=torch.float64)
        dist.all_to_all_single(out, inp, recv, send, group=g)
        return out
    res["a2a"] = _both(ctx, a2a)
    if local is not None:
        t = torch.ones(2) * r
        dist.all_reduce(t, group=local)
        res["local"] = t
    res["world"] = _reduced(torch.ones(1), None)
    return res


def test_new_group_subsets_and_non_members(pool3):
    r0, r1, r2 = pool3.run_ok(_subgroups)
    assert r0["member"] and r2["member"] and not r1["member"]
    for res in (r0, r2):
        assert res["backend"] == "ringtree" and res["desc"] == "edges"
        _assert_same(res["ringtree"], res["gloo"], "subgroup")
        assert torch.equal(res["ringtree"][0], torch.full((3,), 4.0))
    assert (r0["grank"], r2["grank"]) == (0, 1)
    for res in (r0, r1, r2):
        _assert_same(*res["a2a"], "a2a 3 ranks")
        assert torch.equal(res["world"], torch.full((1,), 3.0))
    assert torch.equal(r1["local"], torch.full((2,), 3.0))


def _in_flight(ctx, rounds):
    """Many async collectives on distinct tensors plus p2p, all in flight at once."""
    r, n = ctx.rank, ctx.size
    sizes = [1, 1000, 70000, 300000, 1 << 20]
    for k in range(rounds):
        ts = [torch.full((s,), float(r + 1)) for s in sizes]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        nxt, prv = (r + 1) % n, (r - 1) % n
        got = torch.empty(1 << 19)
        works += dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((1 << 19,),
                                                                           float(r)), nxt),
                                         dist.P2POp(dist.irecv, got, prv)])
        bs = [torch.full((s,), float(r)) for s in sizes[:3]]
        works += [dist.broadcast(b, src=k % n, async_op=True) for b in bs]
        for w in works:
            w.wait()
        assert all(torch.all(t == n * (n + 1) / 2) for t in ts), k
        assert torch.all(got == prv) and all(torch.all(b == k % n) for b in bs), k
    return True


def test_many_operations_in_flight_at_once(pool3):
    assert pool3.run_ok(_in_flight, 5) == [True] * 3


# ---- failures --------------------------------------------------------------------------------

def _timeout(ctx):
    g = dist.new_group(backend="ringtree", timeout=timedelta(seconds=1.5))
    if ctx.rank == 1:
        return "skipped"
    t = torch.ones(4)
    try:
        dist.all_reduce(t, group=g)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_stuck_collective_raises_naming_rank_and_collective(pool):
    r0, r1 = pool.run_ok(_timeout)
    assert r1 == "skipped"
    assert "CollectiveTimeout" in r0 and "rank 0" in r0 and "all_reduce" in r0, r0
    assert "seq" in r0 and "rank 1" in r0, r0
    # the pool's other groups are untouched
    res = pool.run_ok(_all_reduce_shapes)
    assert all(torch.equal(a, b) for rs in res for a, b in rs)


def _mismatch(ctx):
    g = dist.new_group(backend="ringtree", timeout=timedelta(seconds=20))
    t = torch.ones(4 + ctx.rank)  # rank 1 brings 5 elements
    try:
        dist.all_reduce(t, group=g)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_ranks_disagreeing_get_a_mismatch_error(pool):
    for msg in pool.run_ok(_mismatch):
        assert "MismatchError" in msg or "CommAborted" in msg, msg
        assert "4" in msg and "5" in msg, msg


def _abort(ctx):
    import time

    g = dist.new_group(backend="ringtree", timeout=timedelta(seconds=30))
    dist.barrier(group=g)
    if ctx.rank == 0:
        time.sleep(0.3)
        g.abort()
        return "aborted"
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(3), group=g)  # rank 0 never joins
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
    return "no error"


def test_abort_fails_peers_promptly(pool):
    r0, r1 = pool.run_ok(_abort)
    assert r0 == "aborted"
    assert r1.startswith("CommAborted") and "abort" in r1, r1
    assert float(r1.split(" after ")[1].split(" s")[0]) < 10, r1


def _p2p_over_tcp(ctx):
    return _p2p(ctx)


def test_point_to_point_over_tcp():
    with TorchRankPool(2, gloo=False, env={"RINGTREE_TRANSPORT": "tcp"}) as p:
        r0, r1 = p.run_ok(_p2p_over_tcp)
    assert r0["isend/irecv big"] and r1["isend/irecv big"]
    assert r0["anysource"] == (1, 42.0)
    assert r1["objects"] == [{"a": 1}, "two"]


# ---- functional collectives and device mesh ----------------------------------------------------

def _functional(ctx):
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh

    res = {}
    # results are AsyncCollectiveTensors: wait_tensor() is where torch waits on our Work
    res["fc all_reduce"] = fc.wait_tensor(fc.all_reduce(_data(ctx.rank, 4), "sum", ctx.group))
    res["fc all_gather"] = fc.wait_tensor(fc.all_gather_single(_data(ctx.rank, 3), 0,
                                                               ctx.group))
    res["fc reduce_scatter"] = fc.wait_tensor(fc.reduce_scatter_single(
        _data(ctx.rank, 4), "sum", 0, ctx.group))
    mesh = init_device_mesh("cpu", (ctx.size,), mesh_dim_names=("dp",))
    g = mesh.get_group("dp")
    res["mesh group backend"] = dist.get_backend(g)
    t = _data(ctx.rank, 4)
    dist.all_reduce(t, group=g)
    res["mesh all_reduce"] = t
    res["fc on mesh"] = fc.wait_tensor(fc.all_reduce(_data(ctx.rank, 2), "max", (mesh, 0)))
    return res


def test_functional_collectives_and_device_mesh(pool):
    res = pool.run_ok(_functional)
    a, b = (_data(k, 4) for k in range(2))
    for r in res:
        assert torch.equal(r["fc all_reduce"], a + b)
        assert torch.equal(r["fc all_gather"], torch.cat([a[:3], b[:3]]))
        assert r["mesh group backend"] == "ringtree"
        assert torch.equal(r["mesh all_reduce"], a + b)
        assert torch.equal(r["fc on mesh"], torch.maximum(a[:2], b[:2]))
    assert torch.equal(res[0]["fc reduce_scatter"], (a + b)[:2])
    assert torch.equal(res[1]["fc reduce_scatter"], (a + b)[2:])


# ---- how a job starts: init methods and launchers ---------------------------------------------

def _init_methods(ctx, tmpdir):
    import os

    from ringtree.torch import fill_torch_env

    r, n = ctx.rank, ctx.size
    port = int(os.environ["MASTER_PORT"])
    out = {}

    def check(name):
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t)
        out[name] = (dist.get_backend(), t)
        dist.destroy_process_group()

    dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=r,
                            world_size=n)
    check("tcp://")
    dist.init_process_group("ringtree", init_method=f"file://{tmpdir}/init", rank=r,
                            world_size=n)
    check("file://")
    store = dist.FileStore(f"{tmpdir}/store", n)
    dist.init_process_group("ringtree", store=store, rank=r, world_size=n)
    check("store=FileStore")
    store = dist.TCPStore("127.0.0.1", port, n, r == 0)
    dist.init_process_group("cpu:ringtree", store=store, rank=r, world_size=n)
    check("store=TCPStore, cpu:ringtree")

    # mpirun exports no RANK/WORLD_SIZE/MASTER_*: ringtree.torch fills them in
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                            "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    os.environ.update(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(n),
                      OMPI_MCA_ess_base_jobid=f"test-{port}")
    try:
        filled = fill_torch_env()
        dist.init_process_group("ringtree")
        check("mpirun environment")
        out["filled"] = sorted(filled)
    finally:
        for k in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_ess_base_jobid",
                  *filled):
            os.environ.pop(k, None)
        os.environ.update(saved)
    return out


def test_init_methods_and_mpirun_environment(tmp_path):
    with TorchRankPool(2, backend=None) as p:
        res = p.run_ok(_init_methods, str(tmp_path))
    for r in res:
        for name in ("tcp://", "file://", "store=FileStore", "store=TCPStore, cpu:ringtree",
                     "mpirun environment"):
            backend, t = r[name]
            assert backend in ("ringtree", "cpu:ringtree"), (name, backend)
            assert torch.equal(t, torch.full((3,), 3.0)), name
        assert r["filled"] == ["LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                               "RANK", "WORLD_SIZE"]


@pytest.mark.parametrize("launcher", ["ringtree run", "torchrun"])
def test_example_runs_under_launchers(launcher):
    import os
    import shutil
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = [os.path.join(root, "examples", "ddp_train.py"), "--steps", "3", "--width", "16"]
    if launcher == "torchrun":
        if shutil.which("torchrun") is None:
            pytest.skip("torchrun is not on PATH")
        cmd = ["torchrun", "--standalone", "--nproc-per-node", "2", *script]
    else:
        cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "2", "--timeout", "120",
               sys.executable, *script]
    # PYTHONFAULTHANDLER: should a rank abort at exit, every thread's Python stack is in
    # the assertion message below
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root, PYTHONFAULTHANDLER="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks over ringtree" in proc.stdout
    assert "parameters identical on every rank: True" in proc.stdout
