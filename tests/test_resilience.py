"""Revoke, agree and shrink (ringtree.resilience) with real processes and SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import ringtree
from ringtree.testing import run_ranks


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def revoke_while_blocked(comm, count: int, how: str):
    """``idle``: rank 0 stays out of the call and revokes. ``thread``: rank 0 stays out
    (1 s) while a second thread of rank 1 revokes with rank 1's own call blocked. Every
    call must end in CommRevoked, on every rank, long before the 120 s timeout."""
    x = np.ones(count, np.float32)
    comm.all_reduce(x)
    comm.agree(1)  # everyone has left that call: a revoke now cannot fail it anywhere
    if comm.rank == 0:
        time.sleep(0.3 if how == "idle" else 1.0)
        if how == "idle":
            comm.revoke()
    elif comm.rank == 1 and how == "thread":
        threading.Timer(0.3, comm.revoke).start()
    try:
        comm.all_reduce(x, timeout=120)
    except ringtree.RingtreeError as e:
        first = type(e).__name__
    else:
        first = None
    try:
        comm.all_reduce(x, timeout=120)
        later = None
    except ringtree.RingtreeError as e:
        later = type(e).__name__
    return first, later, comm.is_revoked()


@pytest.mark.parametrize("how", ["idle", "thread"])
@pytest.mark.parametrize("count", [8, 1 << 20], ids=["LL", "Simple"])
def test_revoke_reaches_every_rank(count, how):
    res = run_ranks(revoke_while_blocked, 3, count, how, timeout=90)
    for r, v in enumerate(res):
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        assert v == ("CommRevoked", "CommRevoked", True), f"rank {r}: {v}"


def kill_then_recover(comm):
    """Rank 2 dies inside an all-reduce, rank 3 during the recovery's agreement; the
    survivors agree on one value and one failed set and carry on, shrunk, and no thread
    of the old communicator or the new one is left once the new one is closed."""
    x = np.ones(1024, np.float32)
    comm.all_reduce(x, async_op=True).wait()  # starts this rank's worker threads
    comm.all_reduce(np.ones(1 << 18, np.float32), async_op=True).wait()
    if comm.rank == 2:
        _die()
    try:
        comm.all_reduce(x, timeout=120)
        err = None
    except ringtree.RingtreeError as e:
        err = (type(e).__name__, getattr(e, "peer", None), str(e))
    comm.revoke()
    if comm.rank == 3:
        time.sleep(0.2)
        _die()
    value = comm.agree(0xF & ~(1 << comm.rank))
    failed = comm.failed_ranks()
    acked = comm.ack_failed()
    child = comm.shrink()
    # read before the child's first call: once that call is done here, the other
    # survivor may have returned and exited, and a rank gone is a failed rank
    failed_after = comm.failed_ranks()
    y = np.full(1 << 18, child.rank + 1, np.float32)  # Simple at this size
    child.all_reduce(y)
    z = np.full(8, 2.0, np.float64)
    child.all_reduce(z)  # LL
    out = (err, value, failed, acked, child.rank, child.size, child.world_ranks,
           float(y[0]), float(z[0]), failed_after)
    child.close()
    deadline = time.monotonic() + 10  # the workers let go exit at their next wake-up
    while _workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    return (*out, _workers())


def _workers() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("ringtree-rank", "ringtree-ll"))]


def test_agree_and_shrink_survive_two_deaths():
    res = run_ranks(kill_then_recover, 4, timeout=120)
    assert isinstance(res[2], BaseException) and isinstance(res[3], BaseException)
    for r in (0, 1):
        err, value, failed, acked, crank, csize, world, y, z, failed_after, left = res[r]
        assert left == [], f"rank {r}: threads left behind: {left}"
        assert err is not None and "rank 2" in err[2], f"rank {r}: {err}"
        assert err[0] != "CollectiveTimeout", f"rank {r} noticed only by timeout: {err}"
        # flags of the contributors 0 and 1 (and 3 if it posted before dying)
        assert value in (0xF & ~0b0011, 0xF & ~0b1011), value
        assert sorted(failed) in ([2], [2, 3]), failed
        assert sorted(failed_after) == [2, 3]
        assert acked == len(failed)
        assert (crank, csize, world) == (r, 2, (0, 1))
        assert (y, z) == (3.0, 4.0)
    assert res[0][1:4] == res[1][1:4]  # uniform: the same value and failed set


def sub_group_shrink(comm):
    sub = comm.new_group([0, 1, 3])
    if comm.rank == 2:
        return None
    x = np.ones(64, np.float32)
    sub.all_reduce(x)
    if comm.rank == 3:
        _die()
    try:
        sub.all_reduce(x, timeout=120)
    except ringtree.RingtreeError:
        pass
    child = sub.shrink()
    x = np.full(64, comm.rank + 1.0, np.float32)
    child.all_reduce(x)
    out = (child.size, child.world_ranks, float(x[0]))
    child.close()
    return out


def test_shrink_a_sub_communicator():
    res = run_ranks(sub_group_shrink, 4, timeout=120)
    assert res[2] is None and isinstance(res[3], BaseException)
    assert res[0] == res[1] == (2, (0, 1), 3.0)


def shrink_excluding(comm):
    if comm.rank == 2:
        return "excluded"
    with pytest.raises(ValueError, match="own exclude list"):
        comm.shrink(exclude=[comm.rank])
    child = comm.shrink(exclude=[2])
    x = np.ones(16, np.int64)
    child.all_reduce(x)
    out = (child.rank, child.size, int(x[0]))
    child.close()
    return out


def test_shrink_with_an_exclude_list():
    res = run_ranks(shrink_excluding, 3, timeout=90)
    assert res == [(0, 2, 2), (1, 2, 2), "excluded"]


def lone_survivor(comm):
    if comm.rank == 1:
        _die()
    time.sleep(0.2)
    with pytest.raises(ringtree.RecoveryError, match="at least 2"):
        comm.shrink(min_ranks="majority")
    return "refused"


def test_shrink_refuses_below_the_required_size():
    res = run_ranks(lone_survivor, 2, timeout=60)
    assert res[0] == "refused"


def stream_with_damage(comm):
    """Ranks 0 and 1 hold the state, rank 2 is new; chunk 1 is damaged on its first trip
    (by rank 0, its first sender: chunks 0-1 of the first array are rank 0's, 2-3 rank
    1's) and must come again, from rank 1."""
    from ringtree.resilience.transfer import stream

    n = 50_000
    a = np.arange(n, dtype=np.float32) if comm.rank < 2 else np.zeros(n, np.float32)
    b = np.arange(7, dtype=np.int64) * 3 if comm.rank < 2 else np.zeros(7, np.int64)

    def damage(i, chunk):
        return chunk if i != 1 else np.bitwise_xor(chunk, np.uint8(0x40))

    stats = stream(comm, [a, b], [0, 1], [2], chunk_bytes=64 << 10,
                   corrupt=damage if comm.rank == 0 else None)
    return stats, bool((a == np.arange(n, dtype=np.float32)).all()), b.tolist()


def test_state_stream_refetches_a_damaged_chunk():
    res = run_ranks(stream_with_damage, 3, timeout=60)
    for r, (stats, same, b) in enumerate(res):
        assert same and b == [0, 3, 6, 9, 12, 15, 18], f"rank {r}"
        assert stats == {"chunks": 5, "bytes": 50_000 * 4 + 56, "refetched": 1}


def shrink_cycles(comm, cycles: int):
    """Revoke and shrink (nobody failed: the same ranks) ``cycles`` times: descriptors,
    threads and shared-memory names of this process must not grow with the number of
    rounds. (A closed communicator's descriptors go when the garbage collector frees it:
    its objects form reference cycles, so ``gc.collect()`` first.)"""
    import gc

    def held():
        gc.collect()
        mine = f"-p{os.getpid()}-"
        shm = [n for n in os.listdir("/dev/shm") if n.startswith("ringtree-") and mine in n]
        threads = [t.name for t in threading.enumerate() if t.name.startswith("ringtree-")]
        return len(os.listdir(f"/proc/{os.getpid()}/fd")), len(threads), len(shm)

    seen = []
    for i in range(cycles):
        comm.all_reduce(np.ones(1 << 16, np.float32), async_op=True).wait()
        comm.agree(1)  # nobody still reads the call above: revoking cannot fail it
        comm.revoke()
        comm = comm.shrink()
        x = np.ones(1 << 16, np.float32)
        comm.all_reduce(x)
        if i in (1, cycles - 1):
            time.sleep(0.6)  # a worker let go exits at its next wake-up (0.5 s)
            seen.append(held())
    out = (comm.size, float(x[0]), seen)
    comm.close()
    return out


def test_fifty_revoke_shrink_cycles_hold_nothing_more():
    res = run_ranks(shrink_cycles, 3, 50, timeout=300)
    for r, (size, x, seen) in enumerate(res):
        assert size == 3 and x == 3.0
        assert seen[1] <= seen[0], f"rank {r}: (fds, threads, shm names) {seen}"


def stopped_rank(comm):
    """Rank 2 stops itself (SIGSTOP) before the agreement: alive to ``/proc``, so the
    others wait out the agreement's deadline, declare it failed and shrink; continued,
    it learns it is out instead of joining a view the others do not share."""
    pids = comm.all_gather_object(os.getpid())
    comm.agree(1)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
        try:
            comm.agree(1, timeout=60)
        except ringtree.RecoveryError as e:
            return "out", str(e)
        return "in", None
    value = comm.agree(1, timeout=1.0)
    failed = comm.failed_ranks()
    if comm.rank == 0:
        os.kill(pids[2], signal.SIGCONT)
    child = comm.shrink()
    x = np.ones(8, np.float32)
    child.all_reduce(x)
    out = (value, failed, child.size, float(x[0]))
    child.close()
    return out


def test_a_stopped_rank_is_declared_failed_by_the_deadline():
    res = run_ranks(stopped_rank, 3, timeout=120)
    assert res[0] == res[1] == (1, [2], 2, 2.0), res
    assert res[2][0] == "out" and "declared this rank failed" in res[2][1], res[2]


def death_during_shrink(comm):
    """Rank 2 dies in an all-reduce; rank 3 dies inside shrink, after the agreement and
    before the child's rendezvous: the others' first child cannot form, and shrink ends
    in one membership anyway, {0, 1}."""
    import sys

    shrink_module = sys.modules["ringtree.resilience.shrink"]  # (the package's
    x = np.ones(64, np.float32)                                 # "shrink" is the function)
    comm.all_reduce(x)
    if comm.rank == 2:
        _die()
    try:
        comm.all_reduce(x, timeout=120)
    except ringtree.RingtreeError:
        pass
    if comm.rank == 3:
        shrink_module.build_child = lambda *a, **k: _die()
    child = comm.shrink()
    failed = comm.failed_ranks()  # before the child's call (see kill_then_recover)
    y = np.ones(64, np.float32)
    child.all_reduce(y)
    out = (child.size, child.world_ranks, float(y[0]), failed)
    child.close()
    return out


def test_a_death_during_shrink_still_ends_in_one_membership():
    res = run_ranks(death_during_shrink, 4, timeout=120)
    assert isinstance(res[2], BaseException) and isinstance(res[3], BaseException)
    assert res[0] == res[1] == (2, (0, 1), 2.0, [2, 3]), res[:2]


def two_communicators_fail(comm, crossed: bool):
    """Rank 2 belongs to the world and to a sub-communicator of ranks 0-2, and dies: both
    fail at once (ULFM's overlapping communicators). The survivors shrink both — in the
    same order, or (``crossed``) rank 0 the sub-communicator first and rank 1 the world
    first, so each first waits in an agreement the other has not entered."""
    sub = comm.new_group([0, 1, 2])
    x = np.ones(16, np.float32)
    comm.all_reduce(x)
    if comm.rank < 3:
        sub.all_reduce(x)
    if comm.rank == 2:
        _die()
    try:
        comm.all_reduce(x, timeout=60)
    except ringtree.RingtreeError:
        pass
    order = [comm, sub] if comm.rank < 3 else [comm]
    if crossed and comm.rank == 0:
        order.reverse()
    out = {}
    for c in order:
        try:
            child = c.shrink()
        except ringtree.RingtreeError as e:
            out["world" if c is comm else "sub"] = type(e).__name__
            continue
        y = np.ones(4, np.float32)
        child.all_reduce(y)
        out["world" if c is comm else "sub"] = (child.world_ranks, float(y[0]))
        child.close()
    return out


def test_two_communicators_failing_at_once_recover_in_the_same_order():
    res = run_ranks(two_communicators_fail, 4, False, timeout=120)
    assert res[0] == res[1] == {"world": ((0, 1, 3), 3.0), "sub": ((0, 1), 2.0)}, res
    assert res[3] == {"world": ((0, 1, 3), 3.0)}, res


def test_two_communicators_shrunk_in_crossed_orders_end_by_the_deadline():
    """Crossed orders: no hang. Each agreement ends at its deadline (RINGTREE_TIMEOUT, 3 s
    here) without the rank that is waiting elsewhere, so the memberships lose it, the same
    on every rank that completes (ULFM's known case; the limit in docs/fault-tolerance.md)."""
    res = run_ranks(two_communicators_fail, 4, True, timeout=120,
                    env={"RINGTREE_TIMEOUT": "3"})
    assert all(isinstance(r, dict) for r in res if not isinstance(r, BaseException)), res
    assert isinstance(res[2], BaseException), res
    worlds = {r["world"] for r in (res[0], res[1], res[3]) if isinstance(r.get("world"), tuple)}
    assert len({w[0] for w in worlds}) <= 1, res  # one world membership among those that formed it


def eight_ranks_one_dies(comm):
    """N = 8 on 2 cores: rank 5 dies inside an all-reduce; every survivor names it,
    agrees on it and carries on shrunk."""
    x = np.ones(1 << 12, np.float32)
    comm.all_reduce(x)
    if comm.rank == 5:
        _die()
    try:
        comm.all_reduce(x, timeout=120)
        named = None
    except ringtree.RingtreeError as e:
        named = "rank 5" in str(e)
    value = comm.agree(1)
    child = comm.shrink()
    y = np.ones(8, np.float32)
    child.all_reduce(y)
    out = (named, value, comm.failed_ranks()[:1], child.world_ranks, float(y[0]))
    child.close()
    return out


def test_eight_ranks_one_killed():
    res = run_ranks(eight_ranks_one_dies, 8, timeout=180)
    assert isinstance(res[5], BaseException), res
    want = (True, 1, [5], (0, 1, 2, 3, 4, 6, 7), 7.0)
    assert all(res[r] == want for r in range(8) if r != 5), res
