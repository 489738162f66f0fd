"""``ringtree sim --workload``: replay of a recorded training step's communication."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="the workloads come from the torch training layer")

from ringtree.sim import cli as sim_cli  # noqa: E402
from ringtree.sim import workload  # noqa: E402
from ringtree.sim.machine import presets


def _doc(events0, events1, grid=None):
    grid = grid or {"dp": 1, "tp": 1, "pp": 2}
    ranks = [{"rank": 0, "coords": {"dp": 0, "pp": 0, "tp": 0}, "events": events0},
             {"rank": 1, "coords": {"dp": 0, "pp": 1, "tp": 0}, "events": events1}]
    from ringtree.apps.parallel.record import link

    return {"format": workload.FORMAT, "grid": grid, "world": 2, "model": {},
            "batch_size": 2, "micro_batches": 1, "schedule": "1f1b", "zero": 0, "step": 0,
            "ranks": link(ranks)}


def _send(peer, n):
    return {"op": "send", "axis": "pp", "ranks": [0, 1], "bytes": n, "peer": peer}


def _recv(peer, n):
    return {"op": "recv", "axis": "pp", "ranks": [0, 1], "bytes": n, "peer": peer}


def test_receive_waits_for_send_and_times_add_up():
    topo = presets.get("dgx_h100", 1)
    n = 1 << 20
    doc = _doc([_send(1, n), _recv(1, n)], [_recv(0, n), _send(0, n)])
    res = workload.replay(doc, topo, dp=4, tp=1, pp=2)
    one = workload._Costs(topo, "fast").p2p(0, 1, n)
    assert one > n / (topo.links[0].bandwidth * 1e9 / 1e9) / 10   # a real, positive cost
    # rank 1 receives (one transfer), sends back (another): two transfers end to end
    assert res.step_ns == pytest.approx(2 * one)
    assert res.axis_ops == {"pp": 2} and res.axis_bytes == {"pp": 2 * n}


def test_collectives_rendezvous_and_dp_bytes_scale_with_model_share():
    topo = presets.get("dgx_h100", 2)          # 16 GPUs
    ar = {"op": "all_reduce", "axis": "dp", "ranks": [0, 1], "bytes": 1 << 20}
    grid = {"dp": 2, "tp": 1, "pp": 1}
    doc = _doc([ar], [dict(ar)], grid)
    doc["ranks"][1]["coords"] = {"dp": 1, "pp": 0, "tp": 0}
    a = workload.replay(doc, topo, dp=8, tp=2, pp=1)          # each rank holds half
    assert a.axis_bytes == {"dp": 1 << 19} and a.grid == {"dp": 8, "tp": 2, "pp": 1}
    b = workload.replay(doc, topo, dp=16, tp=1, pp=1)
    assert b.axis_bytes == {"dp": 1 << 20} and b.step_ns > a.step_ns > 0
    with pytest.raises(ValueError, match="topology has 16 GPUs"):
        workload.replay(doc, topo, dp=3, tp=2, pp=1)


def test_deadlocked_workload_is_reported():
    doc = _doc([_recv(1, 8), _send(1, 8)], [_recv(0, 8), _send(0, 8)])
    with pytest.raises(ValueError, match="deadlocks"):
        workload.replay(doc, presets.get("dgx_h100", 1), dp=4)


def test_cli_prints_the_split_and_rejects_other_files(tmp_path, capsys):
    f = tmp_path / "w.json"
    f.write_text(json.dumps(_doc([_send(1, 4096)], [_recv(0, 4096)])))
    assert sim_cli.main(["--workload", str(f), "--topology", "dgx_h100", "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "grid dp=4 tp=1 pp=2" in out and "step communication time" in out
    g = tmp_path / "bad.json"
    g.write_text("{}")
    assert sim_cli.main(["--workload", str(g)]) == 2
    assert "expected 'ringtree-comm/1'" in capsys.readouterr().err
