"""Grow (``ncclCommGrow``): newcomers started with ``RINGTREE_JOIN=1`` join a running
communicator after its members; a newcomer that never comes is an error on every member,
and bad arguments are refused before anything waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import ringtree
from ringtree.testing import run_ranks

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")

JOB = textwrap.dedent('''
    import json, os, subprocess, sys
    import numpy as np
    import ringtree

    out = sys.argv[1]
    comm = ringtree.init()
    newcomers = []
    if os.environ.get("RINGTREE_JOIN") == "1":
        child = comm  # a newcomer's init returns the grown communicator
    else:
        x = np.full(4, comm.rank + 1.0, np.float32)
        comm.all_reduce(x)
        assert x[0] == 3.0
        if comm.rank == 0:
            for w in (2, 3):
                env = dict(os.environ, RINGTREE_JOIN="1", RINGTREE_RANK=str(w),
                           RINGTREE_WORLD_SIZE="4", RINGTREE_LOCAL_RANK=str(w),
                           RINGTREE_LOCAL_WORLD_SIZE="4")
                newcomers.append(subprocess.Popen([sys.executable, __file__, out], env=env))
        child = comm.grow(2)
    y = np.full(8, child.rank + 1.0, np.float32)
    child.all_reduce(y)
    z = np.zeros(4, np.int64)
    child.all_gather(np.array([child.rank], np.int64), out=z)
    with open(f"{out}.{child.rank}", "w") as f:
        json.dump([child.size, list(child.world_ranks), float(y[0]), z.tolist()], f)
    child.close()
    for p in newcomers:
        assert p.wait(timeout=120) == 0
''')


def test_two_newcomers_join_a_running_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "res"
    p = subprocess.run([sys.executable, "-m", "ringtree.cli", "run", "-n", "2", sys.executable,
                        str(script), str(out)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    for r in range(4):
        got = json.loads((tmp_path / f"res.{r}").read_text())
        assert got == [4, [0, 1, 2, 3], 10.0, [0, 1, 2, 3]], (r, got)


def nobody_comes(comm):
    with pytest.raises(ValueError, match="already in"):
        comm.grow([1])
    with pytest.raises(ValueError, match=">= 1"):
        comm.grow(0)
    try:
        comm.grow(1, timeout=1.0)
    except ringtree.RecoveryError as e:
        return str(e)
    return None


def test_a_newcomer_that_never_comes_is_an_error_on_every_member():
    res = run_ranks(nobody_comes, 2, timeout=90)
    for r, msg in enumerate(res):
        assert msg is not None and f"rank {r}: grow: no newcomer for world rank(s) 2" in msg, res
