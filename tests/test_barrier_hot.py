"""The barrier once one was planned on LL (``LLRunner.barrier_now``): not planned again,
run in its C entry where the kernel is built (``ll_entry.barrier``: the flight
recorder's entries written from C), numbered and recorded as the general path numbers
it, still a barrier (no rank leaves before the last has come: a late rank's wait handed
back to Python), an absent peer timed out and named, a peer killed during it named; an
async barrier keeps the general path."""

from __future__ import annotations

import time

import pytest
from hot_entry_cases import (
    KILL_ENV,
    absent_peer,
    assert_absent_named,
    assert_killed_named,
    assert_recorded,
    killed_peer,
    late_peer_with_signals,
    recorded,
)

from ringtree.ir.program import Collective
from ringtree.testing import run_ranks

LATE = 0.3  # seconds the last rank comes late


def barriers(comm) -> dict:
    """Five barriers (the first planned), then one for which the last rank comes late,
    then an async one: what the planner was asked, the recorder's last five entries, and
    when each rank left the late barrier against when the last rank came."""
    planned: list = []
    real = comm.planner.plan

    def plan(spec, grouped: bool = False):
        planned.append(spec.coll)
        return real(spec, grouped)

    comm.planner.plan = plan
    for _ in range(5):
        comm.barrier()
    got = recorded(comm, 5)
    came = 0.0
    if comm.rank == comm.size - 1:
        time.sleep(LATE)
        came = time.monotonic()
    comm.barrier()
    left = time.monotonic()
    work = comm.barrier(async_op=True)
    work.wait()
    return {"planned": planned, "recorded": got, "came": came, "left": left,
            "seq": comm.seq}


@pytest.mark.parametrize("nranks,env", [(1, {}), (2, {}), (3, {}), (4, {}),
                                        (2, {"RINGTREE_LL_NATIVE": "0"})],
                         ids=["1", "2", "3", "4-on-2-cores", "python-2"])
def test_a_barrier_after_the_first_is_not_planned_and_still_waits(nranks, env):
    res = run_ranks(barriers, nranks, timeout=60, env=env)
    came = max(r["came"] for r in res)
    for r, got in enumerate(res):
        # the first barrier and the async one were planned; the other five were not
        assert got["planned"] == [Collective.BARRIER] * 2, (r, got)
        assert_recorded(r, got["recorded"], 5, not env, 4)  # the 4 after the first
        assert got["seq"] == 7, (r, got)
        assert nranks == 1 or got["left"] >= came, (r, got)


def late_and_absent(comm) -> dict:
    comm.barrier()
    return absent_peer(comm, lambda timeout: comm.barrier(timeout=timeout), True)


def test_an_absent_peer_is_named():
    assert_absent_named(run_ranks(late_and_absent, 2, timeout=60), 2)


def killed(comm):
    return killed_peer(comm, comm.barrier)


def test_a_killed_peer_is_named():
    assert_killed_named(run_ranks(killed, 3, timeout=60, env=KILL_ENV))


def test_signals_while_a_peer_is_late():
    def call(comm):
        def both(x):  # the barrier waits for the late rank; the all-reduce checks the bits
            comm.barrier()
            comm.all_reduce(x)
        comm.barrier()
        return late_peer_with_signals(comm, both)

    hits, ok = zip(*run_ranks(call, 2, timeout=60))
    assert all(ok), ok
    assert hits[0] > 0, hits  # the handler ran while rank 0 waited
