"""The hot entries' one flag (``Communicator._hot_off``): every state that keeps them out
sets it, a call made in that state leaves the hot frame for the general path, and once
the state is gone the next call is hot again. The states: a group open (and again after
``ungrouped``), async LL calls pending, async Simple work in flight, an active profiler,
a revoked and an aborted communicator. A call's leaving the hot frame is counted where
it leaves (``ll_hot._now``); the results are checked bit for bit every time."""

from __future__ import annotations

import numpy as np
import pytest

import ringtree
from ringtree.prof.recorder import ProfileObserver, Recorder
from ringtree.resilience.revoke import revoke
from ringtree.runtime.protocols import ll_hot
from ringtree.testing import run_ranks


def _count_general(log: list) -> None:
    """Count the calls that leave the all-reduce's hot frame (in this rank's process)."""
    real = ll_hot._now

    def counted(*args):
        log.append(1)
        return real(*args)

    ll_hot._now = counted


def states(comm) -> dict:
    """Each state in turn: the flag right after it is set, the calls that left the hot
    frame while it held, then after it is gone; every all-reduce's sum checked."""
    left: list = []
    _count_general(left)
    n = comm.size
    x = np.empty(4, np.float32)
    wrong = 0

    def call() -> None:
        nonlocal wrong
        x[:] = comm.rank + 1.0
        comm.all_reduce(x)
        wrong += int(x.tolist() != [n * (n + 1) / 2] * 4)

    def hot_again() -> tuple[int, bool]:
        call()  # may leave the frame: after Simple work, the first LL call waits for parity
        del left[:]
        for _ in range(3):  # none may
            call()
        return len(left), comm._hot_off

    call()  # the first call of the shape plans it and keeps it hot
    res: dict = {"warm": hot_again()}

    with comm.group():
        flag = comm._hot_off
        del left[:]
        x[:] = comm.rank + 1.0
        comm.all_reduce(x)  # deferred to the group's end
        inside = len(left)
    wrong += int(x.tolist() != [n * (n + 1) / 2] * 4)
    res["group"] = (flag, inside, hot_again())

    with comm.group():
        with comm.ungrouped():
            call()  # issued now: the group is set aside
        flag = comm._hot_off
        del left[:]
        x[:] = comm.rank + 1.0
        comm.all_reduce(x)
        inside = len(left)
    wrong += int(x.tolist() != [n * (n + 1) / 2] * 4)
    res["ungrouped"] = (flag, inside, hot_again())

    comm.ll.grace = 60.0  # the LL thread leaves the queued call to its waiter
    y = np.full(4, comm.rank + 1.0, np.float32)
    work = comm.all_reduce(y, async_op=True)
    flag = comm._hot_off
    del left[:]
    call()  # the pending call first
    inside = len(left)
    work.wait()
    wrong += int(y.tolist() != [n * (n + 1) / 2] * 4)
    res["pending"] = (flag, inside, hot_again())

    buf = np.zeros(3, np.float32)  # a receive in flight until the peer's all-reduce is done
    if comm.rank == 0:
        work = comm.irecv(buf, 1)
        flag = comm._hot_off
        del left[:]
        call()
        inside = len(left)
        work.wait()
        wrong += int(buf.tolist() != [7.0] * 3)
    else:
        flag, inside = True, 1
        call()
        comm.send(np.full(3, 7.0, np.float32), 0)
    res["simple"] = (flag, inside, hot_again())

    comm.executor.observe(ProfileObserver(Recorder(64)))  # the profiler, as prof.start
    flag = comm._hot_off
    del left[:]
    call()
    inside = len(left)
    comm.executor.observe(None)
    res["profiler"] = (flag, inside, hot_again())

    revoke(comm, "the test revokes it")
    flag = comm._hot_off
    del left[:]
    try:
        call()
        err = "no error"
    except ringtree.RingtreeError as e:
        err = type(e).__name__
    res["revoked"] = (flag, len(left), err)
    res["wrong"] = wrong
    return res


def test_every_state_shuts_the_hot_entries_and_they_open_again():
    for r, got in enumerate(run_ranks(states, 2, timeout=120)):
        assert got["warm"] == (0, False), (r, got)
        assert got["wrong"] == 0, (r, got)
        for state in ("group", "ungrouped", "pending", "simple", "profiler"):
            flag, inside, after = got[state]
            assert flag is True and inside == 1, (r, state, got)
            assert after == (0, False), (r, state, got)  # hot again, the flag down
        assert got["revoked"] == (True, 1, "CommRevoked"), (r, got)


def ended(comm, how: str) -> tuple:
    left: list = []
    _count_general(left)
    x = np.ones(4, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    getattr(comm, how)()
    flag = comm._hot_off
    del left[:]
    with pytest.raises(ringtree.RingtreeError) as e:
        comm.all_reduce(x)
    return flag, len(left), type(e.value).__name__, x.tolist()


@pytest.mark.parametrize("how,error", [("abort", "CommAborted"), ("close", "CommAborted")])
def test_a_closed_communicator_leaves_the_hot_frame(how, error):
    flag, left, err, x = run_ranks(ended, 1, how, timeout=60)[0]
    assert (flag, left, err, x) == (True, 1, error, [1.0] * 4)
