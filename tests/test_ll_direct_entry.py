"""The single copy's whole call in one C entry (``Round.dcall``,
``ll_direct_entry``): every dtype's bytes (all-gather, broadcast) and the rank-order
fold's bits with the kernel
and without it, on 2 and 3 ranks and 4 ranks on 2 cores, through the hot paths and the
general one; the flight recorder's entries written from C; a peer late to either of the
call's two synchronisations (the kernel hands the rest to Python); a kernel rank and a
Python rank in one job; an absent peer and a killed one named; signals during the wait;
8 ranks on 2 cores for 2,000 calls."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import pytest
from hot_entry_cases import (
    KILL_ENV,
    RANKS_AND_KERNEL,
    absent_peer,
    assert_absent_named,
    assert_killed_named,
    assert_recorded,
    killed_peer,
    late_peer_with_signals,
    rank_order_sum,
    recorded,
    rounding,
)

from ringtree.prof.flight import Entry
from ringtree.runtime.protocols import ll_direct, ll_direct_entry
from ringtree.runtime.protocols.ll_direct_entry import Compiled
from ringtree.testing import run_ranks
from ringtree.transports import shm_cma as cma
from ringtree.transports.shm_native import SECOND

ALL_DIRECT = {"RINGTREE_CMA_MIN": "1"}  # the single copy at every size
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")


def _bytes(dtype: str, rank: int, count: int, k: int) -> np.ndarray:
    """Random bytes of ``dtype`` (every bit pattern, NaNs too, for floats)."""
    rng = np.random.default_rng(7919 * k + rank)
    return rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def test_the_modes_are_the_kernels():
    if not ll_direct_entry.available():
        pytest.skip("no compiled _llc")
    c = ll_direct_entry._llc
    e = ll_direct_entry
    assert (e.PUSH, e.READ, e.FOLD, e.FOLD_PUSH, e.BCAST, e.OWN_STREAM, e.OWN_MEMCPY) == (
        c.DM_PUSH, c.DM_READ, c.DM_FOLD, c.DM_FOLD_PUSH, c.DM_BCAST, c.OWN_STREAM,
        c.OWN_MEMCPY)


def _spy() -> dict:
    """Count this process's compiled calls by mode, the calls handed back at the first
    synchronisation (``handed``: Python made the moves) and at the second (``second``)."""
    seen = {"entries": {}, "handed": 0, "second": 0}
    after, rest = Compiled.after, Compiled._rest

    def counted_after(self, x, out, r, *a):
        seen["entries"][self.mode] = seen["entries"].get(self.mode, 0) + 1
        seen["second"] += SECOND // 2 <= r < ll_direct_entry._llc.D_GONE
        return after(self, x, out, r, *a)

    def counted_rest(self, *a):
        seen["handed"] += 1
        return rest(self, *a)
    Compiled.after, Compiled._rest = counted_after, counted_rest
    return seen


def calls(comm) -> dict:
    """All-gathers and broadcasts (from every root in turn) of every dtype's bytes,
    reduce-scatters and all-reduces of rounding float32 sums (in place and into ``out``,
    6 of each shape: the hot paths after the first), each compared with the bytes or the
    rank-order fold; inputs untouched."""
    n, r = comm.size, comm.rank
    seen, wrong = _spy(), []
    cma._offsets[:] = [r % 2 == 1]  # the own copy: memcpy on even ranks, the loop on odd
    for dtype in DTYPES:
        for count in (3, 4096):
            out = np.empty((n, count), dtype)
            for k in range(6):
                x = _bytes(dtype, r, count, k)
                keep = x.copy()
                got = comm.all_gather(x, out=out if k % 2 else out.reshape(-1))
                want = np.concatenate([_bytes(dtype, q, count, k) for q in range(n)])
                if got.tobytes() != want.tobytes() or x.tobytes() != keep.tobytes():
                    wrong.append(f"all_gather {dtype} {count} {k}")
                root = k % n
                got = comm.broadcast(x, root)
                if got is not None and got is not x or \
                        x.tobytes() != _bytes(dtype, root, count, k).tobytes():
                    wrong.append(f"broadcast {dtype} {count} {k}")
    for count in (5, 3000):
        out = np.empty(count, np.float32)
        for k in range(6):
            x = rounding(r, count * n, k)
            keep = x.copy()
            got = comm.reduce_scatter(x, out=out)
            want = rank_order_sum(n, count * n, k)[r * count:(r + 1) * count]
            if got.tobytes() != want.tobytes() or x.tobytes() != keep.tobytes():
                wrong.append(f"reduce_scatter {count} {k}")
        for in_place in (True, False):
            y = np.empty(count, np.float32)
            for k in range(6):
                x = rounding(r, count, k)
                got = comm.all_reduce(x) if in_place else comm.all_reduce(x.copy(), out=y)
                if got.tobytes() != rank_order_sum(n, count, k).tobytes():
                    wrong.append(f"all_reduce {count} in_place={in_place} {k}")
    return {"wrong": wrong, **seen, **recorded(comm, 6)}


@RANKS_AND_KERNEL
def test_every_dtype_and_fold_in_and_out_of_the_kernel(nranks, env):
    kernel = not env and ll_direct_entry.available()
    res = run_ranks(calls, nranks, timeout=120, env={**ALL_DIRECT, **env})
    for r, got in enumerate(res):
        assert got["wrong"] == [], (r, got)
        modes = set(got["entries"])
        assert modes == ({ll_direct_entry.PUSH, ll_direct_entry.FOLD,
                          ll_direct_entry.FOLD_PUSH, ll_direct_entry.BCAST}
                         if kernel else set()), (r, got)
        assert_recorded(r, got, 6, kernel, 12)


def queued(comm) -> dict:
    """Async all-reduces, all-gathers, reduce-scatters and broadcasts of rounding float32
    (several in flight, waited for in order), each against the rank-order fold or the
    blocks: the queue runs them in the C entry (its flight-recorder entries)."""
    n, r = comm.size, comm.rank
    seen, wrong, count = _spy(), [], 3000
    for k in range(4):
        xs = [rounding(r, count, 3 * k + j) for j in range(4)]
        outs = [np.empty(count * n, np.float32), np.empty(count // n, np.float32)]
        works = [comm.all_reduce(xs[0], async_op=True),
                 comm.all_gather(xs[1], out=outs[0], async_op=True),
                 comm.reduce_scatter(xs[2][:count // n * n], out=outs[1], async_op=True),
                 comm.broadcast(xs[3], k % n, async_op=True)]
        for w in works:
            w.wait()
        full = np.concatenate([rounding(q, count, 3 * k + 1) for q in range(n)])
        fold = rank_order_sum(n, count, 3 * k + 2)[:count // n * n]
        wrong += [what for what, ok in (
            ("all_reduce", xs[0].tobytes() == rank_order_sum(n, count, 3 * k).tobytes()),
            ("all_gather", outs[0].tobytes() == full.tobytes()),
            ("reduce_scatter", outs[1].tobytes() == fold[r * (count // n):
                                                          (r + 1) * (count // n)].tobytes()),
            ("broadcast", xs[3].tobytes() == rounding(k % n, count, 3 * k + 3).tobytes()))
            if not ok]
    return {"wrong": wrong, **seen, **recorded(comm, 6)}


@RANKS_AND_KERNEL
def test_async_calls_run_in_the_kernel_from_the_queue(nranks, env):
    kernel = not env and ll_direct_entry.available()
    for r, got in enumerate(run_ranks(queued, nranks, timeout=120, env={**ALL_DIRECT, **env})):
        assert got["wrong"] == [], (r, got)
        assert_recorded(r, got, 6, kernel, 6)


def late(comm, first: bool, coll: str) -> dict:
    """Rank 1 comes 20 ms late to five all-reduces (or broadcasts from rank 0), either to
    the call (``first``: rank 0's kernel gives up waiting at the first synchronisation
    and Python makes the moves) or, running the Python steps itself, between its moves
    and the second (rank 0's kernel hands that wait back); then rank 1 skips a call:
    rank 0's names it."""
    seen = _spy()
    if comm.rank == 1 and not first:
        ll_direct_entry.mode = lambda op: None  # this rank: Python's steps
        complete = ll_direct.DirectOp._complete

        def slow(self, *a, **kw):
            time.sleep(0.02)
            return complete(self, *a, **kw)
        ll_direct.DirectOp._complete = slow
    x = np.empty(1000, np.int64)
    ok = True
    for k in range(6):
        if comm.rank == 1 and first and k:
            time.sleep(0.02)
        x[:] = 10 * k + comm.rank
        if coll == "broadcast":
            comm.broadcast(x, 0)
            ok &= x.tolist() == [10 * k] * 1000
        else:
            comm.all_reduce(x)
            ok &= x.tolist() == [20 * k + 1] * 1000
    seq = comm.seq + 1
    call = partial(comm.broadcast, x, 0) if coll == "broadcast" else \
        partial(comm.all_reduce, x)
    got = absent_peer(comm, lambda timeout: call(timeout=timeout), ok)
    return {**got, **seen, "absent_seq": seq}


@pytest.mark.parametrize("coll", ["all_reduce", "broadcast"])
@pytest.mark.parametrize("first", [True, False], ids=["first-sync", "second-sync"])
def test_a_late_peer_hands_the_call_back_to_python(first, coll):
    if not ll_direct_entry.available():
        pytest.skip("no compiled _llc")
    env = {**ALL_DIRECT, "RINGTREE_LL_YIELD_US": "2000"}
    res = run_ranks(late, 2, first, coll, timeout=60, env=env)
    got = assert_absent_named(res, res[0]["absent_seq"])
    mode = ll_direct_entry.BCAST if coll == "broadcast" else ll_direct_entry.FOLD_PUSH
    assert mode in got["entries"], got  # (beside the store mode's measuring all-reduces)
    # rank 1 was 20 ms late five times, past rank 0's 2 ms budgets: at the first sync
    # (Python made the moves) or at the second (Python finished the wait)
    assert got["handed" if first else "second"] >= 3, got


@pytest.mark.parametrize("coll", ["all_reduce", "broadcast"])
def test_a_killed_peer_is_named_by_the_kernels_ranks(coll):
    env = {**ALL_DIRECT, **KILL_ENV}
    x = partial(np.arange, 30000, dtype=np.float32)

    def call(c):
        return c.broadcast(x(), 0) if coll == "broadcast" else c.all_reduce(x())
    assert_killed_named(run_ranks(lambda c: killed_peer(c, lambda: call(c)), 3,
                                  timeout=60, env=env))


def test_signals_while_the_kernel_waits():
    hits, ok = zip(*run_ranks(lambda c: late_peer_with_signals(c, c.all_reduce), 2,
                              timeout=60, env=ALL_DIRECT))
    assert all(ok) and hits[0] > 10, (hits, ok)


def many(comm) -> tuple[int, int]:
    """2,000 all-reduces and all-gathers alternated (and 500 broadcasts from every root in
    turn), each element naming its call and rank: the wrong ones, and how many
    flight-recorder entries the kernel wrote."""
    n = comm.size
    x, out = np.empty(1000, np.int32), np.empty(1000 * n, np.int32)
    wrong = 0
    for k in range(1000):
        x[:] = 16 * k + comm.rank
        comm.all_gather(x, out=out)
        want = 16 * k + np.arange(n, dtype=np.int32)
        wrong += int(not (out.reshape(n, -1) == want[:, None]).all())
        comm.all_reduce(x)
        wrong += int(not (x == 16 * k * n + n * (n - 1) // 2).all())
        if k % 2:
            x[:] = 16 * k + comm.rank
            comm.broadcast(x, k % n)
            wrong += int(not (x == 16 * k + k % n).all())
    return wrong, sum(type(e) is not Entry for e in comm.flight.ring if e is not None)


def test_eight_ranks_on_two_cores_through_the_kernel():
    kernel = ll_direct_entry.available()
    for r, (wrong, from_c) in enumerate(run_ranks(many, 8, timeout=240, env=ALL_DIRECT)):
        assert wrong == 0 and (from_c > 100) == kernel, (r, wrong, from_c)
