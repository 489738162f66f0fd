"""Network faults on the namespace testbed: a partition mid-collective, and a rank that
advertises an address nobody can reach.

- Partition: host 1's cable is pulled while 2×2 ranks all-reduce in a loop. Every rank
  — including those cut off from the store on host 0 — must raise within
  ``RINGTREE_TIMEOUT`` plus a few seconds, naming a rank on the other side.
- Unreachable interface: a rank on host 1 is told to use an interface that exists only
  on host 1; the job must fail within seconds, not at the collective timeout, with an
  error naming the host, the address, the interface and ``RINGTREE_SOCKET_IFNAME``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ringtree.testbed import Testbed as _Testbed
from ringtree.testbed import available
from ringtree.testbed.pool import HostPool, run_hosts

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=why or "testbed unavailable")

TIMEOUT = 6.0


def all_reduce_until_it_fails(comm, seconds: float):
    x = np.ones(1 << 18, np.float32)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            comm.all_reduce(x)
    except Exception as e:  # noqa: BLE001 - the error is the result
        return time.time(), type(e).__name__, str(e)
    return time.time(), None, "finished"


def test_partition_every_rank_raises_naming_a_lost_peer():
    with _Testbed(2, rate="1gbit") as tb, \
            HostPool(tb, 2, env={"RINGTREE_TIMEOUT": TIMEOUT}, timeout=90) as pool:
        cut_at = []
        timer = threading.Timer(1.5, lambda: (tb.cut(1), cut_at.append(time.time())))
        timer.start()
        try:
            results = pool.run(all_reduce_until_it_fails, 60.0, timeout=60)
        finally:
            timer.cancel()
        assert cut_at, "the link was never cut"
        for r, res in enumerate(results):
            assert not isinstance(res, BaseException), f"rank {r}: {res!r}"
            when, kind, msg = res
            assert kind is not None, f"rank {r} never noticed the partition"
            took = when - cut_at[0]
            assert took < TIMEOUT + 8, f"rank {r} raised {took:.1f} s after the cut: {msg}"
            others = (2, 3) if pool.rank_hosts[r] == 0 else (0, 1)
            assert any(f"rank {q}" in msg for q in others), f"rank {r}: {kind}: {msg}"


def hello(comm):
    comm.barrier()
    return "ok"


@pytest.fixture(scope="module")
def split_net():
    """Two hosts; host 1 also has ib0 (10.78.0.2), which host 0 routes into a gateway that
    drops everything: connecting to it is met with silence, the case that hangs jobs."""
    with _Testbed(2, rate=None) as tb:
        tb.add_interface(1, "ib0", "10.78.0.2/24")
        tb.route_default()
        yield tb


def test_unreachable_interface_fails_fast_naming_host_address_and_interface(split_net):
    tb = split_net
    t0 = time.monotonic()
    results = run_hosts(tb, [1, 2], hello, env={"RINGTREE_TIMEOUT": 120},
                        host_env={1: {"RINGTREE_SOCKET_IFNAME": "ib0"}}, timeout=60)
    took = time.monotonic() - t0
    assert took < 40, f"the job took {took:.1f} s to fail (the timeout is 120 s)"
    for r, res in enumerate(results):
        assert isinstance(res, Exception), f"rank {r} did not fail: {res!r}"
        msg = str(res)
        for part in ("10.78.0.2", "ib0", tb.hosts[1].name, "RINGTREE_SOCKET_IFNAME"):
            assert part in msg, f"rank {r}: {part!r} not in {msg}"


def _launch(tb, extra: list[str], ifname_on_1: str | None) -> list[tuple[int, str]]:
    port, token = tb.port(), secrets.token_hex(8)
    procs = []
    for i, h in enumerate(tb.hosts):
        env = dict(os.environ, RINGTREE_TOKEN=token)
        env.pop("RINGTREE_SOCKET_IFNAME", None)
        if i == 1 and ifname_on_1:
            env["RINGTREE_SOCKET_IFNAME"] = ifname_on_1
        cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "1", "--nnodes", "2",
               "--node-rank", str(i), "--master", f"{tb.hosts[0].addr}:{port}", *extra]
        procs.append(h.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True))
    outs = [p.communicate(timeout=60)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def test_doctor_net_prints_the_matrix(split_net):
    ok_run = _launch(split_net, ["ringtree", "doctor", "--net"], None)
    assert [rc for rc, _ in ok_run] == [0, 0], ok_run
    table = ok_run[0][1]
    assert "rt-h1 ib0 10.78.0.2" in table and "10.78.0.2*" not in table, table
    assert "rt-h1 eth0 10.77.0.2*" in table, table
    assert "no answer within" in table  # ib0 is listed, and does not answer
    assert "every advertised address answers" in table
    bad = _launch(split_net, ["ringtree", "doctor", "--net"], "ib0")
    assert [rc for rc, _ in bad] == [1, 1], bad
    assert "rt-h1 ib0 10.78.0.2*" in bad[0][1] and "network check failed" in bad[0][1]


def test_run_check_net_stops_before_starting_ranks(split_net):
    marker = "rank-started"
    res = _launch(split_net, ["--check-net", "echo", marker], "ib0")
    assert [rc for rc, _ in res] == [1, 1], res
    for _, out in res:
        assert marker not in out
        assert "ib0" in out and "10.78.0.2" in out and "RINGTREE_SOCKET_IFNAME" in out
    good = _launch(split_net, ["--check-net", "echo", marker], None)
    assert [rc for rc, _ in good] == [0, 0], good
    assert all(marker in out for _, out in good)
