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
    (["--elastic", "--dp", "4", "--save", "ck"], "does not support --save"),
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


def _run(tmp_path, name: str, kills: list[str], launcher: tuple = (), train: tuple = ()
         ) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "4", *launcher, sys.executable,
           "-m", "ringtree.cli", "train", "--elastic", "--dp", "4", "--json", str(out), *TINY,
           *train, *(w for k in kills for w in ("--kill", k))]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.exists(), p.stderr[-3000:]
    return p, json.loads(out.read_text())


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    p, res = _run(tmp_path_factory.mktemp("clean"), "clean", [])
    assert p.returncode == 0, p.stderr[-3000:]
    assert res["failures"] == [] and res["ranks_at_end"] == 4
    samples = res["samples"]
    assert samples["ids"] == 5 * 8 and samples["min_uses"] == samples["max_uses"] == 1
    return res


def _same_run(got: dict, clean: dict) -> None:
    assert got["param_sha256"] == clean["param_sha256"]
    assert got["samples"] == clean["samples"]  # every sample id used exactly once
    assert got["losses"] == clean["losses"]


def test_shrinking_changes_no_bit(tmp_path, clean):
    """Rank 1 killed inside step 1's gradient exchange, rank 2 in step 2's forward, rank 3
    between its exchange and its update in step 3 (three shrinks, one process left): the
    same parameters and losses as the unbroken run, bit for bit, every sample used once,
    and the launcher reports every death."""
    p, got = _run(tmp_path, "shrunk", ["1:1:allreduce", "2:2:compute", "3:3:optimizer"],
                  launcher=("--enable-recovery",))
    assert p.returncode == 137, p.stderr[-3000:]
    for r in (1, 2, 3):
        assert f"rank {r} was killed by signal 9" in p.stderr, p.stderr[-3000:]
    assert sorted(sum((f["dead"] for f in got["failures"]), [])) == [1, 2, 3]
    assert {f["how"] for f in got["failures"]} == {"shrink"} and got["ranks_at_end"] == 1
    _same_run(got, clean)


def test_a_source_dying_during_the_transfer_changes_no_bit(tmp_path, clean):
    """``--max-restarts 1``: rank 1 killed in step 2's forward and replaced; rank 2 dies as
    it starts streaming the state to the newcomer. Everyone, the newcomer too, recovers
    again, now by shrinking (no restart left, one decision on every rank), and the result
    is the unbroken run's, bit for bit."""
    p, got = _run(tmp_path, "transfer", ["1:2:compute", "2:2:transfer"],
                  launcher=("--max-restarts", "1"))
    assert p.returncode == 137, p.stderr[-3000:]
    fails = got["failures"]
    assert [f["dead"] for f in fails] == [[1], [2]], fails
    assert [f["how"] for f in fails] == ["replace", "shrink"] and got["ranks_at_end"] == 3
    _same_run(got, clean)


def test_replacing_changes_no_bit(tmp_path, clean):
    """``--max-restarts 2``: ranks 1 and 3 killed and replaced by newcomers that receive
    the state from the three survivors (one chunk damaged in flight and fetched again):
    the same bits as the unbroken run."""
    p, got = _run(tmp_path, "replaced", ["1:1:allreduce", "3:3:compute"],
                  launcher=("--max-restarts", "2"), train=("--corrupt-chunk", "1"))
    assert p.returncode == 137, p.stderr[-3000:]
    assert "starting a replacement (restart 2 of 2)" in p.stderr, p.stderr[-3000:]
    fails = got["failures"]
    assert [f["dead"] for f in fails] == [[1], [3]] and got["ranks_at_end"] == 4, fails
    assert [f["how"] for f in fails] == ["replace", "replace"]
    assert [f["transfer"]["sources"] for f in fails] == [3, 3]
    assert fails[0]["transfer"]["refetched"] == 1
    _same_run(got, clean)


def test_zero1_replacing_then_shrinking_changes_no_bit(tmp_path, clean):
    """``--zero 1`` under ``--max-restarts 1``: rank 1 killed before its update in step 1
    is replaced (the newcomer receives its block's moments from the buddy), then rank 2
    (step 2, forward) and rank 3 (step 3, inside the gradient all-to-all) are not, so the
    survivors shrink and the buddies take their blocks over. The same bits as the
    unbroken run — the data-parallel one, since ZeRO-1 here sums and updates the same
    elements with the same ops, only in blocks."""
    p, got = _run(tmp_path, "zero", ["1:1:optimizer", "2:2:compute", "3:3:allreduce"],
                  launcher=("--max-restarts", "1"), train=("--zero", "1"))
    assert p.returncode == 137, p.stderr[-3000:]
    fails = got["failures"]
    assert [(f["dead"], f["how"]) for f in fails] == \
        [([1], "replace"), ([2], "shrink"), ([3], "shrink")], fails
    assert fails[0]["transfer"]["optimizer_bytes_sent"] > 0 and got["ranks_at_end"] == 2
    _same_run(got, clean)
