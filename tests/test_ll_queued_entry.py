"""Queued async calls run through their shapes' C entries (``ll_entry.run_queued``:
``Round.hot``, ``ghot``, ``shot``, ``bshot`` from the thread that runs the queue) instead
of ``LLRunner.run_arrays``, which keeps what the entries cannot do: the parity to wait
for after a Simple call, an active profiler, a build without the kernel. ``run_arrays``'s
calls are counted by their call numbers; every result is bit for bit what the collective
defines (the all-reduce's and reduce-scatter's against NumPy's rank-order fold of float32
values that round in every add); a peer killed while a waiter runs a queued call in the
kernel is named, signals taken while it waits there run their handler, and 8 ranks on 2
cores run 2,000 queued calls exact."""

from __future__ import annotations

from functools import partial

import numpy as np
from hot_entry_cases import (
    KILL_ENV,
    assert_killed_named,
    killed_peer,
    late_peer_with_signals,
    rank_order_sum,
    rounding,
)

from ringtree import prof
from ringtree.testing import run_ranks

PHASES = ("plain", "after_simple", "profiled")


class _Runs:
    """``run_arrays``'s calls, by call number."""

    def __init__(self, comm):
        self.runner, self.seqs = comm.ll, []
        method = self.runner.run_arrays
        self.runner.run_arrays = lambda comm, op, inp, out, red, result, post, seq, *a: (
            self.seqs.append(seq), method(comm, op, inp, out, red, result, post, seq, *a))[1]

    def close(self) -> None:
        del self.runner.run_arrays


def _issue(comm, k: int) -> tuple[list, list, int]:
    """Five async calls (all-reduce in place and into ``out``, all-gather, reduce-scatter,
    broadcast from the last rank) of shapes planned before: their Works, the bits each
    must hold, the number of the first."""
    n, r, count = comm.size, comm.rank, 40
    first = comm.seq + 1
    inplace, ar_in, ar_out = rounding(r, count, k), rounding(r, count, k + 1), \
        np.empty(count, np.float32)
    mine, gathered = rounding(r, count, k + 2), np.empty(count * n, np.float32)
    ins, folded = rounding(r, count * n, k + 3), np.empty(count, np.float32)
    shared, root = np.full(count, float(r), np.float32), n - 1
    works = [comm.all_reduce(inplace, async_op=True),
             comm.all_reduce(ar_in, out=ar_out, async_op=True),
             comm.all_gather(mine, out=gathered, async_op=True),
             comm.reduce_scatter(ins, out=folded, async_op=True),
             comm.broadcast(shared, root, async_op=True)]
    want = [rank_order_sum(n, count, k), rank_order_sum(n, count, k + 1),
            np.concatenate([rounding(q, count, k + 2) for q in range(n)]),
            rank_order_sum(n, count * n, k + 3)[r * count:(r + 1) * count],
            np.full(count, float(root), np.float32)]
    return works, list(zip((inplace, ar_out, gathered, folded, shared), want)), first


def queued_entries(comm) -> dict:
    n, count = comm.size, 40
    x, y = np.empty(count, np.float32), np.empty(count, np.float32)
    big, blk = np.empty(count * n, np.float32), np.empty(count, np.float32)
    comm.all_reduce(x)
    comm.all_reduce(x, out=y)
    comm.all_gather(blk, out=big)
    comm.reduce_scatter(big, out=blk)
    comm.broadcast(blk, n - 1)  # every shape planned
    got = {}
    for phase in PHASES:
        if phase == "after_simple":
            comm.all_reduce(x, algo="ring")  # on Simple: LL's next call waits for parity
        if phase == "profiled":
            prof.start(comm)
        runs = _Runs(comm)
        wrong, issued = 0, []
        try:
            for k in range(3):
                works, results, first = _issue(comm, 10 * k)
                issued.append(first)
                for w in reversed(works):
                    w.wait()
                wrong += sum(a.view(np.uint32).tolist() != b.view(np.uint32).tolist()
                             for a, b in results)
        finally:
            runs.close()
            if phase == "profiled":
                prof.stop(comm)
        got[phase] = {"wrong": wrong, "issued": issued, "run_arrays": runs.seqs, "n": n}
    return got


def _check(results: list, kernel: bool) -> None:
    for r, got in enumerate(results):
        for phase in PHASES:
            g = got[phase]
            calls = [s + j for s in g["issued"] for j in range(5)]
            assert g["wrong"] == 0, (r, phase, g)
            if not kernel or phase == "profiled":  # every call the general round's way
                assert g["run_arrays"] == calls, (r, phase, g)
            elif phase == "after_simple":  # the first waits for the parity there (a rank
                assert g["run_arrays"] == calls[:g["n"] > 1], (r, phase, g)  # alone: none)
            else:
                assert g["run_arrays"] == [], (r, phase, g)


def test_queued_calls_run_through_their_c_entries():
    _check(run_ranks(queued_entries, 3, timeout=120), True)


def test_queued_calls_without_the_kernel_run_the_general_round():
    _check(run_ranks(queued_entries, 2, timeout=120, env={"RINGTREE_LL_NATIVE": "0"}),
           False)


def test_queued_calls_on_one_rank_and_four_on_two_cores():
    _check(run_ranks(queued_entries, 1, timeout=120), True)
    _check(run_ranks(queued_entries, 4, timeout=120), True)


def _queued_wait(comm, x: np.ndarray) -> None:
    comm.all_reduce(x, async_op=True).wait()


def killed_during_queued(comm) -> tuple:
    x = np.ones(64, np.float32)
    comm.all_reduce(x)  # planned
    return killed_peer(comm, partial(_queued_wait, comm, x))


def test_peer_killed_while_a_queued_call_waits_in_the_kernel_is_named():
    assert_killed_named(run_ranks(killed_during_queued, 3, timeout=60, env=KILL_ENV))


def many_queued(comm) -> tuple[int, int]:
    """2,000 async all-reduces and all-gathers of int32 (each element naming its call and
    rank), issued in pairs and waited in reverse: the wrong ones, and how many of the
    flight recorder's entries the kernel wrote."""
    from ringtree.prof.flight import Entry

    n, r = comm.size, comm.rank
    x, y = np.empty(64, np.int32), np.empty(64, np.int32)
    out = np.empty(64 * n, np.int32)
    wrong = 0
    for k in range(1000):
        x[:] = 16 * k + r
        y[:] = 16 * k + r + 1
        works = [comm.all_reduce(x, async_op=True), comm.all_gather(y, out=out, async_op=True)]
        for w in reversed(works):
            w.wait()
        wrong += int(not (x == n * 16 * k + n * (n - 1) // 2).all())
        want = 16 * k + 1 + np.arange(n, dtype=np.int32)
        wrong += int(not (out.reshape(n, -1) == want[:, None]).all())
    return wrong, sum(type(e) is not Entry for e in comm.flight.ring if e is not None)


def test_eight_ranks_on_two_cores_through_the_queued_entries():
    for r, (wrong, from_c) in enumerate(run_ranks(many_queued, 8, timeout=180)):
        assert wrong == 0 and from_c > 100, (r, wrong, from_c)


def queued_late_with_signals(comm) -> tuple:
    """:func:`hot_entry_cases.late_peer_with_signals` with each call queued and waited
    for; how many of the flight recorder's entries the kernel wrote."""
    from ringtree.prof.flight import Entry

    hits, ok = late_peer_with_signals(comm, partial(_queued_wait, comm))
    return hits, ok, sum(type(e) is not Entry for e in comm.flight.ring if e is not None)


def test_signals_while_a_queued_call_waits_in_the_kernel():
    res = run_ranks(queued_late_with_signals, 2, timeout=60)
    assert res[0][0] > 10 and res[0][1] and res[1][1], res
    assert res[0][2] >= 5 and res[1][2] >= 5, res  # the kernel's entries
