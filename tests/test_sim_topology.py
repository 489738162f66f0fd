"""Topologies as data: constructors, routes, presets and file round-trips."""

from __future__ import annotations

import json

import pytest

from ringtree.sim.machine import cluster as T
from ringtree.sim.machine import presets


def _hops(topo: T.Topology, a: int, b: int, ch: int = 0) -> int:
    return len(topo.route(topo.ranks[a], topo.ranks[b], ch))


def test_fat_tree_routes():
    topo = presets.get("dgx_h100", 64)                 # 2 rail groups of 32 nodes
    assert topo.nranks == 512
    assert _hops(topo, 0, 7) == 2                      # GPU → NVSwitch → GPU
    assert _hops(topo, 0, 8) == 6                      # … NIC → rail leaf → NIC …
    assert _hops(topo, 0, 8 * 40) == 8                 # other rail group: via a spine
    links = topo.route(topo.ranks[7], topo.ranks[8], 3)
    nic = topo.devices[topo.links[links[1]].dst]
    assert nic.kind == "nic" and nic.name.endswith("nic3")   # channel 3 leaves by rail 3


def test_three_level_and_oversubscription():
    topo = presets.get("fat_tree3", 64, oversubscription=2.0)
    kinds = [d.name[:4] for d in topo.devices]
    assert kinds.count("leaf") == 8 and kinds.count("core") > 0
    assert _hops(topo, 0, 63) == 10                    # GPU NVS NIC leaf agg core agg leaf NIC NVS GPU
    for a, b in [(0, 1), (0, 9), (0, 40)]:
        route = topo.route(topo.ranks[a], topo.ranks[b])
        assert topo.links[route[0]].src == topo.ranks[a]
        assert topo.links[route[-1]].dst == topo.ranks[b]


def test_torus_dimension_order():
    topo = T.torus((4, 4), 50, 100)
    assert _hops(topo, 0, 5) == 2 and _hops(topo, 0, 3) == 1 and _hops(topo, 0, 10) == 4


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_round_trip(tmp_path, suffix):
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    for topo in (presets.get("dgx_a100_sharp", 3), T.torus((2, 3), 25, 700),
                 presets.get("local", 4)):
        f = tmp_path / f"t{suffix}"
        T.save(topo, f)
        back = T.load(f)
        assert back == topo
        assert T.to_dict(back) == T.to_dict(topo)
        assert back.route(0, topo.ranks[-1], 1) == topo.route(0, topo.ranks[-1], 1)


def test_generator_file(tmp_path):
    f = tmp_path / "h100.json"
    f.write_text(json.dumps({"generator": "dgx_h100", "args": {"nodes": 2}}))
    assert presets.get(str(f)) == presets.get("dgx_h100", 2)
    with pytest.raises(ValueError):
        presets.get("no_such_topology")


def _net_links(topo: T.Topology, a: int, b: int, ch: int) -> tuple[int, ...]:
    """The links of a route between network switches and NICs (no node-local ones)."""
    net = {i for i, d in enumerate(topo.devices) if d.kind in ("switch", "nic")}
    return tuple(li for li in topo.route(topo.ranks[a], topo.ranks[b], ch)
                 if topo.links[li].src in net and topo.links[li].dst in net)


@pytest.mark.parametrize("spec,nodes", [("dgx_h100", 128), ("dgx_a100", 60),
                                        ("fat_tree2", 64), ("fat_tree3", 64)])
def test_dmodk_shift_is_contention_free(spec, nodes):
    """D-mod-K: every shift of hosts crosses each network link at most once per channel
    (Zahavi et al. 2010); the ECMP hash does not manage that."""
    for uplinks, want in (("dmodk", True), ("hash", False)):
        topo = presets.get(spec, nodes, uplinks=uplinks)
        g = topo.nranks // nodes
        ok = True
        for s in range(1, nodes):
            for ch in (0, topo.channels - 1):
                used: set[int] = set()
                for n in range(nodes):
                    for li in _net_links(topo, n * g, ((n + s) % nodes) * g, ch):
                        ok &= li not in used
                        used.add(li)
        assert ok is want, (spec, uplinks)


def test_dmodk_digits_three_levels():
    """Three levels: the leaf takes D mod 8, the aggregation switch (D div 8) mod 4."""
    topo = presets.get("fat_tree3", 64)
    names = [topo.devices[topo.links[li].dst].name for li in topo.route(topo.ranks[9],
                                                                        topo.ranks[42])]
    assert names[2:6] == ["leaf1", "agg0.2", "core2.1", "agg1.2"]    # D = 42


def test_dmodk_xor_relabels_links():
    """XOR of node ids maps D-mod-K routes onto routes, one link bijection per XOR."""
    topo = presets.get("dgx_h100", 128)
    for x in (1, 5, 32, 96):
        fwd: dict[int, int] = {}
        for a in range(0, 128, 3):
            for b in range(0, 128, 5):
                r, s = topo.route(topo.ranks[8 * a], topo.ranks[8 * b + 1], 2), \
                    topo.route(topo.ranks[8 * (a ^ x)], topo.ranks[8 * (b ^ x) + 1], 2)
                assert len(r) == len(s)
                for u, v in zip(r, s):
                    assert fwd.setdefault(u, v) == v


def test_uplinks_checked_and_saved(tmp_path):
    topo = presets.get("fat_tree2", 32, uplinks="hash")
    T.save(topo, tmp_path / "t.json")
    assert T.load(tmp_path / "t.json").uplinks == "hash"
    with pytest.raises(ValueError, match="unknown uplinks 'random'"):
        presets.get("fat_tree2", 32, uplinks="random").route(0, 5)
