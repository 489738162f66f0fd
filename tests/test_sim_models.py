"""Every model on every preset at the preset's own default channels: the α-β fast path is
the unaware engine, no model beats the hardware, and the models agree where the network
has no contention to disagree about."""

from __future__ import annotations

import pytest

from ringtree.schedules import algorithms
from ringtree.sim import simulate
from ringtree.sim.machine import presets

MiB = 1 << 20
# small instances of every preset (one leaf switch, so the aware model sees no ECMP clash)
SIZES = {"dgx_a100": 2, "dgx_a100_sharp": 2, "dgx_h100": 2, "dgx_h100_sharp": 2,
         "nvswitch": 8, "fat_tree2": 8, "fat_tree3": 8, "ring": 8, "torus": 16,
         "switch": 8, "switch_sharp": 8, "local": 4, "mi300x": 1, "mi300x_slow_nic": 1,
         "testbed": 2, "testbed_slow": 2}


def test_every_preset_is_listed():
    assert set(SIZES) == set(presets.PRESETS)


def _egress(topo) -> float:
    """The most a rank can send per ns: the sum of its device's outgoing links (GB/s)."""
    out = [0.0] * len(topo.devices)
    for lk in topo.links:
        out[lk.src] += lk.bandwidth * topo.gb / 1e9
    return min(out[d] for d in topo.ranks)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_models_agree_at_default_channels(name):
    topo = presets.get(name, SIZES[name])
    cap = _egress(topo)
    runs = {m: simulate("all_reduce", "ring", topo, 64 * MiB, model=m)
            for m in ("aware", "unaware", "fast")}
    assert runs["fast"].time_ns == pytest.approx(runs["unaware"].time_ns, rel=1e-12)
    for m, r in runs.items():
        # a ring rank sends exactly 2(n-1)/n of the data: busbw is bounded by its links
        assert r.busbw <= cap * (1 + 1e-9), (m, r.busbw, cap)
        assert r.busbw == pytest.approx(runs["aware"].busbw, rel=0.15), (m, r.busbw)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_no_model_exceeds_the_links(name):
    """Without in-network reduction an all-reduce moves ≥ (n−1)/n of the data out of
    every rank and into it, so busbw ≤ 2 × a rank's link bandwidth for any algorithm;
    fast = unaware for every algorithm."""
    topo = presets.get(name, SIZES[name])
    cap = _egress(topo)
    for algo in algorithms("all_reduce"):
        if algo.startswith(("collnet", "nvls")):
            continue
        fast = simulate("all_reduce", algo, topo, 16 * MiB, model="fast")
        slow = simulate("all_reduce", algo, topo, 16 * MiB, model="unaware")
        assert fast.time_ns == pytest.approx(slow.time_ns, rel=1e-12), algo
        aware = simulate("all_reduce", algo, topo, 16 * MiB, model="aware")
        for r in (fast, aware):
            assert r.busbw <= 2 * cap, (algo, r.busbw, cap)
