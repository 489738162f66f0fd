"""The executor alone, in one process: N ranks' executors over an in-memory loopback fabric.

As gloo's ``transport_test`` exercises a transport without a job, this drives every
rank's :class:`~ringtree.runtime.executor.Executor` from one thread, one
:meth:`~ringtree.runtime.executor.Executor.advance` round each in turn, over
:class:`Loopback`: messages are copied into a queue per (sender, receiver, channel) and
matched to receives in order, header compared first, as the real transports do. So the
scheduler (in-order issue, out-of-order completion, slices, send turns), the step phases,
the observer and the snapshot are tested with no processes, sockets or shared memory.
"""

from __future__ import annotations

import threading
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from ringtree import api
from ringtree.errors import CollectiveTimeout, MismatchError, RingtreeError
from ringtree.prof.recorder import Ev, ProfileObserver, Recorder
from ringtree.runtime.executor import Executor
from ringtree.runtime.planner import Planner
from ringtree.transports.base import HeaderMismatch, Request


class Wire:
    """What every rank's fabric shares: messages in flight per (src, dst, channel)."""

    def __init__(self) -> None:
        self.msgs: dict[tuple[int, int, int], deque[tuple[bytes, bytes]]] = {}


class Loopback:
    """One rank's end of the wire: eager sends, receives matched in order on ``poll``;
    ``views``: reduce straight out of the message (the zero-copy receive path)."""

    def __init__(self, wire: Wire, rank: int, views: bool = False):
        self.wire, self.rank, self.views = wire, rank, views
        self.recvs: dict[tuple[int, int], deque[Request]] = {}
        self.released = 0

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        data = payload.reshape(-1).view(np.uint8).tobytes()
        self.wire.msgs.setdefault((self.rank, peer, channel), deque()).append((header, data))
        req = Request(peer, channel, header, payload, True)
        req.done = True
        return req

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        req = Request(peer, channel, header, into.reshape(-1).view(np.uint8), False)
        self.recvs.setdefault((peer, channel), deque()).append(req)
        return req

    def can_view(self, peer: int, nbytes: int) -> bool:
        return self.views

    def irecv_view(self, peer: int, channel: int, header: bytes, nbytes: int) -> Request:
        req = self.irecv(peer, channel, header, np.empty(0, np.uint8))
        req.pos = -1  # marks a view: ``buf`` becomes the message itself
        return req

    def release(self, req: Request) -> None:
        self.released += 1

    def has_message(self, peer: int, channel: int) -> bool:
        return bool(self.wire.msgs.get((peer, self.rank, channel))) and \
            not self.recvs.get((peer, channel))

    def poll(self) -> bool:
        moved = False
        for (peer, ch), q in self.recvs.items():
            msgs = self.wire.msgs.get((peer, self.rank, ch))
            while q and msgs:
                req = q.popleft()
                header, data = msgs.popleft()
                moved = True
                if header != req.header:
                    req.fail(HeaderMismatch(peer, req.header, header))
                    continue
                if req.pos == -1:
                    req.buf = np.frombuffer(bytearray(data), np.uint8)
                else:
                    req.buf[:] = np.frombuffer(data, np.uint8)
                req.pos = len(data)
                req.done = True
        return moved

    def wait(self, timeout: float) -> None:
        threading.Event().wait(min(timeout, 0.001))


def make_ranks(n: int, *, slice_bytes: int = 4096, views: bool = False):
    wire = Wire()
    ranks = []
    for r in range(n):
        planner = Planner(r, n, (0,) * n, nchannels=1, slice_bytes=slice_bytes,
                          algo_enabled={}, link="shm")
        ex = Executor(r, Loopback(wire, r, views))
        ranks.append(SimpleNamespace(rank=r, size=n, planner=planner, ex=ex, seq=0))
    return ranks


def submit(ranks, build, *, timeout: float = 30.0) -> list:
    """``build(comm)`` -> CallSpec on every rank; submit its call; return the batches."""
    batches = []
    for c in ranks:
        spec = build(c)
        c.seq += 1
        call = c.planner.plan(spec).bind(spec, c.seq, c.size)
        batches.append(c.ex.submit([call], timeout))
    return batches


def run_all(ranks, batches, rounds: int = 100_000) -> None:
    """Round-robin: one advance of every rank, then its fabric's poll, until all done."""
    for _ in range(rounds):
        if all(b.done for b in batches):
            break
        for c in ranks:
            c.ex.advance()
            c.ex.fabric.poll()
    else:
        raise AssertionError("the executors made no progress")
    for b in batches:
        if b.error is not None:
            raise b.error


ALGOS = ["ring", "tree", "tree_updown", "rabenseifner", "recursive_doubling", "direct"]


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("views", [False, True])
def test_all_reduce_is_bitwise_exact(n, algo, views):
    ranks = make_ranks(n, slice_bytes=1024, views=views)  # many slices per step
    xs = [np.arange(3001, dtype=np.int64) * (r + 1) for r in range(n)]
    try:
        batches = submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None, algo))
    except (KeyError, ValueError) as e:  # an algorithm this rank count does not have
        pytest.skip(str(e))
    run_all(ranks, batches)
    want = np.arange(3001, dtype=np.int64) * (n * (n + 1) // 2)
    for x in xs:
        assert np.array_equal(x, want)
    if views:  # reduces read the peer's message in place, then give it back
        assert sum(c.ex.fabric.released for c in ranks) > 0


@pytest.mark.parametrize("n", [2, 4])
def test_gather_scatter_family(n):
    ranks = make_ranks(n, slice_bytes=512)
    xs = [np.full(700, r, np.float32) for r in range(n)]
    batches = submit(ranks, lambda c: api.for_all_gather(c, xs[c.rank], None, None))
    outs = [b.calls[0].bufs[1] for b in batches]
    run_all(ranks, batches)
    for o in outs:
        assert np.array_equal(o.reshape(n, 700), np.repeat(np.arange(n, dtype=np.float32),
                                                           700).reshape(n, 700))
    ys = [np.arange(n * 300, dtype=np.float64) + r for r in range(n)]
    batches = submit(ranks, lambda c: api.for_reduce_scatter(c, ys[c.rank], "max", None, None))
    outs = [b.calls[0].bufs[1] for b in batches]
    run_all(ranks, batches)
    for r, o in enumerate(outs):
        assert np.array_equal(o, np.arange(r * 300, (r + 1) * 300, dtype=np.float64) + n - 1)
    zs = [np.full(999, 7 if r == n - 1 else -1, np.int32) for r in range(n)]
    run_all(ranks, submit(ranks, lambda c: api.for_broadcast(c, zs[c.rank], n - 1, None)))
    assert all((z == 7).all() for z in zs)


def test_calls_in_flight_overlap_and_keep_memory_order():
    """Two all-reduces submitted back to back on the same buffer: the second starts after
    the first (memory order), and both land."""
    ranks = make_ranks(3, slice_bytes=256)
    xs = [np.ones(1000, np.int64) for _ in ranks]
    b1 = submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None, "ring"))
    b2 = submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None, "ring"))
    assert all(b.after for b in b2)
    run_all(ranks, b1 + b2)
    assert all((x == 9).all() for x in xs)


def test_mismatched_count_is_named():
    ranks = make_ranks(2)
    xs = [np.ones(10 + r, np.float32) for r in range(2)]
    batches = submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None, "ring"))
    with pytest.raises(MismatchError, match="count"):
        run_all(ranks, batches)


def test_timeout_names_the_missing_peer_and_snapshot_shows_the_wait():
    ranks = make_ranks(2)
    spec = api.for_all_reduce(ranks[0], np.ones(64, np.float32), "sum", None, "ring")
    call = ranks[0].planner.plan(spec).bind(spec, 1, 2)
    ex = ranks[0].ex
    lock = threading.Condition()
    with lock:
        batch = ex.submit([call], 0.05)
        ex.drive(lambda: batch.done, lock)
    assert isinstance(batch.error, CollectiveTimeout)
    assert "receive from rank 1" in str(batch.error)
    waits = [w for w in ex.snapshot() if w.req is not None and not w.req.done]
    assert waits and all(w.req.peer == 1 and w.call is call for w in waits)
    assert not ex.busy


class _SwitchGone(RingtreeError):
    """Stands for the switch client's error: a ringtree error that is not a PeerError."""


def test_a_failed_request_of_another_kind_aborts_every_batch_through_on_error():
    """A request that fails with an error other than a mismatch or a lost peer (a dead
    switch) still fails every batch through ``on_error``, named with the rank and the
    call, and leaves the executor clean; it used to escape from ``advance`` raw, so the
    rank never told the others and they waited out their timeout."""
    ranks = make_ranks(2)
    xs = [np.ones(64, np.float32) for _ in ranks]
    seen = []
    ex = ranks[0].ex
    ex.on_error = lambda e: seen.append(e) or e
    first = submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None, "ring"))
    later = submit(ranks[:1], lambda c: api.for_all_reduce(c, xs[0], "sum", None, "ring"))
    poll = ex.fabric.poll

    def failing_poll() -> bool:
        for q in ex.fabric.recvs.values():
            while q:
                q.popleft().fail(_SwitchGone("lost the switch at 10.0.0.9:7300"))
        return poll()

    ex.fabric.poll = failing_poll
    for _ in range(100):
        ex.advance()
        ex.fabric.poll()
        if first[0].done:
            break
    assert first[0].done and later[0].done
    for b in (first[0], later[0]):
        assert isinstance(b.error, _SwitchGone)
        assert str(b.error).startswith("rank 0: lost the switch at 10.0.0.9:7300 during ")
    assert len(seen) == 1 and not ex.busy


def test_profile_observer_records_every_step():
    ranks = make_ranks(2, slice_bytes=1024)
    recs = [Recorder(1 << 12) for _ in ranks]
    for c, rec in zip(ranks, recs):
        c.ex.observe(ProfileObserver(rec))
    xs = [np.ones(1000, np.float32) for _ in ranks]
    batches = submit(ranks, lambda c: api.for_all_reduce(c, xs[c.rank], "sum", None, "ring"))
    nsteps = [sum(1 for ch in b.calls[0].steps for cs in ch if cs.length) for b in batches]
    run_all(ranks, batches)
    for rec, want in zip(recs, nsteps):
        ev = rec.events()
        assert (ev["type"] == Ev.STEP).sum() == want
        assert (ev["type"] == Ev.COLL_ENTRY).sum() == 1 == (ev["type"] == Ev.COLL_EXIT).sum()
        sends, waits = ev[ev["type"] == Ev.SEND], ev[ev["type"] == Ev.RECV_WAIT]
        assert len(sends) == len(waits) > 1  # one per slice each way
    assert ranks[0].ex.observe(None).active  # detaching returns the profiler
    assert not ranks[0].ex.observer.active
