"""Bad input, mismatched calls, dead and stuck peers: clear errors naming the rank."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import ringtree
from ringtree.testing import run_ranks


def local_errors(comm):
    """Invalid local arguments raise before anything is sent: afterwards a normal
    collective still works, so no rank consumed a sequence number or sent a byte."""
    caught = []
    cases = [
        lambda: comm.broadcast(np.zeros(4), root=comm.size),
        lambda: comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32)),
        lambda: comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(4, np.float64)),
        lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 0]),
        lambda: comm.all_reduce(np.zeros(4, np.float32), ringtree.ReduceOp.BAND),
        lambda: comm.all_reduce(np.zeros(4, np.complex64)),
        lambda: comm.all_reduce(np.zeros(4, np.float32), "median"),
        lambda: comm.all_reduce(np.zeros(4, np.float32), ringtree.ReduceOp.PREMUL_SUM),
        lambda: comm.reduce_scatter(np.zeros(comm.size * 3 + 1, np.float32)),
        lambda: comm.all_gather(np.zeros(3), out=np.zeros(3 * comm.size + 1)),
        lambda: comm.send(np.zeros(3), comm.rank),
        lambda: comm.all_to_all(np.zeros(4), send_splits=[1] * (comm.size + 1)),
        lambda: comm.all_reduce("not a buffer"),
    ]
    if comm.rank == 0:
        for case in cases:
            try:
                case()
                caught.append(None)
            except (ValueError, TypeError) as e:
                caught.append(type(e).__name__ + ": " + str(e))
    x = np.full(5, comm.rank + 1, dtype=np.int64)
    comm.all_reduce(x)
    return caught, int(x[0])


def test_invalid_arguments_raise_before_sending():
    res = run_ranks(local_errors, 2, timeout=60)
    caught, total = res[0]
    assert total == 3 and res[1][1] == 3
    assert all(c is not None for c in caught), caught
    assert "root 2 out of range" in caught[0]
    assert "C-contiguous" in caught[3]
    assert "BAND" in caught[4]
    assert "complex64" in caught[5]


def mismatch(comm, what):
    count = 10
    dtype = np.float32
    op = "sum"
    if comm.rank == 1:
        if what == "count":
            count = 12
        elif what == "dtype":
            dtype = np.int32
        elif what == "op":
            op = "max"
    try:
        comm.all_reduce(np.ones(count, dtype), op, timeout=30)
    except ringtree.RingtreeError as e:
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("what,word", [("count", "count"), ("dtype", "dtype"), ("op", "op")])
@pytest.mark.parametrize("n", [2, 4])
def test_mismatched_calls_name_ranks(n, what, word):
    res = run_ranks(mismatch, n, what, timeout=60)
    for r, v in enumerate(res):
        assert v is not None, f"rank {r} did not notice the mismatch"
        name, msg = v
        assert word in msg, f"rank {r}: {msg}"
        assert "rank 1" in msg or "rank 0" in msg, msg


def killed_rank(comm):
    x = np.ones(1 << 18, np.float32)
    comm.all_reduce(x)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(3):
            comm.all_reduce(x, timeout=60)
    except ringtree.RingtreeError as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return None


@pytest.mark.parametrize("n", [3, 4, 8])
def test_killed_rank_is_named(n):
    res = run_ranks(killed_rank, n, timeout=120)
    for r, v in enumerate(res):
        if r == 2:
            assert isinstance(v, BaseException)  # it died without a result
            continue
        assert v is not None and not isinstance(v, BaseException), f"rank {r}: {v!r}"
        name, msg, _ = v
        assert "rank 2" in msg, f"rank {r}: {msg}"
        assert name != "CollectiveTimeout", f"rank {r} only noticed by timeout: {msg}"


def close_after_deaths(comm, killed):
    """The ranks ``killed`` die; the survivors close: the store's host waits for the
    other survivors' closes only (which closed, which it found dead)."""
    from ringtree import failure

    waits: list = []
    real = failure.await_closes

    def recorded(comm, timeout):
        waits.append(tuple(map(sorted, real(comm, timeout))))
        return waits[-1]

    failure.await_closes = recorded
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    if comm.rank in killed:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(x)
        return "no error"
    except ringtree.RingtreeError:
        pass
    gone = failure.gone(comm)
    comm.close()
    return sorted(gone), waits


@pytest.mark.parametrize("n, killed", [(3, [1]), (4, [1]), (4, [1, 2]), (5, [1, 3, 4])])
def test_the_stores_host_does_not_wait_for_dead_ranks_to_close(n, killed):
    res = run_ranks(close_after_deaths, n, killed, timeout=120,
                    env={"RINGTREE_TIMEOUT": "600"})
    live = [r for r in range(n) if r not in killed]
    for r in live:
        gone, waits = res[r]
        assert gone and set(gone) <= set(killed), (r, res)  # at least the one it saw
        # rank 0 hosts the store: every other survivor closed, every killed rank was
        # found dead (on the old rule it waited for one close too many, for 30 s)
        assert waits == ([(live[1:], killed)] if r == 0 else []), (r, res)


def stuck_rank(comm):
    if comm.rank == 1:
        time.sleep(4)
        return "slept"
    try:
        comm.all_reduce(np.ones(8, np.float32), timeout=1.5)
    except ringtree.CollectiveTimeout as e:
        return str(e)
    except ringtree.RingtreeError as e:
        return str(e)
    return None


def test_timeout_names_collective_and_peer():
    res = run_ranks(stuck_rank, 3, timeout=60)
    assert res[1] == "slept"
    for r in (0, 2):
        msg = res[r]
        assert msg and "all_reduce" in msg and "seq 1" in msg, f"rank {r}: {msg}"
        assert "rank" in msg
    assert "timed out" in res[0] or "timed out" in res[2]


def unusable_after_error(comm):
    try:
        comm.all_reduce(np.ones(4, np.float32) if comm.rank else np.ones(5, np.float32))
    except ringtree.RingtreeError:
        pass
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except ringtree.CommAborted as e:
        return str(e)
    return None


def test_communicator_unusable_after_failure():
    for r, msg in enumerate(run_ranks(unusable_after_error, 2, timeout=60)):
        assert msg and "unusable" in msg, f"rank {r}: {msg}"
