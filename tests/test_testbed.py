"""The namespace testbed itself, and every collective bitwise across its hosts.

Hosts are real network/UTS/mount namespaces joined by shaped veth links (see
``ringtree.testbed``): ranks on one host share memory, ranks on different hosts talk TCP
through the bridge. 2×2 and 3×1 jobs run every collective with the default choice and
with each algorithm, bitwise against NumPy. Skipped without root / ``ip`` / ``tc``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from collective_cases import sizes_for
from test_collectives import movement_cases, reduction_cases

from ringtree.schedules import algorithms
from ringtree.testbed import Testbed as _Testbed
from ringtree.testbed import available
from ringtree.testbed.pool import HostPool

ok, why = available()
pytestmark = pytest.mark.skipif(not ok, reason=why or "testbed unavailable")

REDUCTIONS = ["all_reduce", "reduce_scatter", "reduce"]
MOVEMENTS = ["all_gather", "broadcast", "gather", "scatter", "all_to_all", "send_recv",
             "barrier"]


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(os.path.exists(f"/proc/{q}") for q in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(os.path.exists(f"/proc/{q}") for q in pids)


@pytest.fixture(scope="module")
def testbed():
    """Three hosts; afterwards no keeper (so no namespace, veth or tmpfs) and no new link
    in the machine's own namespace. (The machine's /dev/shm is never written: each host
    mounts its own.)"""
    before = _links()
    with _Testbed(3, rate="1gbit") as tb:
        pids = [tb._bridge.pid] + [h.pid for h in tb.hosts]
        yield tb
    assert _gone(pids), "a namespace keeper survived the testbed"
    assert not _links() - before, "the testbed left links behind"


def test_hosts_have_their_own_name_network_and_shm(testbed):
    names = [h.run(["hostname"]).stdout.strip() for h in testbed.hosts]
    assert names == [h.name for h in testbed.hosts] and len(set(names)) == 3
    h0, h1 = testbed.hosts[:2]
    h0.run(["sh", "-c", "echo x > /dev/shm/rt-testbed-probe"])
    assert h0.run(["ls", "/dev/shm"]).stdout.split() == ["rt-testbed-probe"]
    assert h1.run(["ls", "/dev/shm"]).stdout.split() == []
    assert not os.path.exists("/dev/shm/rt-testbed-probe")
    h0.run(["rm", "/dev/shm/rt-testbed-probe"])
    addrs = h1.run(["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
    assert h1.addr in addrs
    assert "tbf" in h1.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout


def _echo_server(port: int) -> str:
    return ("import socket\n"
            f"s = socket.create_server(('0.0.0.0', {port}))\n"
            "c, _ = s.accept()\n"
            "c.sendall(socket.gethostname().encode())\n")


def test_hosts_reach_each_other_and_a_cut_link_is_silent(testbed):
    h0, h1 = testbed.hosts[:2]
    port = testbed.port()
    srv = h1.popen([sys.executable, "-c", _echo_server(port)])
    try:
        code = (f"import socket, time\nfor _ in range(100):\n    try:\n"
                f"        s = socket.create_connection(('{h1.addr}', {port}), timeout=2)\n"
                f"        break\n    except ConnectionRefusedError:\n"
                f"        time.sleep(0.05)\nprint(s.recv(100).decode())\n")
        assert h0.run([sys.executable, "-c", code]).stdout.strip() == h1.name
    finally:
        srv.kill()
        srv.wait()
    testbed.cut(1)
    try:
        probe = (f"import socket\ntry:\n    socket.create_connection(('{h1.addr}', 9), "
                 f"timeout=1)\nexcept OSError as e:\n    print(type(e).__name__)\n")
        out = h0.run([sys.executable, "-c", probe]).stdout.strip()
        assert out in ("TimeoutError", "timeout"), out
    finally:
        testbed.heal(1)


def test_nothing_outlives_a_killed_creator():
    code = ("import os, sys, time\n"
            "from ringtree.testbed import Testbed\n"
            "tb = Testbed(2, rate=None)\n"
            "tb.hosts[0].popen(['sleep', '60'])\n"
            "tb.hosts[1].run(['sh', '-c', 'echo x > /dev/shm/left'])\n"
            "print(' '.join(str(p) for p in [tb._bridge.pid] + [h.pid for h in tb.hosts]),"
            " flush=True)\n"
            "time.sleep(60)\n")
    before = _links()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 3
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    p.stdout.close()
    assert _gone(pids), "a keeper survived"
    assert not _links() - before
    assert not os.path.exists("/dev/shm/left")


def test_cli_runs_a_command_on_every_host():
    cp = subprocess.run([sys.executable, "-m", "ringtree.cli", "testbed", "--hosts", "2",
                         "--rate", "200mbit", "--", "sh", "-c",
                         "echo $RINGTREE_TESTBED_HOST/$RINGTREE_TESTBED_HOSTS $(hostname)"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    lines = sorted(cp.stdout.split("\n"))[1:]
    assert lines == ["[rt-h0] 0/2 rt-h0", "[rt-h1] 1/2 rt-h1"]


# ---- jobs ---------------------------------------------------------------------------


def where(comm):
    return socket.gethostname(), comm.nodes, sorted({t.name for t in comm.fabric.transports})


@pytest.fixture(scope="module", params=[[2, 2], [1, 1, 1]], ids=["2x2", "3x1"])
def pool(request, testbed):
    with HostPool(testbed, request.param, timeout=180) as p:
        yield p


def test_ranks_land_on_their_hosts(pool):
    per = [pool.rank_hosts.count(h) for h in range(3)]
    got = pool.run_ok(where)
    for r, (name, nodes, kinds) in enumerate(got):
        assert name == pool.testbed.hosts[pool.rank_hosts[r]].name
        assert list(nodes) == pool.rank_hosts
        assert kinds == (["shm", "tcp"] if per[pool.rank_hosts[r]] > 1 else ["tcp"])


def _algos(coll: str) -> list[str | None]:
    if coll == "send_recv":
        return [None]
    return [None] + [a for a in algorithms(coll) if not a.startswith(("collnet", "nvls"))]


def _clean(results):
    for r, fails in enumerate(results):
        assert not isinstance(fails, BaseException), f"rank {r}: {fails!r}"
        assert not fails, f"rank {r}: " + "\n".join(fails[:10])


@pytest.mark.parametrize("coll", REDUCTIONS)
def test_reductions_bitwise(pool, coll):
    sizes = sizes_for(pool.nranks)[1:]
    for algo in _algos(coll):
        _clean(pool.run(reduction_cases, coll, ["float32", "bfloat16", "int64"], sizes, algo))


@pytest.mark.parametrize("coll", MOVEMENTS)
def test_movements_bitwise(pool, coll):
    sizes = sizes_for(pool.nranks)
    for algo in _algos(coll):
        _clean(pool.run(movement_cases, coll, ["int8", "float64"], sizes, algo))


def striped(comm):
    """Big messages split over 4 sockets per peer: bitwise results, and the sockets."""
    from collective_cases import make_input, reference_reduce, same_bits

    from ringtree.dtypes import DType

    n = (3 << 20) // 4 + 5  # > 256 KiB per message in every algorithm, odd
    want = reference_reduce([make_input(q, n, DType.FLOAT32, "sum") for q in range(comm.size)],
                            DType.FLOAT32, "sum")
    ok = []
    for algo in ("ring", "hierarchical", "rabenseifner"):
        x = make_input(comm.rank, n, DType.FLOAT32, "sum")
        comm.all_reduce(x, algo=algo)
        ok.append(same_bits(x, want))
    got = comm.all_gather(make_input(comm.rank, n, DType.INT8, "move"))
    ok.append(all(same_bits(got[q], make_input(q, n, DType.INT8, "move"))
                  for q in range(comm.size)))
    tcp = next(t for t in comm.fabric.transports if t.name == "tcp")
    stripes = {key[1] >> 24 for key in tcp.conns}
    return ok, sorted(stripes)


@pytest.mark.parametrize("env", [{"RINGTREE_NSOCKS_PERTHREAD": 4},
                                 {"RINGTREE_NSOCKS_PERTHREAD": 2, "RINGTREE_SOCKET_NTHREADS": 2}],
                         ids=["4-sockets", "2-threads-x-2"])
def test_several_sockets_per_peer(testbed, env):
    with HostPool(testbed, [2, 2], env=env, timeout=180) as p:
        for r, (ok, stripes) in enumerate(p.run_ok(striped)):
            assert all(ok), f"rank {r}: {ok}"
            assert stripes == [0, 1, 2, 3], f"rank {r}: sockets {stripes}"


def _serve_name(port: int) -> None:
    s = socket.create_server(("0.0.0.0", port))
    while True:
        c, _ = s.accept()
        c.sendall(socket.gethostname().encode())
        c.close()


def test_an_extra_unshaped_host_runs_a_non_rank_process():
    with _Testbed(1, rate="200mbit") as tb:
        extra = tb.add_host(rate=None, name="rt-switch")
        port = tb.port()
        extra.spawn(_serve_name, port)
        probe = (f"import socket, time\nfor _ in range(200):\n    try:\n"
                 f"        s = socket.create_connection(('{extra.addr}', {port}), timeout=2)\n"
                 f"        break\n    except ConnectionRefusedError:\n"
                 f"        time.sleep(0.05)\nprint(s.recv(100).decode())\n")
        assert tb.hosts[0].run([sys.executable, "-c", probe]).stdout.strip() == "rt-switch"
        assert "tbf" not in extra.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout


def test_cpu_shares_are_disjoint_blocks_or_one_cpu_each_in_turn():
    from ringtree.testbed.netns import cpu_shares

    assert cpu_shares([0, 1], 2) == [{0}, {1}]
    assert cpu_shares([0, 1, 2, 3, 4], 2) == [{0, 1, 2}, {3, 4}]
    assert cpu_shares([4, 5, 6, 7], 4) == [{4}, {5}, {6}, {7}]
    assert cpu_shares([0, 1], 3) == [{0}, {1}, {0}]     # fewer CPUs than hosts: in turn
    with pytest.raises(ValueError, match="no CPUs"):
        cpu_shares([], 2)


def _my_cpus(comm) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_each_hosts_processes_run_on_its_own_cpus(testbed):
    """A command run in a host, and a job's ranks, are bound to the host's share."""
    from ringtree.testbed.netns import cpu_shares

    shares = cpu_shares(os.sched_getaffinity(0), 3)
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    for h, share in zip(testbed.hosts, shares):
        assert h.cpus == share
        assert h.run(probe).stdout.strip() == str(sorted(share))
    with HostPool(testbed, [2, 1, 1], timeout=120) as p:
        got = p.run_ok(_my_cpus)
    assert got == [sorted(shares[h]) for h in p.rank_hosts]


def test_shared_cpus_leave_the_scheduler_free():
    with _Testbed(2, rate=None, cpus="shared") as tb:
        probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
        assert tb.hosts[0].cpus is None
        assert tb.hosts[1].run(probe).stdout.strip() == str(sorted(os.sched_getaffinity(0)))
    with pytest.raises(ValueError, match="'own' or 'shared'"):
        _Testbed(1, cpus="all")
