"""The ``dist.*`` fast path (:mod:`ringtree.torch.fastpath`) against the general one.

A call of a contiguous NumPy-typed tensor runs through cached NumPy views straight into
the communicator: a blocking one (``async_op=False``) to its end, an async one issued
there with a :class:`~ringtree.torch.work.PendingWork` over the communicator's Work. The
general path (:class:`~ringtree.torch.collectives.CollectiveOps`: staging, a
``RingtreeWork``) is what the rest takes. Both must give the same bits, follow a tensor
whose memory changes, and let errors reach the caller (a dead peer: ``test_torch_shrink``
kills a rank under a fast-path all-reduce).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra")
dist = pytest.importorskip("torch.distributed")

from contextlib import contextmanager  # noqa: E402
from datetime import timedelta  # noqa: E402

from ringtree.torch.collectives import CollectiveOps  # noqa: E402
from ringtree.torch.testing import TorchRankPool  # noqa: E402
from ringtree.torch.work import PendingWork  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def pool():
    with TorchRankPool(2, gloo=False, pg_timeout=60) as p:
        yield p


def _data(rank: int, n: int, dtype) -> torch.Tensor:
    """Small integers per rank: sums, products and maxima are exact in any order."""
    return (torch.arange(n, dtype=torch.float64) % 3 + rank + 1).to(dtype)


# the group's entries the fast path takes, under torch 2.13's names and the older ones
_ENTRIES = ("allreduce", "broadcast", "reduce", "all_gather_single", "_allgather_base",
            "reduce_scatter_single", "_reduce_scatter_base")


@contextmanager
def _general(group):
    """``group``'s calls on the general path: each entry the general method itself."""
    for name in _ENTRIES:
        setattr(group, name, getattr(CollectiveOps, name).__get__(group))
    try:
        yield
    finally:
        for name in _ENTRIES:
            delattr(group, name)


def _three(group, fn, *tensors):
    """fn(*copies, async_op) blocking, async and on the general path, on copies of
    ``tensors``: the three results, and whether the async call's Work was the fast
    path's."""
    out, pending = [], None
    for async_op, general in ((False, False), (True, False), (True, True)):
        copies = [t.clone() for t in tensors]
        if general:
            with _general(group):
                fn(*copies, async_op).wait()
        else:
            w = fn(*copies, async_op)
            if w is not None:
                pending = type(w) is PendingWork
                w.wait()
        out.append(copies)
    return out, pending


def _same_bits(ctx):
    r, n = ctx.rank, ctx.size
    runs = []
    for dtype in (torch.float32, torch.float64, torch.int64, torch.uint8):
        for k in (7, 300_000):  # cached views, and a view too large to keep
            x = _data(r, k, dtype)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
                runs.append(_three(ctx.group, lambda t, a, op=op: dist.all_reduce(
                    t, op, async_op=a), x))
                runs.append(_three(ctx.group, lambda t, a, op=op: dist.reduce(
                    t, 1, op, async_op=a), x))
            runs.append(_three(ctx.group, lambda t, a: dist.broadcast(t, 1, async_op=a), x))
            runs.append(_three(ctx.group, lambda o, i, a: dist.all_gather_into_tensor(
                o, i, async_op=a), torch.zeros(k * n, dtype=dtype), x))
            big = _data(r, k * n, dtype)
            runs.append(_three(ctx.group, lambda o, i, a: dist.reduce_scatter_tensor(
                o, i, async_op=a), torch.zeros(k, dtype=dtype), big))
    same = all(torch.equal(a, b) and torch.equal(a, c) for (blocking, fast, general), _ in runs
               for a, b, c in zip(blocking, fast, general))
    return same, all(p for _, p in runs), len(ctx.group._views or {}) > 0, runs[0][0][0][0]


def test_fast_paths_give_the_general_paths_bits(pool):
    res = pool.run_ok(_same_bits)
    for same, pending, cached, _ in res:
        assert same and pending and cached
    assert torch.equal(res[0][3], res[1][3])
    assert torch.equal(res[0][3], _data(0, 7, torch.float32) + _data(1, 7, torch.float32))


def _async_works(ctx):
    """Async fast-path calls in flight together, waited for in reverse order, with a
    future and its callback, and a wait with a timeout; bad arguments raise at the call."""
    r = ctx.rank
    ts = [torch.full((5,), float(r + k)) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    works.append(dist.broadcast(bc := torch.full((3,), float(r)), 1, async_op=True))
    seen = []
    fut = works[0].get_future().then(lambda f: seen.append(f.value()[0].tolist()))
    done = [w.wait(timeout=timedelta(seconds=30)) for w in reversed(works)]
    fut.wait()
    later = works[1].get_future().wait()  # asked for once the call is done
    states = [(w.is_completed(), w.is_success(), w.exception()) for w in works]
    try:
        dist.all_gather_into_tensor(torch.zeros(5), torch.ones(7), async_op=True)
        refused = None
    except Exception as e:  # noqa: BLE001 - what the caller sees
        refused = type(e).__name__
    return ([t.tolist() for t in ts], bc.tolist(), seen, later[0].tolist(), done, states,
            refused, repr(works[0]))


def test_async_fast_path_works_wait_in_any_order_with_futures(pool):
    for ts, bc, seen, later, done, states, refused, text in pool.run_ok(_async_works):
        assert ts == [[2.0 * k + 1] * 5 for k in range(4)] and bc == [1.0] * 3
        assert seen == [[1.0] * 5] and later == [3.0] * 5
        assert done == [True] * 5 and states == [(True, True, None)] * 5
        assert refused is not None and text == "<RingtreeWork allreduce done>"


def _async_timeout(ctx):
    """Rank 1 does not join rank 0's async all-reduce: rank 0's short wait gives up with
    the call still going, then the call's own deadline fails it, in torch's words."""
    if ctx.rank == 1:
        return None
    opts = dist.AllreduceOptions()
    opts.asyncOp, opts.timeout = True, timedelta(seconds=1)
    w = ctx.group.allreduce([torch.ones(4)], opts)
    out = [type(w).__name__]
    for wait in (lambda: w.wait(timeout=timedelta(milliseconds=50)), w.wait):
        try:
            wait()
            out.append(None)
        except Exception as e:  # noqa: BLE001 - what the caller sees
            out.append((isinstance(e, dist.DistBackendError), str(e).splitlines()[0]))
    out.append((w.is_completed(), w.is_success(), w.exception() is w.exception()))
    return out


def test_async_fast_path_times_out_in_torchs_words():
    with TorchRankPool(2, gloo=False, pg_timeout=60) as p:
        res = p.run_ok(_async_timeout)[0]
    assert res[0] == "PendingWork"
    assert res[1][0] and "Timed out waiting 50ms for allreduce" in res[1][1]
    assert res[2][0] and "Timed out waiting 1000ms for allreduce" in res[2][1], res
    assert res[3] == (True, False, True)  # one error object, however often asked


def _follows_memory(ctx):
    """The view cache keys on the memory: new contents, a new storage (``set_``), a new
    tensor of the same shape, a non-contiguous one, a premultiplied sum."""
    r = ctx.rank
    t = torch.ones(16)
    dist.all_reduce(t)
    t.fill_(r + 1.0)
    dist.all_reduce(t)  # cached view, new contents: 3
    first = t.clone()
    other = torch.full((16,), 10.0)
    t.set_(other)
    dist.all_reduce(t)  # same tensor object, other memory: 20 in ``other``
    fresh = torch.full((16,), float(r))
    dist.all_reduce(fresh)  # 1
    strided = torch.ones(32)[::2]
    dist.all_reduce(strided)  # the general path: 2
    pre = torch.ones(16)
    dist.all_reduce(pre, dist._make_nccl_premul_sum(3.0))  # 6, after a cached SUM
    work = ctx.group.allreduce([torch.ones(4)])  # no options: the general path
    work.wait()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    done = ctx.group.allreduce([torch.ones(4)], opts)
    value = done.get_future().wait()
    return (first.tolist(), other.tolist(), fresh.tolist(), strided.tolist(), pre.tolist(),
            done.wait(), done.is_completed(), done.is_success(), value[0].tolist())


def test_blocking_fast_path_follows_the_tensors_memory(pool):
    for res in pool.run_ok(_follows_memory):
        assert res == ([3.0] * 16, [20.0] * 16, [1.0] * 16, [2.0] * 16, [6.0] * 16,
                       True, True, True, [2.0] * 4)


def _same_tensor_changed(ctx):
    """The last tensor's view is kept by identity: the same tensor object whose dtype
    (``.data =`` a reinterpreting view), size (``resize_``) or layout (``t_``) changed
    in place is seen again (each result exact for its new form)."""
    r = ctx.rank
    t = torch.full((4, 4), 1.0 + r)
    for _ in range(3):
        dist.all_reduce(t)  # the view kept; then 3, 6, 12
    t.data = t.view(torch.int32)  # the same memory as int32
    t.fill_((1 << 26) + r)
    dist.all_reduce(t)
    ints = t.tolist()
    t.resize_(2, 4)  # same memory, half the elements
    t.fill_(r + 2)
    dist.all_reduce(t)
    half = t.tolist()
    t.t_()  # not contiguous: the general path
    dist.all_reduce(t)
    return ints, half, t.tolist(), t.dtype == torch.int32


def test_blocking_fast_path_follows_a_tensor_changed_in_place(pool):
    for ints, half, transposed, int32 in pool.run_ok(_same_tensor_changed):
        assert ints == [[(2 << 26) + 1] * 4] * 4 and int32
        assert half == [[5] * 4] * 2 and transposed == [[10] * 2] * 4


def _bad_arguments(ctx):
    errors = []
    cases = [
        lambda: dist.reduce_scatter_tensor(torch.zeros(5), torch.ones(7)),
        lambda: dist.all_gather_into_tensor(torch.zeros(5), torch.ones(7)),
        lambda: dist.all_gather_into_tensor(torch.zeros(14, dtype=torch.int32),
                                            torch.ones(7)),
    ]
    for case in cases:
        try:
            case()
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - what the caller sees
            errors.append(f"{type(e).__name__}: {e}")
    t = torch.full((8,), float(ctx.rank + 1))
    dist.all_reduce(t)  # the group still works
    return errors, t.tolist()


def test_blocking_fast_path_raises_bad_arguments_to_the_caller(pool):
    for errors, t in pool.run_ok(_bad_arguments):
        assert all(e is not None for e in errors), errors
        assert t == [3.0] * 8


def _hot_entry(ctx):
    """Once a shape is planned, a blocking call enters the communicator's one-call hot
    path directly: none reaches the communicator's general methods (the all-reduce's:
    ``_all_reduce_general``, behind its hot path), each is one call."""
    from ringtree.transports import shm_native as native

    comm, n = ctx.group.comm, ctx.size
    names = ("_all_reduce_general", "broadcast", "reduce", "all_gather", "reduce_scatter")
    general: list[str] = []

    def counted(name):
        method = getattr(comm, name)
        return lambda *a, **k: (general.append(name), method(*a, **k))[1]

    t, blk, big = torch.ones(16), torch.ones(16), torch.zeros(16 * n)

    def calls() -> None:
        t.fill_(ctx.rank + 1.0)
        dist.all_reduce(t)
        dist.broadcast(t, 1)
        dist.reduce(t, 0)
        blk.fill_(ctx.rank + 2.0)
        dist.all_gather_into_tensor(big, blk)
        dist.reduce_scatter_tensor(blk, big)

    for name in names:
        setattr(comm, name, counted(name))
    try:
        for _ in range(3):  # the first calls plan the shapes
            calls()
        warm, seq = len(general), comm.seq
        for _ in range(5):
            calls()
        hot = comm.ll is not None and native.enabled()  # else the general methods run
        return hot, general[warm:], comm.seq - seq, t.tolist(), big.tolist(), blk.tolist(), \
            ctx.rank
    finally:
        for name in names:
            delattr(comm, name)


def test_blocking_fast_path_enters_the_hot_path_directly(pool):
    for hot, general, calls, t, big, blk, rank in pool.run_ok(_hot_entry):
        assert calls == 25 and (general == [] or not hot), general
        assert t == [6.0 if rank == 0 else 3.0] * 16
        assert big == [2.0] * 16 + [3.0] * 16
        assert blk == [2.0 * (rank + 2)] * 16


def test_the_kept_operator_is_told_apart_from_every_other():
    """The key the fast path keeps the last operator by (``fastpath._kind``: a
    ``ReduceOp``'s hash where torch hashes the kind) differs for every kind, and a
    premultiplied sum, never kept, matches none of them."""
    from ringtree.torch.fastpath import _kind

    opts = dist.AllreduceOptions()
    keys = []
    for kind in dist.ReduceOp.RedOpType.__members__.values():
        if kind != dist.ReduceOp.RedOpType.PREMUL_SUM:
            opts.reduceOp = kind
            keys.append(_kind(opts.reduceOp))
    assert len(keys) == len(set(keys)) == len(dist.ReduceOp.RedOpType.__members__) - 1
    opts.reduceOp = dist._make_nccl_premul_sum(2.0)
    assert _kind(opts.reduceOp) not in keys
