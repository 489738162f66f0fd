"""The streaming executor: overlapping calls, message order per connection, async work."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.testing import RankPool


@pytest.fixture(scope="module")
def pool3():
    with RankPool(3) as p:
        yield p


def isend_then_recv(comm, nbytes):
    """Both neighbours isend first, then block in recv: MPI's classic exchange."""
    n, r = comm.size, comm.rank
    out = np.full(nbytes // 8, r, dtype=np.int64)
    got = np.empty_like(out)
    w = comm.isend(out, (r + 1) % n)
    comm.recv(got, (r - 1) % n)
    w.wait(timeout=60)
    return bool((got == (r - 1) % n).all())


@pytest.mark.parametrize("nbytes", [8, 1 << 20, 32 << 20])
def test_isend_then_blocking_recv_does_not_deadlock(pool3, nbytes):
    assert all(pool3.run_ok(isend_then_recv, nbytes))


def grouped_rings(comm):
    """Several ring all-reduces in one group share channel 0: a later call's first send
    (which needs no data) must not overtake an earlier call's sends to the same peer."""
    n = comm.size
    xs = [np.full(300_000 + i, comm.rank + 10 * i, dtype=np.int64) for i in range(4)]
    with comm.group():
        for x in xs:
            comm.all_reduce(x, algo="ring")
    base = n * (n - 1) // 2
    return [bool((x == base + 10 * i * n).all()) for i, x in enumerate(xs)]


def test_grouped_collectives_keep_message_order(pool3):
    for r, ok in enumerate(pool3.run_ok(grouped_rings)):
        assert all(ok), f"rank {r}: {ok}"


def async_overlap(comm):
    """Async all-reduces in flight while the caller runs synchronous ones."""
    n = comm.size
    xs = [np.full(200_000, comm.rank + i, dtype=np.int64) for i in range(6)]
    works = [comm.all_reduce(x, async_op=True, algo="ring") for x in xs[:3]]
    y = comm.all_reduce(np.ones(5, dtype=np.int64))
    works += [comm.all_reduce(x, async_op=True) for x in xs[3:]]
    for w in works:
        w.wait(timeout=60)
    comm.synchronize()
    base = n * (n - 1) // 2
    return all(int(x[0]) == base + i * n for i, x in enumerate(xs)) and int(y[0]) == n


def test_async_collectives_overlap_with_synchronous_ones(pool3):
    assert all(pool3.run_ok(async_overlap))


def same_buffer_in_order(comm):
    """Async calls on one buffer run in issue order (memory order between batches): the
    broadcast must not send ``x`` before the all-reduce ahead of it has written it."""
    n = comm.size
    ok = []
    for k in range(4):
        x = np.full(300_000, comm.rank + 1, dtype=np.float32)
        works = [comm.all_reduce(x, async_op=True), comm.broadcast(x, k % n, async_op=True),
                 comm.all_reduce(x, async_op=True)]
        for w in works:
            w.wait(timeout=60)
        ok.append(bool((x == n * n * (n + 1) / 2).all()))
    return all(ok)


def test_async_calls_on_one_buffer_keep_memory_order(pool3):
    assert all(pool3.run_ok(same_buffer_in_order))


def abort_fails_pending_work(comm):
    """abort() makes an operation that can never complete raise instead of hanging."""
    if comm.rank == 0:
        w = comm.irecv(np.empty(4, dtype=np.int64), 1, tag=7)  # rank 1 never sends
        comm.abort()
        try:
            w.wait(timeout=30)
        except Exception as e:  # noqa: BLE001
            return type(e).__name__
        return "completed"
    return "idle"


def test_abort_fails_pending_work():
    from ringtree.testing import run_ranks

    res = run_ranks(abort_fails_pending_work, 2, timeout=60)
    assert res[0] == "CommAborted", res


def waiter_drives_its_recv(comm):
    """Rank 1 waits on an async receive; rank 0 sends only once rank 1's waiting thread
    holds the driver role, so the message is found by that thread, which completes the
    Work (its callbacks run on the driving thread), not the worker thread."""
    import threading
    import time

    key = "test/waiter-drives"
    x = np.zeros(1024, dtype=np.int64)
    if comm.rank == 0:
        comm.store.get(key, timeout=60)
        comm.send(np.arange(1024, dtype=np.int64), 1)
        return "sent"
    if comm.rank != 1:
        return "idle"
    me, done_on = threading.current_thread(), []
    w = comm.irecv(x, 0)
    w.add_done_callback(lambda _: done_on.append(threading.current_thread()))

    def tell_sender() -> None:  # once this thread drives (or after 10 s: the test fails)
        end = time.monotonic() + 10
        while comm.progress.driver is not me and time.monotonic() < end:
            time.sleep(0.001)
        comm.store.set(key, b"1")

    helper = threading.Thread(target=tell_sender)
    helper.start()
    w.wait()
    helper.join()
    assert (x == np.arange(1024)).all()
    return "waiter" if done_on == [me] else f"completed on {done_on}"


def test_a_waiting_thread_drives_its_own_async_receive(pool3):
    assert pool3.run_ok(waiter_drives_its_recv) == ["sent", "waiter", "idle"]
