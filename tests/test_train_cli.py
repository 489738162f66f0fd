"""``ringtree train`` end to end, its argument checks, and the schedule tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is an optional extra")

from ringtree.apps.parallel import schedule, train_cli  # noqa: E402
from ringtree.apps.parallel.record import link  # noqa: E402

pytestmark = pytest.mark.torch

TINY = ["--layers", "2", "--heads", "4", "--embd", "32", "--block-size", "32",
        "--no-progress"]


@pytest.mark.parametrize("argv, world, message", [
    (["--dp", "2", "--tp", "2"], 8, "world size 8 is not dp*tp*pp = 2*2*1 = 4"),
    (["--tp", "3", "--dp", "1"], 3, "--tp 3 does not divide the number of attention heads 4"),
    (["--pp", "3"], 3, "--pp 3 is larger than the number of layers 2"),
    (["--dp", "2", "--batch-size", "6", "--micro-batches", "2"], 2,
     "--batch-size 6 is not divisible by dp*micro-batches = 2*2"),
    (["--resume", "/nonexistent-ckpt"], 1, "is not a ringtree checkpoint"),
])
def test_grid_errors_come_before_any_work(monkeypatch, capsys, argv, world, message):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    assert train_cli.main(argv + TINY) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_short_run_lowers_validation_loss(tmp_path):
    """60 steps on 2 data-parallel ranks (launched by ``ringtree run``): the validation
    loss falls from ~ln 96 = 4.56 by at least 1.0 nat per character."""
    out = tmp_path / "run.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "2", sys.executable, "-m",
           "ringtree.cli", "train", "--dp", "2", "--steps", "60", "--batch-size", "16",
           "--lr", "1e-2", "--json", str(out), *TINY]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) == {"losses", "val_losses", "tokens_per_s", "step_ms", "grid", "backend",
                        "wait_ms"}
    assert res["grid"] == {"dp": 2, "tp": 1, "pp": 1} and res["backend"] == "ringtree"
    waits = res["wait_ms"]  # dp = 2 only: no tp or pp communication at all
    assert set(waits) == {"tp", "pp", "dp", "loss"} and waits["tp"] == waits["pp"] == 0.0
    assert waits["dp"] > 0 and waits["loss"] > 0
    assert len(res["losses"]) == len(res["step_ms"]) == 60 and res["tokens_per_s"] > 0
    first, last = res["val_losses"][0], res["val_losses"][-1]
    assert first - last >= 1.0, f"validation loss {first:.3f} -> {last:.3f}"


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (2, 5), (4, 4), (4, 8), (3, 7)])
def test_schedule_bubble_is_the_formula(name, p, m):
    table = schedule.make(name, p, m)
    for row in table:      # every micro-batch forward then backward exactly once
        assert sorted(row) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        assert all(row.index(("F", j)) < row.index(("B", j)) for j in range(m))
    tl = schedule.timeline(table)
    assert schedule.idle_fraction(tl) == pytest.approx(schedule.bubble_fraction(p, m))
    if name == "1f1b":     # at most p - s micro-batches in flight on stage s
        for s, row in enumerate(table):
            live = peak = 0
            for kind, _ in row:
                live += 1 if kind == "F" else -1
                peak = max(peak, live)
            assert peak <= min(p - s, m)


def test_schedule_render_and_deadlock():
    text = schedule.render(schedule.make("1f1b", 2, 3))
    assert text.splitlines()[0].startswith("stage 0: F0 F1") and "(p-1)/(m+p-1) = 1/4" in text
    bad = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]
    with pytest.raises(ValueError, match="deadlocks"):
        schedule.timeline(bad)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        schedule.make("zb", 2, 2)


def test_record_links_sends_to_receives():
    ranks = [{"rank": 0, "events": [{"op": "send", "peer": 1}, {"op": "send", "peer": 1}]},
             {"rank": 1, "events": [{"op": "all_reduce"}, {"op": "recv", "peer": 0},
                                    {"op": "recv", "peer": 0}]}]
    out = link(ranks)
    assert out[1]["events"][1]["deps"] == [[1, 0], [0, 0]]
    assert out[1]["events"][2]["deps"] == [[1, 1], [0, 1]]
    with pytest.raises(ValueError, match="more often"):
        link([{"rank": 0, "events": []}, {"rank": 1, "events": [{"op": "recv", "peer": 0}]}])


def test_record_comm_then_replay_on_a_modeled_cluster(tmp_path):
    """A TP=2 x PP=2 step recorded by ``ringtree train --record-comm``: every TP and PP
    operation the model implies is there, and ``ringtree sim --workload`` replays it."""
    rec = tmp_path / "step.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    m = 3
    cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "4", sys.executable, "-m",
           "ringtree.cli", "train", "--tp", "2", "--pp", "2", "--steps", "2",
           "--micro-batches", str(m), "--batch-size", "6", "--eval-batches", "1",
           "--record-comm", str(rec), *TINY]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(rec.read_text())
    assert doc["format"] == "ringtree-comm/1" and doc["grid"] == {"dp": 1, "tp": 2, "pp": 2}
    assert doc["step"] == 1 and len(doc["ranks"]) == 4
    for r in doc["ranks"]:
        first = r["coords"]["pp"] == 0
        ops = [(e["op"], e["axis"]) for e in r["events"]]
        # one layer per stage: forward 2 all-reduces (g) + the embedding's g (first stage)
        # or the loss's 2 (last stage); backward 2 (f) + the head's f (last stage)
        tp_per_mb = (2 + 1 + 2) if first else (2 + 2 + 2 + 1)
        assert ops.count(("all_reduce", "tp")) == m * tp_per_mb
        assert ops.count(("send", "pp")) == ops.count(("recv", "pp")) == m
        assert not any(axis == "dp" for _, axis in ops)          # dp = 1: nothing to sync
    out = subprocess.run([sys.executable, "-m", "ringtree.cli", "sim", "--workload", str(rec),
                          "--topology", "dgx_h100", "--nodes", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "grid dp=2 tp=2 pp=2" in out.stdout and "step communication time" in out.stdout


GROUPS_GONE = """
import sys, weakref
import torch.distributed as dist
from ringtree.apps.parallel import train_cli

made = []
new_group = dist.new_group
def tracked(*a, **k):
    g = new_group(*a, **k)
    if isinstance(g, dist.ProcessGroup):  # not GroupMember.NON_GROUP_MEMBER
        made.append(weakref.ref(g))
    return g
dist.new_group = tracked
assert train_cli.main(sys.argv[1:]) == 0
alive = [w() for w in made if w() is not None]
assert made and not alive, f"{len(alive)} of {len(made)} process groups outlived the run"
"""


@pytest.mark.parametrize("backend", ["gloo", "ringtree"])
def test_process_groups_are_gone_when_train_returns(tmp_path, backend):
    """Every group the grid made is destroyed inside ``ringtree train``, not left to a
    garbage collection at interpreter exit (where gloo's threads can abort the rank)."""
    script = tmp_path / "groups_gone.py"
    script.write_text(GROUPS_GONE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", "4", sys.executable,
           str(script), "--dp", "2", "--tp", "2", "--steps", "2", "--batch-size", "4",
           "--eval-batches", "1", "--backend", backend, *TINY]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
