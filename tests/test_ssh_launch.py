"""``ringtree run -H`` / ``--hostfile`` for real: an sshd (Debian's openssh-server) in
each testbed host, a key made by the test, and the launcher started from host 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from ringtree.bootstrap.ssh import parse_hostfile, parse_hosts
from ringtree.testbed import Testbed as _Testbed
from ringtree.testbed import available

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
PORT = 2222


def test_host_lists_in_mpirun_and_open_mpi_syntax(tmp_path):
    assert parse_hosts("a:2,b:2") == [("a", 2), ("b", 2)]
    assert parse_hosts("a,a,b") == [("a", 2), ("b", 1)]
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4 max_slots=8\nnode2:4\n\nnode3  # one slot\n")
    assert parse_hostfile(str(f)) == [("node1", 4), ("node2", 4), ("node3", 1)]
    f.write_text("node1 cpus=4\n")
    with pytest.raises(ValueError, match="unknown field 'cpus=4'"):
        parse_hostfile(str(f))
    with pytest.raises(ValueError, match="slots must be a positive integer"):
        parse_hosts("a:0")


def _sshd_config(d, hostkey) -> str:
    cfg = d / "sshd_config"
    cfg.write_text(f"Port {PORT}\nListenAddress 0.0.0.0\nHostKey {hostkey}\n"
                   f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                   "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                   "StrictModes no\nPidFile none\nAcceptEnv none\n")
    return str(cfg)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ok, why = available()
    if not ok:
        pytest.skip(why)
    if SSHD is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("needs openssh-server and openssh-client (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("ssh")
    for name in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                       check=True)
    shutil.copy(d / "id.pub", d / "authorized_keys")
    cfg = _sshd_config(d, d / "host_key")
    made_privsep = not os.path.isdir("/run/sshd")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    try:
        with _Testbed(2, rate="1gbit") as tb:
            for h in tb.hosts:
                h.popen([SSHD, "-D", "-e", "-f", cfg], stderr=subprocess.DEVNULL)
            ssh = (f"ssh -i {d / 'id'} -p {PORT} -o IdentitiesOnly=yes -o BatchMode=yes "
                   "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                   "-o LogLevel=ERROR")
            for h in tb.hosts:  # wait until each sshd answers
                for _ in range(100):
                    if tb.hosts[0].run([*ssh.split(), h.addr, "true"], check=False,
                                       timeout=20).returncode == 0:
                        break
                    time.sleep(0.1)
                else:
                    pytest.fail(f"sshd on {h.name} never answered")
            yield tb, ssh
    finally:
        if made_privsep:
            shutil.rmtree("/run/sshd", ignore_errors=True)


JOB = ("import socket, numpy as np, ringtree\n"
       "c = ringtree.init()\n"
       "x = np.full(4, c.rank + 1.0)\n"
       "c.all_reduce(x)\n"
       "print(f'rank {c.rank}/{c.size} on {socket.gethostname()}: {x[0]:g}', flush=True)\n"
       "c.close()\n")


def _run(tb, ssh: str, args: list[str], timeout: float = 120):
    env = dict(os.environ, RINGTREE_SSH=ssh)
    env.pop("RINGTREE_TOKEN", None)
    return tb.hosts[0].run([sys.executable, "-m", "ringtree.cli", "run", *args], check=False,
                           env=env, timeout=timeout)


def test_ssh_launch_runs_a_job_across_hosts(cluster):
    tb, ssh = cluster
    hosts = ",".join(f"{h.addr}:2" for h in tb.hosts)
    cp = _run(tb, ssh, ["-H", hosts, "--master", f"{tb.hosts[0].addr}:{tb.port()}",
                        sys.executable, "-c", JOB])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    lines = sorted(ln for ln in cp.stdout.splitlines() if ln.startswith("rank "))
    assert lines == [f"rank {r}/4 on {tb.hosts[r // 2].name}: 10" for r in range(4)], cp.stdout


def test_hostfile_and_a_failing_rank_stop_every_host(cluster, tmp_path):
    tb, ssh = cluster
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h.addr} slots=1\n" for h in tb.hosts))
    marker = "31.5"  # a sleep that only this test starts
    t0 = time.monotonic()
    cp = _run(tb, ssh, ["--hostfile", str(hostfile), "--master",
                        f"{tb.hosts[0].addr}:{tb.port()}", "--grace", "1", "sh", "-c",
                        f'test "$RINGTREE_RANK" != 1 || exit 3; exec sleep {marker}'])
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert time.monotonic() - t0 < 25
    assert "exited with code 3" in cp.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True)
        if left.returncode != 0:
            break
        time.sleep(0.2)
    assert left.returncode != 0, "a rank outlived the job"
