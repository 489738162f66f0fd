"""The aggregation switch on its own: exact reductions, loss recovery, isolation, failures.

Workers are threads holding real TCP links to a real switch process (or, where the test
needs to look inside, a switch serving from a thread). Inputs are small integers so every
sum is exact in every dtype; the expected value is computed independently with NumPy.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ringtree.dtypes import DType
from ringtree.ops import ReduceOp
from ringtree.switch import SwitchError, SwitchLink
from ringtree.switch.server import SwitchServer

TOKEN = "switch-test-token"


class SwitchProc:
    """``ringtree switch`` as a child process; ``address`` once it listens."""

    def __init__(self, *args: str, token: str = TOKEN):
        cmd = [sys.executable, "-m", "ringtree.cli", "switch", "--listen", "127.0.0.1:0",
               "--token", token, *args]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        line = self.p.stdout.readline()  # type: ignore[union-attr]
        assert "listening on" in line, line
        self.address = line.split()[-1]

    def stop(self) -> str:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        out, _ = self.p.communicate(timeout=20)
        return out


@pytest.fixture
def switch():
    procs: list[SwitchProc] = []

    def start(*args: str, token: str = TOKEN) -> SwitchProc:
        procs.append(SwitchProc(*args, token=token))
        return procs[-1]

    yield start
    for p in procs:
        if p.p.poll() is None:
            p.p.kill()
        p.p.wait(timeout=10)


def run_members(address: str | list[str], n: int, fn, *, key: bytes = b"g", token=TOKEN,
                local: list[int] | None = None, window: int = 4, chunk: int = 4096,
                timeout: float = 30.0) -> list:
    """Run ``fn(link, group, member)`` on n member threads; results or exceptions."""
    out: list = [None] * n
    addrs = address if isinstance(address, list) else [address] * n

    def member(m: int) -> None:
        try:
            link = SwitchLink(addrs[m], token, timeout=timeout)
            try:
                mask = local[m] if local else (1 << n) - 1
                g = link.join(key, m, n, mask, window=window, chunk_bytes=chunk)
                out[m] = fn(link, g, m)
            finally:
                link.close()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[m] = e

    threads = [threading.Thread(target=member, args=(m,)) for m in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return out


def inputs(m: int, count: int, dtype: DType) -> np.ndarray:
    vals = (np.arange(count) * 7 + 3 * m) % 5 + m  # small, exact in every dtype
    if dtype is DType.BFLOAT16:
        import ml_dtypes
        return vals.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    return vals.astype(dtype.storage)


def expected(n: int, count: int, dtype: DType, op: ReduceOp) -> np.ndarray:
    vals = np.stack([(np.arange(count) * 7 + 3 * m) % 5 + m for m in range(n)])
    red = {ReduceOp.SUM: vals.sum(0), ReduceOp.MIN: vals.min(0), ReduceOp.MAX: vals.max(0)}[op]
    if dtype is DType.BFLOAT16:
        import ml_dtypes
        return red.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    return red.astype(dtype.storage)


def allreduce(dtype: DType, op: ReduceOp, count: int, calls: int = 1):
    def fn(link, g, m):
        x = inputs(m, count, dtype)
        before = x.copy()
        y = np.empty_like(x)
        for _ in range(calls):
            link.all_reduce(g, x, y, dtype, op)
        assert np.array_equal(x, before), "the switch client changed its send buffer"
        return y
    return fn


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX])
def test_every_op_and_dtype_is_exact(switch, op):
    sw = switch()
    pytest.importorskip("ml_dtypes")
    for dtype in DType:
        res = run_members(sw.address, 3, allreduce(dtype, op, 3001), key=dtype.value.encode())
        want = expected(3, 3001, dtype, op)
        for m, r in enumerate(res):
            assert not isinstance(r, BaseException), (dtype, m, r)
            assert np.array_equal(r, want), (dtype, op, m)


def test_in_place_and_many_calls_reuse_slots(switch):
    sw = switch("--slot-bytes", "4K")

    def fn(link, g, m):
        x = np.full(10_000, m + 1, np.int64)
        for k in range(20):  # 20 calls x 20 chunks through a 4-slot window
            link.all_reduce(g, x, x, DType.INT64, ReduceOp.SUM)
            assert int(x[0]) == 10 * 4 ** k, k
        return True
    assert run_members(sw.address, 4, fn) == [True] * 4


def test_drops_are_recovered_and_never_double_counted(switch):
    sw = switch("--drop", "0.1", "--seed", "7")
    res = run_members(sw.address, 4, allreduce(DType.INT32, ReduceOp.SUM, 50_000, calls=3))
    want = expected(4, 50_000, DType.INT32, ReduceOp.SUM)
    for r in res:
        assert not isinstance(r, BaseException), r
        assert np.array_equal(r, want)
    report = sw.stop()
    dropped = int(report.split("dropped=")[1].split(",")[0])
    retrans = int(report.split("retransmissions=")[1].split(",")[0])
    assert dropped > 0 and retrans > 0, report


def test_two_jobs_with_the_same_group_names_are_isolated(switch):
    sw = switch("--token", "other-job")
    results: dict[str, list] = {}

    def job(token: str, base: int) -> None:
        def fn(link, g, m):
            y = np.empty(5000, np.int64)
            link.all_reduce(g, np.full(5000, base + m, np.int64), y, DType.INT64, ReduceOp.SUM)
            return y
        results[token] = run_members(sw.address, 2, fn, token=token, key=b"same-name")

    a = threading.Thread(target=job, args=(TOKEN, 0))
    b = threading.Thread(target=job, args=("other-job", 100))
    a.start(), b.start(), a.join(), b.join()
    assert all(np.array_equal(r, np.full(5000, 1)) for r in results[TOKEN])
    assert all(np.array_equal(r, np.full(5000, 201)) for r in results["other-job"])


def test_a_wrong_token_is_refused(switch):
    sw = switch()
    res = run_members(sw.address, 2, allreduce(DType.INT32, ReduceOp.SUM, 10), token="guess",
                      timeout=10)
    for r in res:
        assert isinstance(r, SwitchError) and "refused" in str(r), r
    assert "refused_clients=2" in sw.stop()


def test_unsupported_op_and_dtype_limits_are_named():
    srv = SwitchServer("127.0.0.1", 0, [TOKEN])
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        def fn(link, g, m):
            with pytest.raises(ValueError, match="SUM, MIN and MAX only, not PROD"):
                g.post(np.ones(4, np.float32), np.ones(4, np.float32), DType.FLOAT32,
                       ReduceOp.PROD)
            return True
        assert run_members(srv.address, 2, fn) == [True, True]
        with pytest.raises(SwitchError, match="2..32 members"):
            link = SwitchLink(srv.address, TOKEN, timeout=5)
            link.join(b"big", 0, 33, 1)
    finally:
        srv.stop()
        t.join(5)
        srv.close()


def test_members_disagreeing_on_the_call_all_get_the_error(switch):
    sw = switch()

    def fn(link, g, m):
        x = np.ones(100 + m, np.float32)  # member 1 sends one more element
        link.all_reduce(g, x, x.copy(), DType.FLOAT32, ReduceOp.SUM)
    res = run_members(sw.address, 2, fn, timeout=10)
    for r in res:
        assert isinstance(r, SwitchError) and "elements: member 0 has 100, member 1 has 101" \
            in str(r), r


def test_a_killed_switch_is_named_by_every_member(switch):
    sw = switch()

    def fn(link, g, m):
        x = np.ones(1 << 16, np.float32)
        link.all_reduce(g, x, x, DType.FLOAT32, ReduceOp.SUM)  # formed and working
        if m == 0:
            os.kill(sw.p.pid, signal.SIGKILL)
        time.sleep(0.3)
        link.all_reduce(g, x, x, DType.FLOAT32, ReduceOp.SUM)
    res = run_members(sw.address, 3, fn, timeout=15)
    for r in res:
        assert isinstance(r, SwitchError) and sw.address in str(r), r


def test_garbage_on_the_port_leaves_the_switch_serving(switch):
    sw = switch()
    host, port = sw.address.rsplit(":", 1)
    for junk in (b"\x00" * 5000, os.urandom(64), b"GET / HTTP/1.0\r\n\r\n", b""):
        s = socket.create_connection((host, int(port)))
        s.sendall(junk)
        s.close()
    # authenticated, then a frame claiming 4 GiB, then a truncated frame
    for body in (b"\x03\xff\xff\xff\xff", b"\x01\x00\x00\x00\x30abc"):
        link = SwitchLink(sw.address, TOKEN, timeout=5)
        link.sock.setblocking(True)
        link.sock.sendall(body)
        link.sock.close()
    res = run_members(sw.address, 2, allreduce(DType.INT32, ReduceOp.MAX, 999))
    want = expected(2, 999, DType.INT32, ReduceOp.MAX)
    assert all(np.array_equal(r, want) for r in res), res
    report = sw.stop()
    assert "protocol_errors=" in report and "refused_clients=" in report


def test_a_two_level_tree_gives_the_same_bits_as_one_switch(switch):
    spine = switch()
    leaves = [switch("--parent", spine.address) for _ in range(2)]
    n = 4
    fn = allreduce(DType.FLOAT32, ReduceOp.SUM, 20_000, calls=2)
    flat = run_members(spine.address, n, fn)
    # members 0, 1 under leaf 0; members 2, 3 under leaf 1
    addrs = [leaves[0].address] * 2 + [leaves[1].address] * 2
    local = [0b0011, 0b0011, 0b1100, 0b1100]
    tree = run_members(addrs, n, fn, local=local, key=b"tree")
    want = expected(n, 20_000, DType.FLOAT32, ReduceOp.SUM)
    for a, b in zip(flat, tree):
        assert not isinstance(b, BaseException), b
        assert np.array_equal(a, want) and np.array_equal(b, want)
        assert a.tobytes() == b.tobytes()
    assert "results=" in leaves[0].stop()


def test_out_of_slots_is_a_clear_error(switch):
    sw = switch("--slots", "4")
    res = run_members(sw.address, 2, allreduce(DType.INT32, ReduceOp.SUM, 10), window=8,
                      timeout=10)
    for r in res:
        assert isinstance(r, SwitchError) and "out of aggregation slots" in str(r), r


def test_the_collnet_transport_pairs_sends_and_receives_without_copies(switch):
    """The k-th send to a virtual rank pairs with the k-th receive from it, whichever is
    posted first; results land in the receive (also when it is posted mid-flight), a send
    completes only with its all-reduce, and an in-place pair gives the same bits."""
    from ringtree.transports.collnet import CollNetTransport

    sw = switch("--slot-bytes", "4K")
    hdr = bytearray(32)
    hdr[25], hdr[26] = list(DType).index(DType.INT32), list(ReduceOp).index(ReduceOp.SUM)
    count = 10_000  # 10 chunks of 4 KiB through a 4-chunk window

    def fn(link, g, m):
        t = CollNetTransport(link)
        t.add_group((9, 0, 0), g)

        def drive(*reqs, until=None):
            while not (until() if until else all(r.done for r in reqs)):
                t.poll()
                t.wait(0.01)
            for r in reqs:
                r.result()

        xs = [inputs(m, count, DType.INT32) + k for k in range(4)]
        keep = [x.copy() for x in xs]
        ys = [np.zeros(count, np.int32) for _ in range(3)]
        s0 = t.isend(9, 0, bytes(hdr), xs[0].view(np.uint8))   # receive posted mid-flight
        drive(until=lambda: any(t._active[0].op.got))
        assert not s0.done
        r0 = t.irecv(9, 0, bytes(hdr), ys[0].view(np.uint8))
        r1 = t.irecv(9, 0, bytes(hdr), ys[1].view(np.uint8))   # receive before its send
        s1 = t.isend(9, 0, bytes(hdr), xs[1].view(np.uint8))
        s2 = t.isend(9, 0, bytes(hdr), xs[2].view(np.uint8))   # receive after completion
        drive(s0, r0, s1, r1, s2)
        r2 = t.irecv(9, 0, bytes(hdr), ys[2].view(np.uint8))
        assert r2.done
        s3 = t.isend(9, 0, bytes(hdr), xs[3].view(np.uint8))   # in place
        drive(s3)
        r3 = t.irecv(9, 0, bytes(hdr), xs[3].view(np.uint8))
        drive(r3)
        assert all(np.array_equal(a, b) for a, b in zip(xs[:3], keep[:3]))
        return [y.tobytes() for y in ys] + [xs[3].tobytes()]

    res = run_members(sw.address, 3, fn)
    base = expected(3, count, DType.INT32, ReduceOp.SUM)
    for r in res:
        assert not isinstance(r, BaseException), r
        assert r == [(base + 3 * k).astype(np.int32).tobytes() for k in range(4)]


def _counter(report: str, name: str) -> int:
    return int(report.split(f" {name}=")[1].split(",")[0])


def test_a_late_member_costs_no_retransmission(switch):
    """Nothing is resent on a timer: members that wait for a late one only probe."""
    sw = switch("--slot-bytes", "4K")

    def fn(link, g, m):
        if m == 2:
            time.sleep(0.5)
        return allreduce(DType.INT32, ReduceOp.SUM, 20_000)(link, g, m)
    res = run_members(sw.address, 3, fn)
    want = expected(3, 20_000, DType.INT32, ReduceOp.SUM)
    assert all(np.array_equal(r, want) for r in res), res
    report = sw.stop()
    assert _counter(report, "retransmissions") == 0 and _counter(report, "duplicates") == 0
    assert _counter(report, "probes") > 0, report


def test_drops_between_switches_are_recovered(switch):
    spine = switch("--drop", "0.2", "--seed", "3")
    leaves = [switch("--parent", spine.address) for _ in range(2)]
    addrs = [leaves[0].address] * 2 + [leaves[1].address] * 2
    local = [0b0011, 0b0011, 0b1100, 0b1100]
    res = run_members(addrs, 4, allreduce(DType.INT64, ReduceOp.SUM, 30_000, calls=2),
                      local=local)
    want = expected(4, 30_000, DType.INT64, ReduceOp.SUM)
    for r in res:
        assert not isinstance(r, BaseException), r
        assert np.array_equal(r, want)
    assert _counter(spine.stop(), "dropped") > 0
    resent = sum(_counter(sw.stop(), "uplink_retransmissions") for sw in leaves)
    assert resent > 0


def test_multicast_and_owner_only_results(switch):
    """One contributor and everyone receiving is a multicast (broadcast, all-gather);
    everyone contributing and one receiving is a reduce-scatter block; the others check
    in or get DONEs, and the bits are the same through a two-level tree."""
    spine = switch("--drop", "0.05", "--seed", "5")
    leaves = [switch("--parent", spine.address) for _ in range(2)]
    n, count = 4, 9_000

    def fn(link, g, m):
        out = []
        for root in range(n):  # a broadcast from each member in turn
            x = inputs(m, count, DType.FLOAT32) if m == root else np.zeros(count, np.float32)
            y = np.full(count, -1, np.float32)
            o = g.post(x, y, DType.FLOAT32, ReduceOp.SUM, contribute=m == root,
                       want=m != root)
            while not o.done:
                link.poll()
                link.wait(0.01)
            o.result()
            out.append(y.tobytes() if m != root else None)
        x = inputs(m, count, DType.INT64)
        for owner in range(n):  # a reduce-scatter's blocks, each to its owner
            y = np.full(count, -1, np.int64)
            o = g.post(x, y, DType.INT64, ReduceOp.MAX, want=m == owner)
            while not o.done:
                link.poll()
                link.wait(0.01)
            o.result()
            out.append(y.tobytes())
        return out

    addrs = [leaves[0].address] * 2 + [leaves[1].address] * 2
    for kw in ({}, {"local": [0b0011, 0b0011, 0b1100, 0b1100]}):
        res = run_members(addrs if kw else spine.address, n, fn, key=b"tree" if kw else b"flat", **kw)
        for m, r in enumerate(res):
            assert not isinstance(r, BaseException), r
            for root in range(n):
                want = None if m == root else inputs(root, count, DType.FLOAT32).tobytes()
                assert r[root] == want, (m, root)
            for owner in range(n):
                want = expected(n, count, DType.INT64, ReduceOp.MAX).tobytes() \
                    if m == owner else np.full(count, -1, np.int64).tobytes()
                assert r[n + owner] == want, (m, owner)
