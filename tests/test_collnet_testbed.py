"""CollNet for real: ranks on namespace hosts, the switch on a host of its own.

Every supported op and dtype through ``collnet_direct`` and ``collnet_chain`` (intra-host
over shared memory, inter-host through the switch), bitwise against NumPy; what the switch
cannot do; a dropped chunk; a switch that dies mid-collective.
"""

from __future__ import annotations

import signal
import sys
import time

import numpy as np
import pytest

from ringtree.testbed import available

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

TOKEN = "collnet-testbed-token"
PORT = 7300


@pytest.fixture(scope="module")
def bed():
    from ringtree.testbed import Testbed

    with Testbed(2, rate="1gbit", name="rtcn") as tb:
        sw_host = tb.add_host(rate=None, name="rtcn-sw")
        yield tb, sw_host


def _start_switch(tb, host, *args: str):
    addr = f"{host.addr}:{PORT}"
    cmd = [sys.executable, "-m", "ringtree.cli", "switch", "--listen", addr,
           "--token", TOKEN, *args]
    import subprocess

    p = host.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = p.stdout.readline()
    assert "listening on" in line, line
    return p, addr


def _stop(p) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    return out


def _pool(tb, addr, layout=(2, 2, 0), timeout=60.0, call_timeout=20):
    from ringtree.testbed.pool import HostPool

    env = {"RINGTREE_COLLNET_ENABLE": "1", "RINGTREE_COLLNET_SWITCH": addr,
           "RINGTREE_TIMEOUT": str(call_timeout)}
    return HostPool(tb, list(layout), env=env, timeout=timeout, token=TOKEN)


def _through_switch(bed, fn, *args, switch_args: tuple[str, ...] = (), **pool_kw):
    """Start a switch on the bed's switch host, run ``fn`` on every rank of a job using it,
    stop the switch: (each rank's result, the switch's exit report)."""
    tb, sw_host = bed
    p, addr = _start_switch(tb, sw_host, *switch_args)
    try:
        with _pool(tb, addr, **pool_kw) as pool:
            res = pool.run(fn, *args)
    finally:
        report = _stop(p)
    return res, report


def _every_op_and_dtype(comm):
    import ml_dtypes

    from ringtree.dtypes import DType

    n, r = comm.size, comm.rank
    count = 5000
    bad = []
    for algo in ("collnet_direct", "collnet_chain"):
        for dtype in DType:
            for op in ("sum", "min", "max"):
                vals = (np.arange(count) * 7 + 3 * r) % 5 + r
                allv = np.stack([(np.arange(count) * 7 + 3 * q) % 5 + q for q in range(n)])
                red = {"sum": allv.sum(0), "min": allv.min(0), "max": allv.max(0)}[op]
                if dtype is DType.BFLOAT16:
                    x = vals.astype(np.float32).astype(ml_dtypes.bfloat16)
                    want = red.astype(np.float32).astype(ml_dtypes.bfloat16)
                else:
                    x, want = vals.astype(dtype.storage), red.astype(dtype.storage)
                y = np.empty_like(x)
                comm.all_reduce(x, op=op, out=y, algo=algo)
                if y.tobytes() != want.tobytes():
                    bad.append((algo, dtype.value, op))
                comm.all_reduce(x, op=op, algo=algo)  # in place
                if x.tobytes() != want.tobytes():
                    bad.append((algo, dtype.value, op, "in place"))
    return bad


def test_every_op_and_dtype_through_the_switch(bed):
    res, report = _through_switch(bed, _every_op_and_dtype)
    for r in res:
        assert r == [], r
    assert "results=" in report and "groups=" in report


def _limits(comm):
    x = (np.arange(1000) + comm.rank) % 3 + 1.0  # products stay exact in float32
    x = x.astype(np.float32)
    out = {}
    try:
        comm.all_reduce(x.copy(), op="prod", algo="collnet_direct")
        out["explicit"] = "no error"
    except ValueError as e:
        out["explicit"] = str(e)
    y = x.copy()
    comm.all_reduce(y, op="prod")  # the tuner may pick CollNet only where it can run
    want = np.prod(np.stack([(np.arange(1000) + q) % 3 + 1.0 for q in range(comm.size)]),
                   axis=0).astype(np.float32)
    out["fallback_ok"] = bool(np.array_equal(y, want))
    return out


def test_what_the_switch_cannot_do_is_named_or_falls_back(bed):
    res, _ = _through_switch(bed, _limits)
    for r in res:
        assert "SUM, MIN and MAX only" in r["explicit"], r
        assert r["fallback_ok"], r


def _sum_int(comm, calls):
    x = np.full(300_000, comm.rank + 1, np.int32)
    y = np.empty_like(x)
    for _ in range(calls):
        comm.all_reduce(x, out=y, algo="collnet_direct")
        if not np.all(y == comm.size * (comm.size + 1) // 2):
            return "wrong"
    return "ok"


def test_dropped_chunks_are_recovered_exactly(bed):
    res, report = _through_switch(bed, _sum_int, 3,
                                  switch_args=("--drop", "0.05", "--seed", "3"))
    assert res == ["ok"] * 4, res
    assert "dropped=0," not in report, report


def _until_it_fails(comm):
    x = np.ones(1 << 18, np.float32)
    t0 = time.monotonic()
    try:
        for _ in range(10_000):
            comm.all_reduce(x, algo="collnet_direct")
            x[:] = 1
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return type(e).__name__, str(e), time.monotonic() - t0
    return "none", "", 0.0


def test_a_killed_switch_is_named_by_every_rank(bed):
    tb, sw_host = bed
    p, addr = _start_switch(tb, sw_host)
    try:
        with _pool(tb, addr, timeout=90) as pool:
            import threading

            killer = threading.Timer(3.0, p.kill)
            killer.start()
            res = pool.run(_until_it_fails)
            killer.cancel()
    finally:
        _stop(p)
    for r in res:
        assert not isinstance(r, BaseException), r
        name, msg, _ = r
        assert name != "none", r
        assert addr in msg or addr.split(":")[0] in msg or "switch" in msg, r


def test_a_frozen_switch_times_out_naming_its_address(bed):
    """A switch that stops answering (its connections stay open) is a timeout within
    RINGTREE_TIMEOUT whose message names the switch, not an anonymous rank."""
    import threading

    tb, sw_host = bed
    p, addr = _start_switch(tb, sw_host)
    freezer = threading.Timer(2.0, p.send_signal, (signal.SIGSTOP,))
    try:
        with _pool(tb, addr, layout=(1, 1, 0), timeout=90, call_timeout=4) as pool:
            freezer.start()
            res = pool.run(_until_it_fails)
    finally:
        freezer.cancel()
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
        _stop(p)
    for r in res:
        assert not isinstance(r, BaseException), r
        name, msg, took = r
        assert name in ("CollectiveTimeout", "CommAborted"), r
        assert f"the switch at {addr}" in msg, r


def _multicast_and_reduce_scatter(comm):
    """broadcast (every root), all_gather and reduce_scatter through the switch, out of
    place and in place, bitwise against NumPy; the input is never changed."""
    n, r = comm.size, comm.rank
    count, bad = 3000, []

    def vals(q, dt):
        return ((np.arange(count) * 5 + 2 * q) % 7 + q).astype(dt)

    for dt in (np.float32, np.int64, np.uint8):
        for root in range(n):
            x = vals(r, dt)
            comm.broadcast(x, root=root, algo="collnet_direct")
            if x.tobytes() != vals(root, dt).tobytes():
                bad.append(("broadcast", dt.__name__, root))
        x = vals(r, dt)
        keep = x.copy()
        y = comm.all_gather(x, algo="collnet_direct")
        want = np.stack([vals(q, dt) for q in range(n)])
        if y.tobytes() != want.tobytes() or x.tobytes() != keep.tobytes():
            bad.append(("all_gather", dt.__name__))
        full = np.concatenate([vals(r + b, dt) for b in range(n)])
        for op, red in (("sum", np.sum), ("max", np.max)):
            z = comm.reduce_scatter(full.copy(), op=op, algo="collnet_direct")
            allin = np.stack([np.concatenate([vals(q + b, dt) for b in range(n)])
                              for q in range(n)])
            want = red(allin, axis=0).astype(dt)[r * count:(r + 1) * count]
            if z.tobytes() != want.tobytes():
                bad.append(("reduce_scatter", dt.__name__, op))
    return bad


@pytest.mark.parametrize("layout", [(1, 1, 0), (2, 2, 0)])
def test_multicast_and_reduce_scatter_through_the_switch(bed, layout):
    res, report = _through_switch(bed, _multicast_and_reduce_scatter, layout=layout,
                                  switch_args=("--drop", "0.02", "--seed", "4"))
    for r in res:
        assert r == [], r
    assert "results=0," not in report, report
