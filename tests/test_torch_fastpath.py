"""The blocking ``dist.*`` fast path (:mod:`ringtree.torch.fastpath`) against the general one.

A blocking call (``async_op=False``) of a contiguous NumPy-typed tensor runs through cached
NumPy views straight into the communicator; ``async_op=True`` takes the general path. Both
must give the same bits, follow a tensor whose memory changes, and let errors reach the
caller (a dead peer: ``test_torch_shrink`` kills a rank under a fast-path all-reduce).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra")
dist = pytest.importorskip("torch.distributed")

from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def pool():
    with TorchRankPool(2, gloo=False, pg_timeout=60) as p:
        yield p


def _data(rank: int, n: int, dtype) -> torch.Tensor:
    """Small integers per rank: sums, products and maxima are exact in any order."""
    return (torch.arange(n, dtype=torch.float64) % 3 + rank + 1).to(dtype)


def _both(fn, *tensors):
    """fn(*copies, async_op) blocking and async on copies of ``tensors``: both results."""
    out = []
    for async_op in (False, True):
        copies = [t.clone() for t in tensors]
        w = fn(*copies, async_op)
        if w is not None:
            w.wait()
        out.append(copies)
    return out


def _same_bits(ctx):
    r, n = ctx.rank, ctx.size
    pairs = []
    for dtype in (torch.float32, torch.float64, torch.int64, torch.uint8):
        for k in (7, 300_000):  # cached views, and a view too large to keep
            x = _data(r, k, dtype)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
                pairs.append(_both(lambda t, a, op=op: dist.all_reduce(t, op, async_op=a), x))
                pairs.append(_both(lambda t, a, op=op: dist.reduce(t, 1, op, async_op=a), x))
            pairs.append(_both(lambda t, a: dist.broadcast(t, 1, async_op=a), x))
            pairs.append(_both(lambda o, i, a: dist.all_gather_into_tensor(o, i, async_op=a),
                               torch.zeros(k * n, dtype=dtype), x))
            big = _data(r, k * n, dtype)
            pairs.append(_both(lambda o, i, a: dist.reduce_scatter_tensor(o, i, async_op=a),
                               torch.zeros(k, dtype=dtype), big))
    same = all(torch.equal(a, b) for blocking, general in pairs
               for a, b in zip(blocking, general))
    return same, len(ctx.group._views or {}) > 0, pairs[0][0][0]


def test_blocking_fast_path_gives_the_general_paths_bits(pool):
    res = pool.run_ok(_same_bits)
    for same, cached, _ in res:
        assert same and cached
    assert torch.equal(res[0][2], res[1][2])
    assert torch.equal(res[0][2], _data(0, 7, torch.float32) + _data(1, 7, torch.float32))


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
    work = ctx.group.allreduce([torch.ones(4)])  # default options: asynchronous
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
