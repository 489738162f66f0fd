"""SIGTERM (how ``ringtree run`` stops a failed job) cleans /dev/shm like a normal exit."""

from __future__ import annotations

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
RANK = """
    import os, sys, time, numpy as np, ringtree
    comm = ringtree.init(timeout=60)
    print("PID", os.getpid(), flush=True)
    if comm.rank == 0:
        comm.send(np.ones(4 << 20, np.float32), 1)   # 16 MiB: fills the ring, then waits
    time.sleep(60)                                    # rank 1 never receives
"""


def _names(pids: list[int]) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith("ringtree-")
            and any(f"-p{p}-" in n for p in pids)]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_sigterm_leaves_nothing_in_dev_shm():
    port = free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTREE_")}
        env.update(RINGTREE_RANK=str(r), RINGTREE_WORLD_SIZE="2", RINGTREE_LOCAL_RANK=str(r),
                   RINGTREE_LOCAL_WORLD_SIZE="2", RINGTREE_MASTER_ADDR="127.0.0.1",
                   RINGTREE_MASTER_PORT=str(port), RINGTREE_TOKEN="sigterm",
                   RINGTREE_TRANSPORT="shm",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    try:
        pids = [int(p.stdout.readline().split()[1]) for p in procs]
        deadline = time.monotonic() + 30
        while not any("0to1c" in n for n in _names(pids)):  # the ring rank 1 never opens
            assert time.monotonic() < deadline, "the ring never appeared"
            time.sleep(0.05)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]  # still reported as killed by it
    assert _names(pids) == []
