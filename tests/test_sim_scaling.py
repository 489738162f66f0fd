"""Consistency bars: bandwidth-optimal ring, log-depth trees, linear rings."""

from __future__ import annotations

import math

import pytest

from ringtree.sim import simulate
from ringtree.sim.machine import cluster as T
from ringtree.sim.machine import presets


@pytest.mark.parametrize("n", [4, 8, 16])
def test_ring_busbw_reaches_link_bandwidth(n):
    """Congestion-aware ring all-reduce on a uniform 50 GB/s ring: busbw within 2 %."""
    run = simulate("all_reduce", "ring", T.ring(n, 50.0, 500.0), 1 << 30, model="aware")
    assert run.busbw == pytest.approx(50.0, rel=0.02)
    assert run.busbw <= 50.0


def test_ring_linear_tree_logarithmic():
    """8 B all-reduce over 8…1024 nodes: ring time ∝ nodes, tree time ∝ log2(nodes)."""
    ns = [8, 64, 1024]
    ring = [simulate("all_reduce", "ring", presets.get("switch", n), 8, model="fast").time_ns
            for n in ns]
    tree = [simulate("all_reduce", "tree", presets.get("switch", n), 8, model="fast").time_ns
            for n in ns]
    for n, t in zip(ns, ring):                      # 2(n−1) steps of 2 hops × 500 ns
        assert t == pytest.approx(2 * (n - 1) * 1000.0, rel=1e-3)
    for n, t in zip(ns, tree):                      # up and down a depth-log2(n) tree
        assert t == pytest.approx(2 * math.log2(n) * 1000.0, rel=1e-3)
    assert ring[-1] / ring[0] == pytest.approx(1023 / 7, rel=0.01)
    assert tree[-1] / tree[0] == pytest.approx(10 / 3, rel=0.01)


def test_collnet_beats_ring_at_scale():
    """In-network reduction: latency independent of the node count, and at large sizes
    each NIC carries n bytes instead of the ring's 2(p−1)/p·n."""
    topo = presets.get("dgx_h100_sharp", 8)
    small = {a: simulate("all_reduce", a, topo, 8).time_ns
             for a in ("ring", "tree", "collnet_direct", "collnet_chain")}
    assert small["collnet_direct"] < small["tree"] < small["ring"]
    big = {a: simulate("all_reduce", a, topo, 1 << 26).time_ns for a in ("ring",
                                                                          "collnet_direct")}
    assert big["collnet_direct"] < big["ring"]
