"""Work the tree's ranks share, kept exact: a Program shape compiled once
(:func:`ringtree.sim.compile.compiled.shape`), memory dependencies kept by reference
identity, routes kept once per pair (or per residue of the channel they read), and
connections routed once per pair of devices. Each is compared with the same work done
with nothing shared: Programs deep-copied (no two share a reference, so every rank is
compiled alone) and a fresh router per route."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from ringtree.ir.program import Program
from ringtree.sim import count_for, place, programs_for
from ringtree.sim.compile.compiled import Compiled, compile_programs
from ringtree.sim.compile.routes import summaries
from ringtree.sim.compile.structure import Structure
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import path
from ringtree.sim.machine.routing import Router

FIELDS = [f.name for f in dataclasses.fields(Compiled) if f.name not in ("memo", "declined")]


def _alone(progs: list[Program]) -> list[Program]:
    """The Programs with fresh references everywhere: nothing to share."""
    return [copy.deepcopy(p) for p in progs]


@pytest.mark.parametrize("topo_name,nodes,algo,in_place", [
    ("dgx_h100", 2, "tree", False), ("dgx_h100", 2, "tree_updown", True),
    ("fat_tree2", 5, "tree", True), ("dgx_a100", 3, "ring", False),
    ("switch", 6, "rabenseifner", False), ("torus", 6, "tree", False)])
def test_shapes_compile_what_each_rank_alone_does(topo_name, nodes, algo, in_place):
    topo = presets.get(topo_name, nodes)
    progs = programs_for("all_reduce", algo, topo)
    place(progs, topo)
    alone = _alone(progs)
    assert alone[0].channels[0][0].src is not progs[0].channels[0][0].src
    for nbytes in (8, 1000, 64 << 10, 3 << 20):
        count = count_for(progs[0].collective, nbytes, topo.nranks)
        want = compile_programs(alone, count, 4, 1 << 20, in_place)
        got = compile_programs(progs, count, 4, 1 << 20, in_place)
        lay = Structure(progs, in_place).compile(count, 4, 1 << 20)
        for name in FIELDS:
            assert getattr(got, name) == getattr(want, name), name
            assert getattr(lay, name) == getattr(want, name), name
        for p, q in zip(progs, alone):
            assert p.memory_deps(in_place) == q.deps_by_slots(in_place)


@pytest.mark.parametrize("topo_name,kw", [
    ("dgx_h100", {}), ("dgx_h100", {"uplinks": "hash"}), ("fat_tree3", {}),
    ("dgx_a100_sharp", {}), ("torus", {})])
def test_a_route_kept_for_every_channel_is_each_channels_own(topo_name, kw):
    topo = presets.get(topo_name, 4, **kw)
    shared = Router(topo)
    devs = list(topo.ranks)
    for a in devs[::5]:
        for b in devs[::3]:
            for ch in (0, 1, 3, 8, 9):
                assert shared.route(a, b, ch) == Router(topo).route(a, b, ch), (a, b, ch)
    # inside a node the channels share a route; across nodes each rail has its own
    kept = {k for k in shared.cache if k[2] == -1}
    assert kept or topo.routing != "updown"
    # across DGX nodes a route reads the channel as its rail (mod 8): c and c + 8 share it
    if topo_name.startswith("dgx"):
        assert {period for period, _ in shared.periodic.values()} == {8}


@pytest.mark.parametrize("topo_name,nodes,kw,algo", [
    ("dgx_h100", 3, {}, "tree"), ("dgx_h100", 2, {"uplinks": "hash"}, "tree"),
    ("fat_tree3", 4, {}, "tree"), ("dgx_a100_sharp", 2, {}, "collnet_chain"),
    ("torus", 6, {}, "tree"), ("dgx_a100", 3, {}, "ring"), ("dgx_h100", 2, {}, "rabenseifner")])
def test_connections_routed_per_pair_are_each_connections_own(topo_name, nodes, kw, algo):
    topo = presets.get(topo_name, nodes, **kw)
    progs = programs_for("all_reduce", algo, topo)
    devices = place(progs, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, 64 << 10, topo.nranks), 4,
                          1 << 20, False)
    lat, bott, first, links, shared = summaries(cp, topo, devices)
    users: dict[int, set[int]] = {}
    for cid, ((s, d), (_, _, ch)) in enumerate(zip(cp.conn_ranks, cp.conns)):
        own = path(topo, Router(topo).route(devices[s], devices[d], ch))
        assert (lat[cid], bott[cid], first[cid], links[cid]) == (
            own.latency, own.bottleneck, own.first, own.links), (s, d, ch)
        for li in own.links:
            users.setdefault(li, set()).add(cid)
    assert shared == [len(users.get(li, ())) > 1 for li in range(len(topo.links))]
    assert len({id(t) for t in links}) < len(links)      # the pairs did share
