"""Registered buffers (``Communicator.empty``, ``transports/shm_arena.py``,
``runtime/protocols/ll_reg.py``): all-reduce, all-gather and reduce-scatter reading the
peers' buffers where they lie give the rank-order fold's bits (a broadcast, the root's)
for every dtype and op the split takes, in place and not, odd counts, 2-4 ranks, with
the compiled entry (``Round.reg``) and without it (``RINGTREE_LL_NATIVE=0``); a call
where one rank's buffers are not registered falls back on every rank; a killed peer is
named, also while the others wait in the compiled entry."""

from __future__ import annotations

import os
import signal
import time
from functools import partial

import numpy as np
import pytest
from hot_entry_cases import KILL_ENV, assert_killed_named, killed_peer
from test_ll_native import _input
from test_ll_split import _want as _fold  # the rank-order fold of every rank's input

from ringtree.dtypes import DType
from ringtree.errors import MismatchError, RingtreeError
from ringtree.runtime.protocols import ll_reg, ll_reg_kernel
from ringtree.testing import run_ranks
from ringtree.transports import shm_native

CASES = [("float32", "sum"), ("float64", "max"), ("int32", "prod"), ("bfloat16", "sum"),
         ("float16", "sum"), ("uint8", "bxor"), ("float32", "min"), ("int64", "sum")]


def _np(dt: DType):
    if dt is DType.BFLOAT16:
        import ml_dtypes
        return ml_dtypes.bfloat16
    return dt.storage


def _reg(comm, src: np.ndarray, dt: DType, registered: bool = True) -> np.ndarray:
    x = comm.empty(src.size, _np(dt)) if registered else np.empty(src.size, _np(dt))
    x.view(dt.storage)[:] = src
    return x


def _bits(a: np.ndarray, dt: DType) -> bytes:
    return a.view(dt.storage).tobytes()


def calls(comm, stream: bool) -> list[str]:
    """Every case through the communicator, registered; the direct path must run
    (``stream``: streaming stores, see below)."""
    if stream:  # (this process only) an all-reduce's pushed blocks streamed, the other
        # collectives' copies from 32 KiB (every case but 4099 8-byte items: not)
        ll_reg_kernel.STREAM_MIN_AR, ll_reg_kernel.STREAM_MIN = 0, 32 << 10
    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    ran = []
    reg_run = reg.runner.run_arrays

    def spy(c, rop, *a):
        if isinstance(rop, ll_reg.RegOp):
            ran.append(rop.coll)
        return reg_run(c, rop, *a)
    reg.runner.run_arrays = spy
    n, r = comm.size, comm.rank
    bad = []
    for dname, op in CASES:
        dt = DType(dname)
        for count in (1, n * 7 + 3, 4099):
            want = _fold(n, count, dt, op)
            for in_place in (True, False):
                x = _reg(comm, _input(r, count, dt, op), dt)
                out = None if in_place else comm.empty(count, _np(dt))
                before = len(ran)
                got = comm.all_reduce(x, op, out=out)
                if _bits(got, dt) != want.tobytes():
                    bad.append(f"all_reduce {dname} {op} count={count} in_place={in_place}")
                if len(ran) != before + 1:
                    bad.append(f"all_reduce {dname} {count}: not on registered buffers")
                if not in_place and _bits(x, dt) != _input(r, count, dt, op).tobytes():
                    bad.append(f"all_reduce {dname} {op} count={count}: input changed")
            # reduce-scatter: block r of the fold of n*count elements
            full = _fold(n, n * count, dt, op)
            for in_place in (True, False):
                x = _reg(comm, _input(r, n * count, dt, op), dt)
                out = x[r * count:(r + 1) * count] if in_place else comm.empty(count, _np(dt))
                got = comm.reduce_scatter(x, op, out=out)
                if _bits(got, dt) != full[r * count:(r + 1) * count].tobytes():
                    bad.append(f"reduce_scatter {dname} {op} count={count} {in_place}")
        count = n * 5 + 1
        whole = np.concatenate([_input(q, count, dt, "sum") for q in range(n)])
        for in_place in (True, False):
            out = comm.empty(n * count, _np(dt))
            if in_place:
                x = out[r * count:(r + 1) * count]
                x.view(dt.storage)[:] = _input(r, count, dt, "sum")
            else:
                x = _reg(comm, _input(r, count, dt, "sum"), dt)
            got = comm.all_gather(x, out=out)
            if _bits(got, dt) != whole.tobytes():
                bad.append(f"all_gather {dname} count={count} in_place={in_place}")
        for root in {0, n - 1}:  # broadcast: every rank gets the root's bits
            x = _reg(comm, _input(r, count, dt, "sum"), dt)
            comm.broadcast(x, root)
            if _bits(x, dt) != _input(root, count, dt, "sum").tobytes():
                bad.append(f"broadcast {dname} count={count} root={root}")
    if ran.count(ran[0]) == len(ran):
        bad.append(f"only {ran[0]} ran registered")
    native = shm_native.enabled()  # then every fold but float16's is compiled
    for rop in reg.ops.values():
        if (rop.k is not None) != (native and (rop.desc.dtype != "float16" or
                                               not rop.coll.reduces)):
            bad.append(f"{rop.describe()}: compiled entry {rop.k is not None}")
    return bad


@pytest.mark.parametrize("nranks,stream,env", [
    (2, False, {}), (2, True, {}), (3, True, {}), (4, False, {}),
    (2, True, {"RINGTREE_LL_NATIVE": "0"}), (3, False, {"RINGTREE_LL_NATIVE": "0"})],
    ids=["kernel-2", "kernel-2-stream", "kernel-3-stream", "kernel-4", "python-2-stream",
         "python-3"])
def test_registered_calls_give_the_rank_order_bits(nranks, stream, env):
    assert run_ranks(calls, nranks, stream, timeout=120, env=env) == [[]] * nranks


def mixed(comm) -> list[str]:
    """Rank 1's buffers are plain in every other call (and rank 0's in a third): the
    call falls back on every rank and still gives the fold's bits (a broadcast: the
    root's)."""
    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    n, r = comm.size, comm.rank
    bad = []
    dt = DType.FLOAT32
    for i in range(6):
        count = 1000 + 17 * i
        registered = not ((r == 1 and i % 2) or (r == 0 and i % 3 == 2))
        for in_place in (True, False):
            x = _reg(comm, _input(r, count, dt, "sum"), dt, registered)
            out = None if in_place else (comm.empty(count) if registered else
                                         np.empty(count, np.float32))
            got = comm.all_reduce(x, "sum", out=out)
            if got.tobytes() != _fold(n, count, dt, "sum").tobytes():
                bad.append(f"call {i} in_place={in_place} registered={registered}")
        x = _reg(comm, _input(r, count, dt, "sum"), dt, registered)
        comm.broadcast(x, i % n)
        if x.tobytes() != _input(i % n, count, dt, "sum").tobytes():
            bad.append(f"broadcast {i} registered={registered}")
        if r == 1 and i == 3:
            time.sleep(0.05)  # the others wait for its mark or post
    if n == 2:  # 17 MiB on 2 ranks runs on Simple: rank 1 announces instead of posting
        count = 17 << 18
        x = _reg(comm, np.full(count, r + 1, np.float32), dt, r == 0)
        if comm.all_reduce(x).min() != 3 or x.max() != 3:
            bad.append("17 MiB with rank 1 unregistered")
    return bad


def test_which_calls_fold_with_numpy_steps():
    """A 2-rank registered all-reduce from NUMPY_FOLD_FROM folds with NumPy's steps (the
    bits test above runs both ways); other counts and collectives keep the entry."""
    ar, at = ll_reg.Collective.ALL_REDUCE, ll_reg.NUMPY_FOLD_FROM
    assert ll_reg._numpy_folds(ar, 2, at) and ll_reg._numpy_folds(ar, 2, 1 << 30)
    assert not ll_reg._numpy_folds(ar, 2, at - 1)
    assert not ll_reg._numpy_folds(ar, 3, 1 << 30)
    assert not ll_reg._numpy_folds(ll_reg.Collective.ALL_GATHER, 2, 1 << 30)


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_mixed_call_falls_back_on_every_rank(nranks):
    assert run_ranks(mixed, nranks, timeout=60) == [[]] * nranks


def reused(comm) -> list:
    """The same buffers call after call (the kernel entry makes the agreement), then rank
    1 on another registered buffer (the entry leaves the agreement to Python, which
    learns the new location), back, then plain (every rank falls back): the fold's bits
    every time; how often Python made or finished the agreement."""
    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    n, r, dt, count = comm.size, comm.rank, DType.FLOAT32, 3001
    x, other = comm.empty(count, np.float32), comm.empty(count, np.float32)
    learned = []
    real = reg._learn
    reg._learn = lambda *a: (learned.append(1), real(*a))[1]
    bad = []
    for i in range(10):
        buf = other if r == 1 and i == 5 else np.empty(count, np.float32) if \
            r == 1 and i == 7 else x
        buf[:] = _input(r, count, dt, "sum")
        if comm.all_reduce(buf, "sum").tobytes() != _fold(n, count, dt, "sum").tobytes():
            bad.append(f"call {i}")
    return [bad, len(learned)]


@pytest.mark.parametrize("nranks", [3])
def test_the_kernel_makes_the_agreement_on_the_same_buffers(nranks):
    res = run_ranks(reused, nranks, timeout=60, env=KILL_ENV)  # (long yields: no budget ends)
    assert [bad for bad, _ in res] == [[]] * nranks
    # Python's agreement: calls 0 (new buffers), 5, 6 (rank 1's other buffer, and back)
    # and, but on rank 1 (plain: the ordinary path at once), 7; the kernel's at 1-4, 8, 9
    # (without the kernel, Python makes every one: rank 1's plain call 7 is not one)
    assert [k for _, k in res] == ([4, 3, 4] if shm_native.enabled() else [10, 9, 10])


def mismatched(comm) -> str:
    """Two calls on the same buffers (the second's agreement in the kernel entry), then
    rank 1 asks for another op: both ranks are told, neither waits."""
    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    x = comm.zeros(1000)
    comm.all_reduce(x)
    comm.all_reduce(x)
    try:
        comm.all_reduce(x, "max" if comm.rank == 1 else "sum")
    except MismatchError as e:
        return str(e)
    return "no error"


def test_a_mismatched_call_is_named_on_every_rank():
    for msg in run_ranks(mismatched, 2, timeout=60):
        assert "rank 0 and rank 1 disagree" in msg or "rank 1 and rank 0 disagree" in msg, msg


def killed(comm, mid: bool) -> tuple[int | None, str]:
    """Rank 1 dies before a registered all-reduce (``mid``: after the agreement, before
    its fold, its buffers still mapped by the others, who wait for it in the compiled
    entry or, without it, in Python); the others name it."""
    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    x = comm.zeros(1 << 16)
    if not mid:
        return killed_peer(comm, partial(comm.all_reduce, x))
    for _ in range(3):
        comm.all_reduce(x)
    if comm.rank == 1:  # its agreement in Python, then it dies; the others' in the kernel
        reg._fast = lambda *a: False
        reg._fold = reg._native = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(x)
    except RingtreeError as e:
        return getattr(e, "peer", None), str(e)
    return None, "no error"


@pytest.mark.parametrize("mid,env", [(False, {}), (True, {}),
                                     (True, {"RINGTREE_LL_NATIVE": "0"})],
                         ids=["before", "in-the-kernel", "in-python"])
def test_a_killed_peer_is_named(mid, env):
    assert_killed_named(run_ranks(killed, 3, mid, timeout=60, env={**KILL_ENV, **env}))


def test_arena_allocates_frees_and_locates():
    from ringtree.transports.shm_arena import OFF_BITS, Arena

    a = Arena("t" + os.urandom(3).hex(), 0, os.getpid(), "0")
    try:
        x = a.empty((3, 5), np.float64)
        y = a.empty(100, np.int8)
        assert x.shape == (3, 5) and x.flags.writeable and a.locate(x) == 0
        assert a.locate(y) == 4096 and a.locate(np.zeros(3)) == -1
        assert a.locate(x[1]) == 40
        v = x[1:]
        del x
        assert a.free[0][1] >= 8192  # x still viewed: not freed
        del v
        assert a.free[0] == [0, 0, 4096]
        w = a.empty(10, np.uint8)
        at = a.locate(w)
        with a.lock:  # freed while an allocation holds the lock: queued, merged later
            del w
            assert a.returned
        b = a.empty(10, np.uint8)
        assert a.locate(b) == at == 0 and not a.returned
        z = a.empty(1 << 27, np.uint8)  # larger than a chunk: a chunk of its own
        assert a.locate(z) == 1 << OFF_BITS
        peer = a.peer(0, os.getpid(), "0", a.locate(y), np.int8, 100)
        y[:] = 7
        assert peer.sum() == 700
    finally:
        a.close()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"ringtree-{a.tag}-")]


def perf_registered(comm) -> list:
    """``ringtree perf -R 1``: its buffers are registered, every call checks out."""
    import io

    from ringtree.perf.backends import RingtreeBackend
    from ringtree.perf.bench import Harness
    from ringtree.perf.flags import parse_args

    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    ran = []
    real = reg.runner.run_arrays
    reg.runner.run_arrays = lambda c, rop, *a: (
        isinstance(rop, ll_reg.RegOp) and ran.append(rop.coll), real(c, rop, *a))[1]
    got = []
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        out = io.StringIO()
        argv = [coll, "-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-R", "1"]
        rc = Harness(parse_args(argv), RingtreeBackend(comm=comm), out, io.StringIO()).run()
        text = out.getvalue()
        got.append((rc, comm.rank != 0 or ("Out of bounds values : 0 OK" in text and
                                           "# Local Register: buffers in registered" in text),
                    len({c for c in ran})))
    return got


def test_perf_dash_R_runs_on_registered_buffers():
    from ringtree.perf.flags import UsageError, parse_args

    assert parse_args(["all_reduce", "-R", "1"]).local_register == 1
    with pytest.raises(UsageError, match="-R must be"):
        parse_args(["all_reduce", "-R", "3"])
    for res in run_ranks(perf_registered, 2, timeout=90):
        assert res == [(0, True, 1), (0, True, 2), (0, True, 3), (0, True, 4)], res


def _torch_registered(ctx) -> list:
    """``dist.all_reduce`` / ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` /
    ``broadcast`` on tensors made by ``torch.from_numpy`` over registered memory run
    registered."""
    import torch
    import torch.distributed as dist

    comm = ctx.group.comm
    reg = ll_reg.of(comm)
    reg.min_bytes = dict.fromkeys(reg.min_bytes, 0)
    ran = []
    real = reg.runner.run_arrays
    reg.runner.run_arrays = lambda c, rop, *a: (
        isinstance(rop, ll_reg.RegOp) and ran.append(rop.coll.value), real(c, rop, *a))[1]
    n, r, m = ctx.size, ctx.rank, 4099
    t = torch.from_numpy(comm.zeros(m, np.float32))
    t += r + 1
    dist.all_reduce(t)
    x = torch.from_numpy(comm.zeros(m, np.float32))
    x += r + 1
    y = torch.from_numpy(comm.zeros(n * m, np.float32))
    dist.all_gather_into_tensor(y, x)
    z = torch.from_numpy(comm.zeros(m, np.float32))
    dist.reduce_scatter_tensor(z, y)  # y is the same on both ranks: twice block r
    b = torch.from_numpy(comm.zeros(m, np.float32))
    b += r + 1
    dist.broadcast(b, src=1)
    return [ran, (t.min().item(), t.max().item()), (y[0].item(), y[-1].item()),
            (z.min().item(), z.max().item()), (b.min().item(), b.max().item())]


@pytest.mark.torch
def test_torch_tensors_over_registered_memory():
    pytest.importorskip("torch")
    from ringtree.torch.testing import TorchRankPool

    with TorchRankPool(2, pg_timeout=60) as pool:
        res = pool.run_ok(_torch_registered)
    for r, got in enumerate(res):
        assert got == [["all_reduce", "all_gather", "reduce_scatter", "broadcast"], (3.0, 3.0),
                       (1.0, 2.0), (2.0 * (r + 1),) * 2, (2.0, 2.0)], got
