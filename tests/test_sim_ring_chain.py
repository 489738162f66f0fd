"""The ring all-reduce of one-element blocks in chains (:mod:`ringtree.sim.engines.ring_chain`)
against the reference engine, bit for bit, on runs where both run: blocks of channel 0
partly filled (count < n, the uneven chunks that break the rotation fold), exactly
filled (count = n) and a single one; and its declines, each answered by the plan the run
had without chains."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ringtree.sim as sim
from ringtree.sim.compile.ring_chain import ring_chain
from ringtree.sim.engines import dispatch
from ringtree.sim.engines import ring_chain as chains
from ringtree.sim.machine import cluster, presets
from ringtree.sim.machine.cluster import Link


def _both(topo, nbytes, **kw):
    got = sim.simulate("all_reduce", "ring", topo, nbytes, engine="ring_chain", **kw)
    want = sim.simulate("all_reduce", "ring", topo, nbytes, engine="reference", **kw)
    return got, want


@pytest.mark.parametrize("name,nodes", [("dgx_h100", 8), ("dgx_a100", 4), ("fat_tree2", 3),
                                        ("dgx_h100_sharp", 2)])
def test_the_chains_are_the_reference_on_the_presets(name, nodes):
    topo = presets.get(name, nodes)
    n = topo.nranks
    for count in sorted({1, 2, 3, n // 3, n - 1, n}):
        for itemsize in (4, 2):
            got, want = _both(topo, count * itemsize, itemsize=itemsize)
            assert got.engine == "ring_chain", (name, count)
            assert got.time_ns == want.time_ns, (name, count, itemsize)
            assert got.events == count * (2 * n - 2)


def test_the_chains_price_nccl_protocols_and_sweeps(monkeypatch):
    """On a protocol's topology (:mod:`ringtree.sim.machine.protocols`), and through a
    sweep of sizes, chains and other plans mixed, with the reference's answers."""
    topo = presets.get("dgx_h100", 4)
    for proto in ("LL", "LL128", "Simple"):
        got, want = _both(topo, 20 * 4, proto=proto)
        assert got.time_ns == want.time_ns, proto
    monkeypatch.setitem(sim._RING_FROM, None, 0)          # chains at any size
    sizes = [8, 40, 128, 4096, 16]
    runs = sim.simulate_sizes("all_reduce", "ring", topo, sizes, sweep=sim.Sweep())
    assert [r.engine for r in runs] == ["ring_chain"] * 3 + ["batched", "ring_chain"]
    for nbytes, r in zip(sizes, runs):
        want = sim.simulate("all_reduce", "ring", topo, nbytes, engine="reference")
        assert r.time_ns == want.time_ns, nbytes


def test_the_chains_with_a_reduction_rate():
    """γ on every reduction (``reduce_gbps``) and an overhead per transfer; the in-place
    ring (whose steps wait in memory for earlier ones) is not run in chains."""
    topo = cluster.switch(11, 50.0, 700.0, overhead_ns=900.0)
    gpu = replace(topo.devices[topo.ranks[0]], reduce_gbps=3.0)
    topo = replace(topo, devices=tuple(gpu if i in topo.ranks else d
                                       for i, d in enumerate(topo.devices)))
    for count in (1, 4, 10, 11):
        got, want = _both(topo, count * 4)
        assert got.time_ns == want.time_ns, count
    with pytest.raises(dispatch.EngineDeclined, match="one-element blocks"):
        sim.simulate("all_reduce", "ring", topo, 8, engine="ring_chain", in_place=True)


def test_only_a_ring_of_one_element_blocks_runs_in_chains():
    topo = presets.get("dgx_h100", 2)
    opts = sim.choice.options(topo)
    assert ring_chain(sim.parse_collective("all_reduce"), "ring", 16, opts, 17, 4,
                      1 << 20, False) is None            # blocks of two elements
    assert ring_chain(sim.parse_collective("all_gather"), "ring", 16, opts, 3, 4,
                      1 << 20, False) is None
    with pytest.raises(dispatch.EngineDeclined, match="one-element blocks"):
        sim.simulate("all_reduce", "ring", topo, 17 * 4, engine="ring_chain")
    with pytest.raises(dispatch.EngineDeclined, match="integer clock"):
        sim.simulate("all_reduce", "ring", topo, 8, engine="ring_chain",
                     model=sim.Aware(integer_ns=True))
    # below the size it pays from, the default plans are the ones they were
    assert sim.simulate("all_reduce", "ring", topo, 8).engine != "ring_chain"


def _interleaved(n: int) -> cluster.Topology:
    """A one-way ring of n devices with the ranks on every other one: each connection
    crosses two links, each link carries two connections."""
    topo = cluster.ring(n, 100.0, 500.0, bidirectional=False)
    return replace(topo, ranks=tuple(topo.ranks[i] for i in [*range(0, n, 2),
                                                               *range(1, n, 2)]))


def _slow_link(topo, src: int) -> cluster.Topology:
    """``topo`` with the link out of rank ``src`` slowed a million times."""
    links = tuple(Link(lk.src, lk.dst, lk.bandwidth * 1e-6, lk.latency)
                  if lk.src == topo.ranks[src] else lk for lk in topo.links)
    return replace(topo, links=links)


@pytest.mark.parametrize("topo,why", [
    (_interleaved(6), "used by more than one connection"),
    (_slow_link(cluster.ring(7, 100.0, 500.0, bidirectional=False), 2), "FIFOs"),
])
def test_a_decline_falls_back_to_the_plan_without_chains(topo, why, monkeypatch):
    """Shared links, or a connection whose messages queue: the chains decline, and the
    run (chains tried first, as on a large machine) is the reference's."""
    got = chains.evaluate(ring_chain(sim.parse_collective("all_reduce"), "ring",
                                     topo.nranks, sim.choice.options(topo), 5, 4, 1 << 20,
                                     False), topo, list(topo.ranks),
                          sim.Rules.of("aware", topo))
    assert isinstance(got, str) and why in got
    monkeypatch.setitem(sim._RING_FROM, None, 0)
    run = sim.simulate("all_reduce", "ring", topo, 5 * 4)
    assert dict(run.declined)["ring_chain"] == got
    want = sim.simulate("all_reduce", "ring", topo, 5 * 4, engine="reference")
    assert run.time_ns == want.time_ns


def test_the_period_is_found_not_assumed():
    assert chains.period([1, 2, 1, 2, 1, 2], 6) == 2
    assert chains.period([1, 2, 1, 2, 1, 3], 6) == 6
    assert chains.period([(1,), (1,), (1,), (1,)], 4) == 1
