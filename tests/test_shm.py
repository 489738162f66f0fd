"""The shared-memory transport: routing, framing, zero-copy receives, failures, clean-up.

The collective matrix over shm / tcp / mixed lives in ``test_transport_matrix.py``.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import ringtree
from ringtree.bootstrap.rendezvous import Peer
from ringtree.testing import run_ranks
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_segment as seg
from ringtree.transports.assign import routes
from ringtree.transports.base import HeaderMismatch
from ringtree.transports.shm import ShmTransport

pytestmark = pytest.mark.skipif(not os.path.isdir(seg.SHM_DIR), reason="needs /dev/shm")


def _names(tag: str) -> list[str]:
    return [n for n in os.listdir(seg.SHM_DIR) if n.startswith(f"{seg.PREFIX}{tag}-")]


def _shm(comm) -> ShmTransport:
    return next(t for t in comm.fabric.transports if isinstance(t, ShmTransport))


def _drive(fabric, reqs, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(r.done for r in reqs):
        if not fabric.poll():
            fabric.wait(0.05)
        assert time.monotonic() < deadline, "transfer did not finish"


# ---- routing ----------------------------------------------------------------------------


def _peers(*hosts: str) -> list[Peer]:
    return [Peer(r, "127.0.0.1", 0, h) for r, h in enumerate(hosts)]


def test_routes():
    hosts = _peers("a", "a", "b", "a")
    assert routes("auto", hosts, 0) == {"shm": [1, 3], "tcp": [2]}
    assert routes("auto", hosts, 2) == {"tcp": [0, 1, 3]}
    assert routes("tcp", hosts, 1) == {"tcp": [0, 2, 3]}
    assert routes("shm", _peers("a", "a"), 1) == {"shm": [0]}
    with pytest.raises(ValueError, match="rank 2 is on another host"):
        routes("shm", hosts, 0)


def routes_under(comm, mode):
    """Transport kind per peer of a communicator made under ``mode`` (split of world)."""
    os.environ["RINGTREE_TRANSPORT"] = "auto" if mode == "mixed" else mode
    os.environ["RINGTREE_HOST_ID"] = f"h{comm.rank % 2}" if mode == "mixed" else "one-host"
    sub = comm.split(0)
    try:
        x = np.full(1000, sub.rank + 1, np.int64)
        sub.all_reduce(x)
        kinds = {p: t.name for p, t in sub.fabric.routes.items()}
        return kinds, int(x[0])
    finally:
        sub.close()


@pytest.mark.parametrize("mode", ["auto", "shm", "tcp", "mixed"])
def test_transport_per_peer(mode):
    res = run_ranks(routes_under, 4, mode, timeout=60)
    for r, v in enumerate(res):
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        kinds, total = v
        assert total == 10
        for p, kind in kinds.items():
            if mode == "mixed":
                assert kind == ("shm" if p % 2 == r % 2 else "tcp"), (r, kinds)
            else:
                assert kind == ("tcp" if mode == "tcp" else "shm"), (r, kinds)


def test_bad_transport_name():
    res = run_ranks(lambda c: None, 1, env={"RINGTREE_TRANSPORT": "carrier-pigeon"})
    assert isinstance(res[0], BaseException) and "RINGTREE_TRANSPORT" in str(res[0])


# ---- framing ----------------------------------------------------------------------------


def raw_messages(comm):
    """Every size class through one ring: empty, < slot, = slot, several slots; copying
    and zero-copy receives; the header is checked before the payload lands."""
    f, peer = comm.fabric, 1 - comm.rank
    S = f.routes[peer].slot_bytes
    sizes = [0, 1, 7, S - 1, S, S + 1, 3 * S + 123, 5, 2 * S + 5]
    msgs = [np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)
            for i, n in enumerate(sizes)]
    hdr = [bytes([i]) * 32 for i in range(len(sizes))]
    if comm.rank == 0:
        reqs = [f.isend(1, 7, hdr[i], m) for i, m in enumerate(msgs)]
        reqs.append(f.isend(1, 7, b"\xee" * 32, np.arange(64, dtype=np.uint8)))
        _drive(f, reqs)
        comm.barrier()
        return [r.error for r in reqs]
    got, reqs = [], []
    for i, n in enumerate(sizes):
        if n <= S and i % 2:  # every other message that fits a slot: zero-copy
            reqs.append(f.irecv_view(0, 7, hdr[i], n))
            got.append(None)
        else:
            got.append(np.zeros(n, np.uint8))
            reqs.append(f.irecv(0, 7, hdr[i], got[-1]))
    ok = []
    for i, r in enumerate(reqs):  # a held view blocks its slot: read it, then release it
        _drive(f, [r])
        data = bytes(r.buf) if got[i] is None else got[i].tobytes()
        ok.append(r.error is None and data == msgs[i].tobytes())
        if got[i] is None:
            f.release(r)
    sentinel = np.full(64, 7, np.uint8)
    bad = f.irecv(0, 7, b"\xab" * 32, sentinel)  # expects another header
    _drive(f, [bad])
    comm.barrier()
    return (ok, type(bad.error).__name__, bad.error.got[:1], bool((sentinel == 7).all()),
            f.routes[0].direct[0])


@pytest.mark.parametrize("direct_min", [0, 1 << 20, (2 << 20) + 10],
                         ids=["slots", "direct", "mixed"])
def test_framing_sizes_views_and_header_check(direct_min):
    """Messages of every size through slots only, or with the large ones read straight
    from the sender's memory (cross-memory attach), or both kinds interleaved (slots that
    carried a direct message are reused by later multi-slot ones)."""
    direct = direct_min > 0
    if direct and not cma.supported():
        pytest.skip("no process_vm_readv here")
    env = {"RINGTREE_TRANSPORT": "shm", "RINGTREE_SHM_DIRECT_MIN": str(direct_min)}
    res = run_ranks(raw_messages, 2, timeout=60, env=env)
    assert res[0] == [None] * 10, res[0]
    ok, err, got, untouched, used_direct = res[1]
    assert all(ok), ok
    assert err == HeaderMismatch.__name__ and got == b"\xee"
    assert untouched, "payload of a mismatched message landed in user memory"
    assert used_direct == direct


def many_in_flight(comm):
    """More messages in flight than slots, both directions at once (full duplex)."""
    f, peer = comm.fabric, 1 - comm.rank
    n = 40
    out = [np.full(3000 + i, i, np.uint16) for i in range(n)]
    into = [np.zeros(3000 + i, np.uint16) for i in range(n)]
    reqs = [f.isend(peer, 3, b"h" * 32, o) for o in out]
    reqs += [f.irecv(peer, 3, b"h" * 32, x) for x in into]
    _drive(f, reqs)
    return all(int(x[0]) == i and x.size == 3000 + i and (x == i).all()
               for i, x in enumerate(into))


def test_full_duplex_more_messages_than_slots():
    assert run_ranks(many_in_flight, 2, timeout=60,
                     env={"RINGTREE_TRANSPORT": "shm", "RINGTREE_SHM_SLOTS": "2"}) == [True] * 2


# ---- segments ---------------------------------------------------------------------------


def test_start_time_and_zombies():
    assert seg.alive(os.getpid(), seg.start_time(os.getpid()))
    assert not seg.alive(os.getpid(), (seg.start_time(os.getpid()) or 0) + 1)  # reused pid
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    time.sleep(0.2)  # a zombie until reaped: dead for us
    assert not seg.alive(pid)
    os.waitpid(pid, 0)
    assert not seg.alive(pid)


def test_create_race_and_stale_cleanup():
    ns = seg.pid_namespace()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that is certainly dead now
    dead = f"{seg.PREFIX}test{os.getpid()}-x-p{pid}-n{ns}"
    live = f"{seg.PREFIX}test{os.getpid()}-y-p{os.getpid()}-n{ns}"
    other_ns = f"{seg.PREFIX}test{os.getpid()}-z-p{pid}-n{ns}0"
    try:
        a = seg.Segment.create_or_attach(dead, 8192, lambda arr: arr.__setitem__(0, 42))
        b = seg.Segment.create_or_attach(dead, 8192)
        assert a.created and not b.created and b.array[0] == 42
        a.array[1] = 7
        assert b.array[1] == 7  # the same memory
        seg.Segment.create_or_attach(live, 4096)
        seg.Segment.create_or_attach(other_ns, 4096)
        removed = seg.clean_stale(f"{seg.PREFIX}test{os.getpid()}-")
        assert removed == [dead]
        assert b.array[1] == 7  # unlinking leaves mappings intact
    finally:
        for n in (dead, live, other_ns):
            if os.path.exists(seg.path_of(n)):
                os.unlink(seg.path_of(n))


# ---- failures and clean-up ----------------------------------------------------------------


def killed_in_shm(comm, victim, orphan):
    t = _shm(comm)
    x = np.ones(1 << 18, np.float32)
    comm.all_reduce(x)
    if orphan and comm.rank == victim:
        comm.send(np.ones(10, np.float32), 0, tag=5)  # a ring nobody will ever open
    comm.barrier()
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(3):
            comm.all_reduce(x, timeout=60)
    except ringtree.RingtreeError as e:
        return t.tag, type(e).__name__, str(e), time.monotonic() - t0
    return t.tag, None, None, None


@pytest.mark.parametrize("n,victim,orphan", [(2, 0, False), (3, 1, True), (4, 2, False)])
def test_killed_rank_is_named_and_nothing_is_left(n, victim, orphan):
    res = run_ranks(killed_in_shm, n, victim, orphan, timeout=120,
                    env={"RINGTREE_TRANSPORT": "shm"})
    tags = set()
    for r, v in enumerate(res):
        if r == victim:
            assert isinstance(v, BaseException)
            continue
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        tag, name, msg, _ = v
        tags.add(tag)
        assert name is not None, f"rank {r} did not notice"
        assert f"rank {victim}" in msg, f"rank {r}: {msg}"
        assert name != "CollectiveTimeout", f"rank {r} only noticed by timeout: {msg}"
    (tag,) = tags
    assert _names(tag) == []


def closes_early(comm):
    if comm.rank == 1:
        comm.close()
        return "closed"
    x = np.zeros(10, np.float32)
    t0 = time.monotonic()
    try:
        comm.recv(x, 1, timeout=60)
    except ringtree.RingtreeError as e:
        return str(e), time.monotonic() - t0
    return None


def test_peer_that_closes_is_named():
    res = run_ranks(closes_early, 2, timeout=90, env={"RINGTREE_TRANSPORT": "shm"})
    assert res[1] == "closed"
    msg, took = res[0]
    assert "rank 1" in msg and "closed" in msg, msg


def sent_then_closed(comm):
    """Eager sends outlive the sender: rank 1 sends and closes before rank 0 even looks."""
    if comm.rank == 1:
        comm.send(np.arange(1 << 16, dtype=np.int32), 0)
        comm.barrier()
        return "sent"
    comm.barrier()
    time.sleep(0.3)
    x = np.zeros(1 << 16, np.int32)
    comm.recv(x, 1, timeout=30)
    return bool((x == np.arange(1 << 16)).all())


def test_data_sent_before_close_is_delivered():
    assert run_ranks(sent_then_closed, 2, timeout=60,
                     env={"RINGTREE_TRANSPORT": "shm"}) == [True, "sent"]


def killed_job(comm, q):
    x = np.ones(1 << 16, np.float32)
    comm.all_reduce(x)
    if comm.rank == 0:
        q.put(_shm(comm).tag)
    while True:  # everyone keeps exchanging until killed
        comm.all_reduce(x)


def test_killed_job_leaves_nothing_after_cleanup():
    import multiprocessing as mp

    q = mp.get_context("fork").Queue()
    ctx = mp.get_context("fork")
    p = ctx.Process(target=run_ranks, args=(killed_job, 3, q),
                    kwargs={"timeout": 2.0, "env": {"RINGTREE_TRANSPORT": "shm"}})
    p.start()
    tag = q.get(timeout=60)
    p.join(60)  # run_ranks kills every rank at its timeout: a job killed mid-collective
    assert not p.is_alive()
    time.sleep(0.2)
    seg.clean_stale()  # what the next ringtree process on this host does when it starts
    assert _names(tag) == []


def forked_child_exits(comm):
    """A child forked by a rank (a data-loader worker, say) that exits normally must not
    close its parent's communicator."""
    pid = os.fork()
    if pid == 0:
        import atexit

        atexit._run_exitfuncs()  # what a normal exit of the child runs
        os._exit(0)
    os.waitpid(pid, 0)
    x = np.full(1000, comm.rank + 1, np.int64)
    comm.all_reduce(x, timeout=30)
    return int(x[0])


def test_forked_child_does_not_close_the_parent():
    assert run_ranks(forked_child_exits, 2, timeout=60,
                     env={"RINGTREE_TRANSPORT": "shm"}) == [3, 3]


def interrupted_wait(comm):
    """Another thread cuts a fabric sleep short (how work submitted meanwhile gets going)."""
    import threading

    if comm.rank == 0:
        comm.barrier()
        return None
    f = comm.fabric
    f.irecv(0, 77, b"x" * 32, np.zeros(8, np.uint8))  # never sent: the fabric stays busy
    threading.Timer(0.2, f.interrupt).start()
    t0 = time.monotonic()
    f.wait(60.0)
    took = time.monotonic() - t0
    comm.barrier()
    return took


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_interrupt_wakes_a_sleeping_fabric(transport):
    res = run_ranks(interrupted_wait, 2, timeout=90, env={"RINGTREE_TRANSPORT": transport})
    assert res[1] < 30, res  # woken, not timed out (generous: a functional check)


def probing(comm):
    """``has_message``: a message waits with no receive posted (receive-from-any-source)."""
    t = _shm(comm)
    if comm.rank == 1:
        comm.send(np.arange(5, dtype=np.int32), 0, tag=3)
        comm.barrier()
        return None
    comm.barrier()  # rank 1's send is complete (eager): the message sits in the ring
    before = [t.has_message(1, c) for c in range(64, 64 + 8)]
    x = np.zeros(5, np.int32)
    comm.recv(x, 1, tag=3)
    after = [t.has_message(1, c) for c in range(64, 64 + 8)]
    return before, after, x.tolist()


def test_has_message():
    res = run_ranks(probing, 2, timeout=60, env={"RINGTREE_TRANSPORT": "shm"})
    before, after, x = res[0]
    assert x == [0, 1, 2, 3, 4]
    assert sum(before) == 1 and not any(after), (before, after)
