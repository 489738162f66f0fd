"""Tests of the ``ringtree run`` launcher (ringtree.bootstrap.launch), run as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ringtree.testing import free_port

REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for k in [k for k in env if k.startswith("RINGTREE_")]:
        del env[k]
    env.update(extra)
    return env


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ringtree.cli", "run", *args]


def run(*args: str, timeout: float = 60, env: dict[str, str] | None = None):
    t0 = time.monotonic()
    proc = subprocess.run(launcher_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=env or child_env(), cwd=REPO)
    return proc, time.monotonic() - t0


def py(code: str) -> list[str]:
    return ["--", sys.executable, "-c", textwrap.dedent(code)]


PRINT_ENV = """
    import json, os
    from ringtree.bootstrap.job import detect
    e = detect()
    keys = ["RINGTREE_RANK", "RINGTREE_WORLD_SIZE", "RINGTREE_LOCAL_RANK",
            "RINGTREE_LOCAL_WORLD_SIZE", "RINGTREE_NODE_RANK", "RINGTREE_MASTER_ADDR",
            "RINGTREE_MASTER_PORT", "RINGTREE_TOKEN", "RINGTREE_STORE_EXTERNAL", "RANK",
            "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT"]
    out = {k: os.environ.get(k) for k in keys}
    out["detected"] = [e.source, e.rank, e.world_size, e.local_rank, e.store_external]
    os.write(1, ("ENV " + json.dumps(out) + "\\n").encode())  # one atomic write per line
"""

STORE_BARRIER = """
    import os
    from ringtree.bootstrap.job import detect
    from ringtree.bootstrap.store import StoreClient
    e = detect()
    with StoreClient(e.master_addr, e.master_port, e.token, connect_timeout=30) as s:
        s.add("arrived")
        s.set(f"host/{e.rank}", os.environ["RINGTREE_NODE_RANK"].encode())
        s.wait([f"host/{r}" for r in range(e.world_size)], timeout=30)
        os.write(1, f"RANK {e.rank} SAW {s.get('arrived').decode()}\\n".encode())
"""


def env_lines(stdout: str) -> list[dict]:
    return [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ENV ")]


def test_three_ranks_get_a_consistent_environment():
    proc, _ = run("-n", "3", *py(PRINT_ENV))
    assert proc.returncode == 0, proc.stderr
    envs = sorted(env_lines(proc.stdout), key=lambda e: int(e["RINGTREE_RANK"]))
    assert [e["RINGTREE_RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert len({e["RINGTREE_TOKEN"] for e in envs}) == 1
    assert len(envs[0]["RINGTREE_TOKEN"]) >= 32
    for e in envs:
        assert e["RINGTREE_WORLD_SIZE"] == e["WORLD_SIZE"] == "3"
        assert e["RINGTREE_LOCAL_WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3"
        assert e["RINGTREE_NODE_RANK"] == e["GROUP_RANK"] == "0"
        assert e["RINGTREE_MASTER_ADDR"] == e["MASTER_ADDR"] == "127.0.0.1"
        assert e["RINGTREE_STORE_EXTERNAL"] == "1"
        # torch's TCPStore gets its own port, distinct from the ringtree store's
        assert e["MASTER_PORT"] != e["RINGTREE_MASTER_PORT"]
        assert e["detected"][0] == "ringtree" and e["detected"][2] == 3 and e["detected"][4]
    assert len({(e["RINGTREE_MASTER_PORT"], e["MASTER_PORT"]) for e in envs}) == 1


def test_ranks_rendezvous_through_the_launchers_store():
    proc, _ = run("-n", "4", *py(STORE_BARRIER))
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert lines == [f"RANK {r} SAW 4" for r in range(4)]


def test_token_from_environment_is_used():
    proc, _ = run("-n", "2", *py(PRINT_ENV), env=child_env(RINGTREE_TOKEN="my-job-token"))
    assert proc.returncode == 0, proc.stderr
    assert {e["RINGTREE_TOKEN"] for e in env_lines(proc.stdout)} == {"my-job-token"}


def test_failing_rank_stops_the_job():
    proc, elapsed = run("-n", "3", *py("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(7)
        time.sleep(30)
    """))
    assert proc.returncode == 7
    assert elapsed < 15
    summary = [line for line in proc.stderr.splitlines() if line.startswith("ringtree run:")]
    assert len(summary) == 1, proc.stderr
    assert "rank 1 (pid " in summary[0]
    assert "exited with code 7" in summary[0]
    assert "stopped the other 2 ranks" in summary[0]


def test_rank_killed_by_signal_reports_128_plus_signal():
    proc, elapsed = run("-n", "2", *py("""
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    """))
    assert proc.returncode == 128 + signal.SIGKILL
    assert elapsed < 15
    assert "rank 0" in proc.stderr and "killed by signal 9 (SIGKILL)" in proc.stderr


def test_rank_ignoring_sigterm_is_killed_after_the_grace_period():
    proc, elapsed = run("-n", "2", "--grace", "0.5", *py("""
        import signal, sys, time
        from ringtree.bootstrap.job import detect
        from ringtree.bootstrap.store import StoreClient
        e = detect()
        s = StoreClient(e.master_addr, e.master_port, e.token)
        if e.rank == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            s.set("ignoring", b"1")
            time.sleep(30)
        s.get("ignoring", timeout=30)
        sys.exit(3)
    """))
    assert proc.returncode == 3, proc.stderr
    assert elapsed < 15
    assert "rank 0" in proc.stderr and "exited with code 3" in proc.stderr


def test_tag_output_prefixes_lines():
    proc, _ = run("-n", "3", "--tag-output", *py("""
        import os, sys
        r = os.environ["RANK"]
        print(f"out-a {r}")
        print(f"out-b {r}")
        print(f"err {r}", file=sys.stderr)
        sys.stdout.write(f"partial {r}")  # no trailing newline
    """))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert len(out) == 9
    for line in out:
        rank = line[1]
        assert line.startswith(f"[{rank}] ") and line.endswith(f" {rank}"), line
    assert sorted(out) == sorted(f"[{r}] {w} {r}" for r in range(3)
                                 for w in ("out-a", "out-b", "partial"))
    assert sorted(proc.stderr.splitlines()) == [f"[{r}] err {r}" for r in range(3)]


def test_untagged_output_is_inherited():
    code = "import os; os.write(1, f'hi {os.environ[\"RANK\"]}\\n'.encode())"
    proc, _ = run("-n", "2", *py(code))
    assert sorted(proc.stdout.splitlines()) == ["hi 0", "hi 1"]


def test_timeout_names_the_ranks_still_running():
    proc, elapsed = run("-n", "3", "--timeout", "1", *py("""
        import os, time
        if os.environ["RANK"] != "1":
            time.sleep(30)
    """))
    assert proc.returncode == 124
    assert elapsed < 15
    assert "timed out after 1s" in proc.stderr
    assert "0, 2" in proc.stderr and "1," not in proc.stderr.split("running:")[-1]


SIGNAL_CHILD = """
    import os, signal, sys, time
    got = []
    signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    os.write(1, f"READY {os.environ['RANK']}\\n".encode())
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # a duplicate delivery would arrive in this window
    os.write(1, f"GOT {os.environ['RANK']} {got}\\n".encode())
"""


def start_and_wait_ready(n: int, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(launcher_cmd("-n", str(n), *extra, *py(SIGNAL_CHILD)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(), cwd=REPO, start_new_session=True)
    ready: list[str] = []
    while len(ready) < n:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        if line.startswith("READY"):
            ready.append(line)
    return proc, ready


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_is_forwarded_once(sig):
    proc, _ = start_and_wait_ready(3)
    # Ctrl-C in a terminal signals the whole foreground process group: the launcher's group.
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    got = sorted(line for line in out.splitlines() if line.startswith("GOT"))
    assert got == [f"GOT {r} [{int(sig)}]" for r in range(3)]  # each rank exactly once
    assert signal.Signals(sig).name in err


def test_second_signal_kills():
    proc = subprocess.Popen(launcher_cmd("-n", "2", *py("""
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.write(1, b"READY\\n")
        time.sleep(30)
    """)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=REPO,
        start_new_session=True)
    for _ in range(2):
        assert proc.stdout.readline().startswith("READY")
    proc.send_signal(signal.SIGINT)
    assert "forwarded" in proc.stderr.readline()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - t0 < 15


def test_two_nodes_on_one_machine():
    port = free_port()
    env = child_env(RINGTREE_TOKEN="shared-multi-node-token")
    procs = [
        subprocess.Popen(
            launcher_cmd("--nnodes", "2", "--node-rank", str(node), "--master",
                         f"127.0.0.1:{port}", "--nproc-per-node", "2", "--timeout", "60",
                         *py(STORE_BARRIER + PRINT_ENV)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        for node in (1, 0)  # node 1 first: its ranks must wait for node 0's store
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    stdout = "".join(out for out, _ in outs)
    assert sorted(line for line in stdout.splitlines() if line.startswith("RANK")) == [
        f"RANK {r} SAW 4" for r in range(4)]
    envs = {int(e["RANK"]): e for e in env_lines(stdout)}
    assert sorted(envs) == [0, 1, 2, 3]
    for r, e in envs.items():
        assert e["GROUP_RANK"] == e["RINGTREE_NODE_RANK"] == str(r // 2)
        assert e["LOCAL_RANK"] == str(r % 2)
        assert e["WORLD_SIZE"] == "4"
        assert e["RINGTREE_MASTER_PORT"] == str(port)
        assert e["MASTER_PORT"] == str(port + 1)


def test_multi_node_requires_a_token_and_master():
    proc, _ = run("--nnodes", "2", "--node-rank", "0", "--master", "127.0.0.1:1", "-n", "1",
                  "--", "true")
    assert proc.returncode == 2 and "RINGTREE_TOKEN" in proc.stderr
    proc, _ = run("--nnodes", "2", "-n", "1", "--", "true", env=child_env(RINGTREE_TOKEN="t"))
    assert proc.returncode == 2 and "--master" in proc.stderr


@pytest.mark.parametrize("args,message", [
    ((), "no command"),
    (("-n", "0", "true"), "-n must be >= 1"),
    (("-n", "2", "--nnodes", "2", "--node-rank", "2", "--master", "h:1", "true"), "--node-rank"),
    (("-n", "1", "--master", "nohost", "true"), "HOST:PORT"),
    (("-n", "1", "--timeout", "-1", "true"), "--timeout"),
])
def test_usage_errors(args, message):
    proc, _ = run(*(("-n", "1") if not args else args))
    assert proc.returncode == 2
    assert message in proc.stderr


def test_missing_program():
    proc, _ = run("-n", "2", "--", "/nonexistent/program")
    assert proc.returncode == 127
    assert "cannot start" in proc.stderr


def test_command_may_contain_double_dash():
    proc, _ = run("-n", "1", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--", "x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['--', 'x']"


def test_main_in_process_restores_signal_handlers():
    from ringtree.bootstrap.launch import main

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    assert main(["-n", "2", "--", sys.executable, "-c", "pass"]) == 0
    assert main(["-n", "1", "--", sys.executable, "-c", "raise SystemExit(5)"]) == 5
    after = {s: signal.getsignal(s) for s in before}
    assert after == before


USR1_SCRIPT = """
import os, time, ringtree
comm = ringtree.init()
comm.barrier()
os.write(1, b"READY\\n")
path = os.path.join(os.environ["RINGTREE_FR_DUMP_DIR"], f"fr_rank{comm.rank}.json")
deadline = time.time() + 30
while time.time() < deadline and not os.path.exists(path):
    time.sleep(0.05)
comm.close()
"""


def test_sigusr1_is_forwarded_so_every_rank_dumps_its_flight_recorder(tmp_path):
    env = dict(os.environ, RINGTREE_FR_DUMP_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "ringtree.cli", "run", "-n", "2", "--",
                             sys.executable, "-c", USR1_SCRIPT], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = 0
    while ready < 2:
        line = proc.stdout.readline()
        assert line, "ranks exited before becoming ready"
        ready += line.strip() == b"READY"
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr_rank0.json", "fr_rank1.json"]


def test_free_port_span_leaves_the_neighbours_free():
    import socket

    port = free_port(span=3)
    held = []
    try:
        for k in range(3):  # every port of the span binds now
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port + k))
    finally:
        for s in held:
            s.close()
    with pytest.raises(ValueError, match="span"):
        free_port(span=0)
