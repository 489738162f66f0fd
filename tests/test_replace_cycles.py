"""Kill/replace cycles under ``ringtree run --max-restarts`` leave no process, shared-memory
name, descriptor or thread behind (3 cycles here; ``benchmarks/recovery.py --cycles 50``
runs the long campaign with the same code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "recovery.py")

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


def test_three_kill_replace_cycles_leave_nothing_behind(tmp_path):
    out = tmp_path / "cycles.json"
    subprocess.run([sys.executable, BENCH, "--cycles", "3", "--ranks", "3", "--json",
                    str(out)], check=True, capture_output=True, timeout=240)
    res = json.loads(out.read_text())
    assert res["rank0"] is not None, res["stderr_tail"]
    assert res["rank0"]["cycles"] == 3 and res["rank0"]["sum"] == 6.0, res
    assert res["processes"] == 6, res  # 3 ranks and 3 newcomers
    assert res["exit"] == 137, res  # the launcher still reports the deaths (SIGKILL)
    assert res["still_running"] == [] and res["shm_left"] == [], res
    first, last = res["rank0"]["held"]["1"], res["rank0"]["held"]["3"]
    assert last["fds"] <= first["fds"], res
    assert last["threads"] == first["threads"] and last["shm"] == first["shm"] == [], res
