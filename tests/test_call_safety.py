"""No silent corruption on the call path: aliasing inside a group and between calls in
flight, partly overlapping out=, two threads on one communicator, bad timeouts."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import ringtree
from ringtree.testing import raise_first, run_ranks


def tour(comm):
    r, n = comm.rank, comm.size
    x = np.full(1 << 20, r, np.float32)
    with comm.group():  # the README's ring shift: the same buffer sent and received
        comm.send(x, (r + 1) % n)
        comm.recv(x, (r - 1) % n)
    return np.unique(x).tolist()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_group_send_and_recv_of_one_buffer_shift_the_ring(transport):
    res = raise_first(run_ranks(tour, 4, timeout=120, env={"RINGTREE_TRANSPORT": transport}))
    assert res == [[float((r - 1) % 4)] for r in range(4)]


def two_writers(comm):
    peer = 1 - comm.rank
    x = np.zeros(1024, np.float32)

    def body():
        comm.send(np.ones(512, np.float32), peer)
        comm.send(np.ones(512, np.float32), peer)
        comm.recv(x[:512], peer)
        comm.recv(x[256:768], peer)

    return refused_group(comm, body)


def refused_group(comm, body) -> tuple[str, int]:
    """Run ``body`` inside one group: the ValueError it raised ("no error" if none), and
    an all-reduce after it, which shows the communicator still usable (nothing was sent)."""
    try:
        with comm.group():
            body()
    except ValueError as e:
        msg = str(e)
    else:
        msg = "no error"
    y = np.full(8, comm.rank + 1, np.int64)
    comm.all_reduce(y)
    return msg, int(y[0])


def test_overlapping_receives_in_a_group_are_refused_before_sending():
    res = raise_first(run_ranks(two_writers, 2, timeout=60))
    for msg, total in res:
        assert "write overlapping memory in one group" in msg and total == 3, msg


def chained_collectives(comm):
    """Collectives of one group on overlapping memory: each reads what the one before it
    wrote, as on one NCCL stream (before, they raced and the sums depended on timing)."""
    r = comm.rank
    seen = []
    for _ in range(3):
        x = np.full(1 << 20, r + 1, np.float32)
        y = np.zeros(1 << 20, np.float32)
        z = np.zeros(1 << 20, np.float32)
        with comm.group():
            comm.all_reduce(x, out=y)        # y = n(n+1)/2
            comm.all_reduce(y)               # in place on what the first writes: x n
            comm.all_reduce(y, out=z)        # reads it again: x n
            comm.all_reduce(np.ones(4, np.float32))  # independent: runs alongside
        seen.append((np.unique(y).tolist(), np.unique(z).tolist()))
    return seen


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_overlapping_collectives_in_a_group_run_in_issue_order(transport):
    res = raise_first(run_ranks(chained_collectives, 4, timeout=120,
                                env={"RINGTREE_TRANSPORT": transport}))
    want = [([40.0], [160.0])] * 3
    assert res == [want] * 4


def collective_with_p2p(comm, which):
    peer = 1 - comm.rank
    x = np.ones(1 << 12, np.float32)
    y = np.zeros(1 << 12, np.float32)

    def body():
        if which == "recv":
            comm.all_reduce(x)
            comm.recv(x, peer)           # writes what the collective uses
            comm.send(y, peer)
        else:
            comm.all_reduce(x, out=y)
            comm.all_reduce(y)           # would need ordering, beside p2p
            comm.send(x[:4], peer)
            comm.recv(np.zeros(4, np.float32), peer)

    return (*refused_group(comm, body), float(x[0]))


@pytest.mark.parametrize("which,words", [("recv", "write overlapping memory"),
                                         ("order", "also sends or receives")])
def test_collective_and_p2p_on_shared_memory_in_a_group_are_refused(which, words):
    res = raise_first(run_ranks(collective_with_p2p, 2, which, timeout=60))
    for msg, total, x0 in res:
        assert words in msg and total == 3 and x0 == 1.0, msg


def in_flight(comm):
    x = np.ones(1 << 20, np.float32)
    w1 = comm.all_reduce(x, async_op=True)
    w2 = comm.all_reduce(x[1 << 19:], async_op=True)  # overlaps w1's buffer
    w1.wait()
    w2.wait()
    return np.unique(x[:1 << 19]).tolist(), np.unique(x[1 << 19:]).tolist()


def test_overlapping_calls_in_flight_run_in_issue_order():
    res = raise_first(run_ranks(in_flight, 2, timeout=60))
    assert res == [([2.0], [4.0])] * 2


def partial_out(comm):
    n, r = comm.size, comm.rank
    x = np.ones(1 << 20, np.float32)
    errors = []
    cases = [
        lambda: comm.all_reduce(x[:-1024], out=x[1024:]),
        lambda: comm.reduce(x[:-1024], out=x[1024:], root=r),
        lambda: comm.all_gather(x[:1024], out=x[512:512 + 1024 * n]),
        lambda: comm.reduce_scatter(x[:1024 * n], out=x[100:1124]),
    ]
    for case in cases:
        try:
            case()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    y = np.full(1024, r + 1, np.float32)
    comm.all_reduce(y, out=y)  # exact aliasing stays in place
    g = np.zeros(1024 * n, np.float32)
    g[r * 1024:(r + 1) * 1024] = r + 1
    comm.all_gather(g[r * 1024:(r + 1) * 1024], out=g)  # in-place all-gather
    return errors, float(y[0]), g[::1024].tolist(), int((x != 1).sum())


def test_partly_overlapping_out_is_refused_and_exact_aliasing_is_in_place():
    for errors, y, g, touched in raise_first(run_ranks(partial_out, 2, timeout=60)):
        assert all(e is not None and "partly overlaps" in e for e in errors), errors
        assert y == 3.0 and g == [1.0, 2.0] and touched == 0


def two_threads(comm):
    out = {}

    def work(tid):
        try:
            for _ in range(5):
                x = np.full(1 << 14, (tid + 1) * 10 + comm.rank, np.float32)
                comm.all_reduce(x)
                out.setdefault(tid, set()).add(float(x[0]))
        except RuntimeError as e:
            out[tid] = str(e)

    ts = [threading.Thread(target=work, args=(t,), name=f"worker{t}") for t in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    handed = {}

    def adopt():
        comm.bind_thread()
        x = np.full(4, comm.rank + 1, np.float32)
        comm.all_reduce(x)
        handed["v"] = float(x[0])

    t = threading.Thread(target=adopt)
    t.start()
    t.join()
    comm.bind_thread()  # back to the main thread
    return out, handed.get("v")


def test_two_threads_on_one_communicator_are_refused():
    for out, handed in raise_first(run_ranks(two_threads, 2, timeout=60)):
        assert all(isinstance(v, str) and "its own communicator" in v for v in out.values()), out
        assert handed == 3.0


def warm_shape_from_another_thread(comm):
    """Five in-place all-reduces of 2 floats on the owning thread (the shape is warm: the
    planner hands it straight to its LL op), then the same shape and a new one from a
    second thread: both must be refused, warm or not."""
    x = np.ones(2, np.float32)
    for _ in range(5):
        comm.all_reduce(x)
    out = {}

    def other():
        for name, y in (("warm", x), ("new", np.ones(3, np.float32))):
            try:
                comm.all_reduce(y)
                out[name] = "ran"
            except RuntimeError as e:
                out[name] = str(e)

    t = threading.Thread(target=other, name="intruder")
    t.start()
    t.join()
    comm.all_reduce(x)  # the owner goes on, in step with the other rank
    return out, float(x[0])


def test_a_warm_shape_from_another_thread_is_refused_too():
    for out, v in raise_first(run_ranks(warm_shape_from_another_thread, 2, timeout=60)):
        assert "its own communicator" in out["warm"], out
        assert "its own communicator" in out["new"], out
        assert v == 2.0 ** 6


def bad_timeouts(comm):
    msgs = []
    for t in (-1, 0, 1e-9, math.nan, "5", True):
        try:
            comm.all_reduce(np.ones(4, np.float32), timeout=t)
            msgs.append(None)
        except (ValueError, TypeError) as e:
            msgs.append(str(e))
    x = np.full(4, comm.rank + 1, np.float32)
    comm.all_reduce(x, timeout=30)  # nothing was sent or numbered: still in step
    comm.send(x, 1 - comm.rank) if comm.rank == 0 else comm.recv(x, 0, timeout=30)
    return msgs, float(x[0])


def test_bad_call_timeouts_are_refused_before_sending():
    for msgs, v in raise_first(run_ranks(bad_timeouts, 2, timeout=60)):
        assert all(m is not None and "timeout" in m for m in msgs), msgs
        assert v == 3.0


def test_bind_thread_is_public():
    assert callable(getattr(ringtree.Communicator, "bind_thread", None))
