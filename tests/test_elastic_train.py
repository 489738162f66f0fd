"""``ringtree train --elastic``: ranks killed mid-step change no bit of the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is an optional extra")

from ringtree.apps.parallel import train_cli  # noqa: E402
from ringtree.apps.parallel.elastic import parse_kill  # noqa: E402

pytestmark = pytest.mark.torch

TINY = ["--layers", "1", "--heads", "2", "--embd", "32", "--block-size", "16",
        "--batch-size", "8", "--steps", "5", "--no-progress"]


@pytest.mark.parametrize("argv, message", [
    (["--elastic", "--dp", "2", "--tp", "2"],
     "data parallel only"),
    (["--elastic", "--dp", "4", "--zero", "1"], "does not support --zero 1"),
    (["--kill", "1:2", "--dp", "4"], "--kill is a drill of --elastic runs"),
    (["--elastic", "--dp", "4", "--kill", "1"], "expected RANK:STEP[:PHASE]"),
    (["--elastic", "--dp", "4", "--kill", "1:2:backward"], "phase must be one of"),
])
def test_elastic_argument_errors(monkeypatch, capsys, argv, message):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    assert train_cli.main(TINY + argv) == 2
    assert message in capsys.readouterr().err


def test_kill_spec():
    assert parse_kill("2:5:allreduce") == parse_kill("2:5:allreduce", 1)
    assert parse_kill("0:3", seed=7).phase in ("compute", "allreduce", "optimizer")


def _run(tmp_path, name: str, kills: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "4", "--enable-recovery",
           sys.executable, "-m", "ringtree.cli", "train", "--elastic", "--dp", "4",
           "--json", str(out), *TINY, *(w for k in kills for w in ("--kill", k))]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.exists(), p.stderr[-3000:]
    return p, json.loads(out.read_text())


def test_killed_ranks_change_no_bit(tmp_path):
    """The same seed with no failure, and with rank 1 killed inside step 1's gradient
    exchange, rank 2 in step 2's forward and rank 3 between its exchange and its update
    in step 3 (three shrinks, one process left): the same parameters and losses, bit for
    bit, every sample used once, and the launcher reports every death."""
    p, clean = _run(tmp_path, "clean", [])
    assert p.returncode == 0, p.stderr[-3000:]
    assert clean["failures"] == [] and clean["ranks_at_end"] == 4
    samples = clean["samples"]
    assert samples["ids"] == 5 * 8 and samples["min_uses"] == samples["max_uses"] == 1
    p, got = _run(tmp_path, "killed", ["1:1:allreduce", "2:2:compute", "3:3:optimizer"])
    assert p.returncode == 137, p.stderr[-3000:]
    for r in (1, 2, 3):
        assert f"rank {r} was killed by signal 9" in p.stderr, p.stderr[-3000:]
    dead = [f["dead"] for f in got["failures"]]
    assert sorted(sum(dead, [])) == [1, 2, 3] and got["ranks_at_end"] == 1, got["failures"]
    assert got["param_sha256"] == clean["param_sha256"]
    assert got["samples"] == samples
    assert got["losses"] == clean["losses"]
