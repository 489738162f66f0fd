"""Topologies as data: constructors, routes, presets and file round-trips."""

from __future__ import annotations

import json

import pytest

from ringtree.sim import presets
from ringtree.sim import topology as T


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
