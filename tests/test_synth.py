"""Schedule synthesis (``ringtree algo synth``): trees packed at a topology's bound.

The bound against hand-computed cuts; the packing against the links it runs on (every
tree edge's route, loaded with the tree's share, within the link's rate); the Programs
through the checker on symmetric and asymmetric topologies; a forest file run on real
ranks with exact results; export to MSCCL-IR and back.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("networkx", reason="synthesis needs networkx (the synth extra)")

from ringtree.ir.check import check_programs, same_outputs  # noqa: E402
from ringtree.ir.collectives import Collective  # noqa: E402
from ringtree.schedules import generate_all, synth  # noqa: E402
from ringtree.schedules.forest import Graph, bound, pack  # noqa: E402
from ringtree.sim.machine import presets  # noqa: E402
from ringtree.sim.synth import graph_of, packings, synthesize  # noqa: E402


def _star(rates: list[float]) -> Graph:
    g = Graph(len(rates))
    for r, c in enumerate(rates):
        g.add(r, len(rates), c)
        g.add(len(rates), r, c)
    return g


def test_the_bound_is_the_tightest_cut():
    """x* = min over cuts of B⁺(S)/|S ∩ ranks|: a switch (every rank receives n−1 blocks
    over its link), a slow leaf (it does, over its slow link), a bidirectional ring (an
    arc of n−1 ranks sends over two links)."""
    assert math.isclose(bound(_star([50.0] * 4)), 50 / 3)
    assert math.isclose(bound(_star([50.0, 50.0, 10.0, 50.0, 50.0])), 10 / 4)
    ring = Graph(5)
    for r in range(5):
        ring.add(r, (r + 1) % 5, 20.0)
        ring.add((r + 1) % 5, r, 20.0)
    assert math.isclose(bound(ring), 40 / 4)
    cut = Graph(3, {(0, 1): 5.0, (1, 0): 5.0})    # rank 2 is reached by nobody
    assert bound(cut) == 0.0
    with pytest.raises(ValueError, match="does not connect"):
        pack(cut)


def _loads_fit(topo, packing, reverse: bool = False) -> None:
    """Every tree edge u → v carries the tree's weight over the links of the route the
    simulator gives u → v (v → u for reduce trees: the partial sums flow to the root);
    no link carries more than its rate, and every root sends the rank graph's x*."""
    load: dict[int, float] = {}
    for _, parent, w in packing.trees:
        for v, u in enumerate(parent):
            if u >= 0:
                a, b = (v, u) if reverse else (u, v)
                for li in topo.route(topo.ranks[a], topo.ranks[b], 0):
                    load[li] = load.get(li, 0.0) + w
    over = {li: (x, topo.bytes_per_ns(li)) for li, x in load.items()
            if x > topo.bytes_per_ns(li) * (1 + 1e-6)}
    assert over == {}
    for r in range(topo.nranks):
        assert math.isclose(sum(w for root, _, w in packing.trees if root == r),
                            packing.ranks_bound, rel_tol=1e-6)


TOPOLOGIES = [("switch", 4, {}), ("ring", 5, {}), ("torus", 6, {}),
              ("mi300x", 2, {"gpus_per_node": 2}),
              ("mi300x", 2, {"gpus_per_node": 3, "slow_nic": 0.5}),
              ("testbed", 2, {"ppn": 2, "slow": 0.25}), ("fat_tree2", 4, {})]


@pytest.mark.parametrize("name,nodes,kw", TOPOLOGIES,
                         ids=[f"{n}{k}-{kw}" for n, k, kw in TOPOLOGIES])
def test_trees_reach_the_bound_within_the_links_and_pass_the_checker(name, nodes, kw):
    topo = presets.get(name, nodes, **kw)
    (gather, reduce), = packings(topo)
    for p in (gather, reduce):
        assert p.ranks_bound <= p.bound * (1 + 1e-6)
        assert p.ranks_bound >= 0.999 * p.bound, "pairs the routes allow reach the bound"
    _loads_fit(topo, gather)
    _loads_fit(topo, reduce, reverse=True)
    forest = synthesize(topo)
    algo = synth.define(f"t-{topo.name}", forest)
    for coll in synth.COLLECTIVES:
        programs = generate_all(coll, algo, topo.nranks)
        for in_place in (False, True):
            check_programs(programs, in_place=in_place)


def test_a_forest_file_is_checked_when_read(tmp_path):
    forest = synthesize(presets.get("switch", 3))
    good = tmp_path / "three.json"
    synth.save(forest, str(good))
    assert synth.load(str(good)) == forest
    data = json.loads(good.read_text())
    data["gather"][0][1][1] = 1                      # a rank its own parent: no root reached
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bad.json.*does not reach root"):
        synth.load(str(bad))
    data = json.loads(good.read_text())
    data["reduce"][0][2] = 5                           # more units than the block has
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="units per root"):
        synth.load(str(bad))
    with pytest.raises(ValueError, match="no forest file"):
        synth.resolve("synth:" + str(tmp_path / "missing.json"))
    algo = synth.resolve("synth:" + str(good))
    with pytest.raises(ValueError, match="synthesized for 3 ranks, not 4"):
        generate_all(Collective.ALL_GATHER, algo, 4)


@pytest.mark.parametrize("coll", synth.COLLECTIVES, ids=lambda c: c.value)
def test_export_then_import_computes_the_same_bits(coll):
    from ringtree import msccl
    from ringtree.msccl.export import from_programs
    from ringtree.msccl.program import to_programs

    topo = presets.get("mi300x", 2, gpus_per_node=2, slow_nic=0.5)
    algo = synth.define("t-export", synthesize(topo, units=2))
    programs = generate_all(coll, algo, topo.nranks)
    again, _ = msccl.read_text(msccl.to_text(from_programs(programs, algo)))
    assert same_outputs(programs, to_programs(again, algo))


def test_algo_synth_and_sim_take_a_preset(tmp_path, capsys):
    from ringtree.sim.cli import main as sim
    from ringtree.tools.algo import main as algo

    out = tmp_path / "sw.json"
    assert algo(["synth", "all_reduce", "--topology", "switch", "--nodes", "4",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "proven out of place and in place" in text and out.exists()
    assert algo(["synth", "all_reduce", "--topology", "switch", "--nodes", "4",
                 "-o", str(tmp_path / "sw.xml")]) == 0
    assert algo(["import", str(tmp_path / "sw.xml")]) == 0
    assert algo(["synth", "broadcast", "--topology", "switch"]) == 2
    assert "no synthesis for broadcast" in capsys.readouterr().err
    assert sim(["all_gather", "-t", "switch", "-N", "4", "--algo", f"ring,synth,synth:{out}",
                "-b", "1M", "-e", "1M", "-j", "1"]) == 0
    table = capsys.readouterr().out
    assert "synth:switch4" in table and "synth:sw" in table


def _run(comm, path: str) -> list[bool]:
    import numpy as np

    n, algo = comm.size, f"synth:{path}"
    count = 4 * 3 * 5
    x = (np.arange(count, dtype=np.float32) % 97) + comm.rank
    want = sum((np.arange(count, dtype=np.float32) % 97) + r for r in range(n))
    y = np.empty_like(x)
    comm.all_reduce(x, out=y, algo=algo)
    ok = [bool(np.array_equal(y, want))]
    z = x.copy()
    comm.all_reduce(z, algo=algo)                   # in place
    ok.append(bool(np.array_equal(z, want)))
    g = comm.all_gather(x, algo=algo)
    ok.append(bool(np.array_equal(g.reshape(n, count), np.stack(
        [(np.arange(count, dtype=np.float32) % 97) + r for r in range(n)]))))
    s = np.empty(count // n, np.float32)
    comm.reduce_scatter(x, out=s, algo=algo)
    ok.append(bool(np.array_equal(s, want.reshape(n, -1)[comm.rank])))
    return ok


def test_a_forest_file_runs_on_real_ranks_with_exact_results(tmp_path):
    """Trees packed for an uneven testbed of 2 hosts × 2 ranks, written to a file and
    named ``synth:FILE`` on 4 ranks: exact sums, in place and out of place."""
    from ringtree.testing import run_ranks

    path = tmp_path / "uneven.json"
    synth.save(synthesize(presets.get("testbed", 2, ppn=2, slow=0.5)), str(path))
    assert run_ranks(_run, 4, str(path)) == [[True] * 4] * 4


def test_the_adapter_refuses_two_ranks_on_one_device():
    from dataclasses import replace

    topo = presets.get("switch", 2)
    with pytest.raises(ValueError, match="share a device"):
        graph_of(replace(topo, ranks=(0, 0)))
