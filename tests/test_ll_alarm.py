"""The LL thread's alarm (``runtime/protocols/ll_alarm.py``): a queued async LL call that
nobody waits on still finishes (the LL thread takes it once the alarm rings), a waiter
runs its own, a blocking call runs the queue before it, and the thread leaves when it
is let go; the same with the alarm off (``RINGTREE_LL_ASYNC_US=0``: the thread is
notified at every call)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ringtree.runtime.protocols import ll_alarm
from ringtree.testing import run_ranks

MODES = {"alarm": {"RINGTREE_LL_ASYNC_US": "500"}, "notify": {"RINGTREE_LL_ASYNC_US": "0"}}


def test_the_alarm_rings_once_per_arming():
    a = ll_alarm.make(1e-3)
    if a is None:
        pytest.skip("no timerfd here")
    try:
        assert not a.wait(0.0)  # not armed
        a.arm()
        assert a.wait(10.0)
        assert not a.wait(0.0)  # the ring was read
        a.ring()
        assert a.wait(10.0)
    finally:
        a.close()
    assert ll_alarm.make(0.0) is None


def _exact(comm, xs: list[np.ndarray]) -> bool:
    n = comm.size
    return all((x == n * (n - 1) // 2 + n * k).all() for k, x in enumerate(xs))


def unwaited(comm) -> tuple[bool, bool, int]:
    """Async all-reduces that no thread waits on finish on their own."""
    xs = [np.full(5, comm.rank + k, np.int64) for k in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    deadline = time.monotonic() + 60.0
    while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
        time.sleep(0.002)
    return all(w.is_completed() for w in works), _exact(comm, xs), comm.ll.pending


def blocking_after(comm) -> tuple[bool, bool, bool]:
    """A blocking call after queued async ones runs them first, in issue order."""
    xs = [np.full(3, comm.rank + k, np.int64) for k in range(5)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    y = np.full(2, comm.rank, np.int64)
    comm.all_reduce(y)
    done = all(w.is_completed() for w in works)
    return done, _exact(comm, xs), bool((y == comm.size * (comm.size - 1) // 2).all())


def let_go(comm) -> tuple[bool, bool]:
    """The LL thread, asleep on its alarm, leaves when it is let go; the next async call
    starts another."""
    x = np.ones(4, np.float32)
    comm.all_reduce(x, async_op=True).wait()
    thread = comm.ll.release_thread()
    thread.join(10.0)
    gone = not thread.is_alive()
    w = comm.all_reduce(x, async_op=True)
    w.wait()
    return gone, bool((x == comm.size ** 2).all())


def mixed(comm) -> bool:
    """Calls waited at once (the alarm), then calls nobody waits for (the thread takes
    them, then is woken at each submission), then waited ones again: exact every time."""
    ok = True
    for _ in range(3):
        xs = [np.full(3, comm.rank + k, np.int64) for k in range(6)]
        for x in xs[:3]:
            comm.all_reduce(x, async_op=True).wait()
        works = [comm.all_reduce(x, async_op=True) for x in xs[3:]]
        deadline = time.monotonic() + 60.0
        while not all(w.is_completed() for w in works) and time.monotonic() < deadline:
            time.sleep(0.002)
        ok = ok and all(w.is_completed() for w in works) and _exact(comm, xs)
    return ok and comm.ll.pending == 0


@pytest.mark.parametrize("mode", MODES)
def test_waited_and_unwaited_calls_take_turns(mode):
    assert run_ranks(mixed, 3, timeout=120, env=MODES[mode]) == [True] * 3


@pytest.mark.parametrize("mode", MODES)
def test_async_calls_nobody_waits_on_finish(mode):
    assert run_ranks(unwaited, 3, timeout=120, env=MODES[mode]) == [(True, True, 0)] * 3


@pytest.mark.parametrize("mode", MODES)
def test_a_blocking_call_runs_the_queued_async_calls_first(mode):
    assert run_ranks(blocking_after, 2, timeout=120, env=MODES[mode]) == [(True, True, True)] * 2


@pytest.mark.parametrize("mode", MODES)
def test_the_ll_thread_leaves_when_let_go(mode):
    assert run_ranks(let_go, 2, timeout=120, env=MODES[mode]) == [(True, True)] * 2
