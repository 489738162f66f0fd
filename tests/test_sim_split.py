"""Routes split at the GPUs' hops (``Topology.split_route``) and the route folds proved
on them (:mod:`ringtree.sim.fold.split`): every route is its split, and the split proof
finds the fold, the link orbits and the refusals that routing every connection finds."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective
from ringtree.sim import count_for
from ringtree.sim.fold import choice, moved, orbits, split, symmetry
from ringtree.sim.machine import presets
from tests.test_sim_fold import BUTTERFLY, _exact, _slow_link

FAT = [BUTTERFLY[0], BUTTERFLY[1], BUTTERFLY[2], BUTTERFLY[4],
       lambda: presets.get("dgx_h100_sharp", 8)]


@pytest.mark.parametrize("make", FAT)
def test_every_route_is_its_split(make):
    """route(a, b) = head + route(a', b') + tail for every pair of devices (GPUs,
    switches, NICs) and channel, and only GPUs (one link, to a node-local device) split."""
    topo = make()
    devs = range(len(topo.devices))
    for a in devs:
        for b in devs[::3] if len(topo.devices) > 200 else devs:
            for c in range(topo.channels):
                head, a2, b2, tail = topo.split_route(a, b, c)
                assert topo.route(a, b, c) == head + topo.route(a2, b2, c) + tail
    hops = [d for d in devs if topo.leaf_hop(d) is not None]
    assert hops == sorted(topo.ranks)


def test_hashed_uplinks_do_not_split():
    topo = presets.get("dgx_h100", 8, leaf_ports=2, uplinks="hash")
    assert all(topo.leaf_hop(d) is None for d in range(len(topo.devices)))


def _both(algo, topo, g):
    """The route fold of every connection of ``algo`` by both proofs."""
    progs = choice.Lazy(Collective.ALL_REDUCE, algo, topo.nranks, choice.options(topo))
    conns = symmetry._conns(progs)
    devices = list(topo.ranks)
    whole = orbits.Routes(sorted(conns), topo, devices, True).fold(g, topo.nranks, True)
    got = split.SplitRoutes.make(conns, topo, devices)
    return whole, got and got.fold(g, topo.nranks, True)


@pytest.mark.parametrize("make", FAT[:4])
def test_split_proof_finds_the_same_orbits(make):
    topo = make()
    g = symmetry.node_period(topo)
    for algo in ("rabenseifner", "recursive_doubling"):
        whole, got = _both(algo, topo, g)
        assert got is not None and whole is not None
        if whole.links is not None:              # else the blocks use links apart
            assert got.links == whole.links


def test_split_proof_refuses_a_slow_link():
    topo = _slow_link(presets.get("dgx_h100", 8, leaf_ports=2))
    whole, got = _both("recursive_doubling", topo, symmetry.node_period(topo))
    assert whole is None and got is None


@pytest.mark.parametrize("make", [BUTTERFLY[1], BUTTERFLY[4],
                                  lambda: _slow_link(presets.get("dgx_h100", 8,
                                                                 leaf_ports=2))])
def test_folded_through_the_split_proof_equals_unfolded(make, monkeypatch):
    """With the split proof taken at any size, the butterflies fold (or refuse) and give
    the unfolded run's time, steps, finishes and events bit for bit."""
    monkeypatch.setattr(split, "SPLIT_FROM", 0)
    topo = make()
    for algo in ("rabenseifner", "recursive_doubling"):
        for nbytes in (8, 64 << 10):
            _exact(algo, topo, nbytes)
    f = symmetry.find(choice.Lazy(Collective.ALL_REDUCE, "recursive_doubling",
                                  topo.nranks, choice.options(topo)), topo,
                      list(topo.ranks), count_for(Collective.ALL_REDUCE, 8, topo.nranks),
                      True)
    assert (f is None) == topo.name.endswith("-slow")


def test_xor_masks_of_equal_references_are_read_alike():
    """The shortcut for Programs whose references are their counterparts' gives the
    masks reading every reference gives, on every all-reduce's pairs of ranks."""
    from ringtree.schedules import algorithms, generate

    topo = presets.get("dgx_h100", 4)
    opts, n, taken = choice.options(topo), topo.nranks, 0
    for algo in algorithms("all_reduce"):
        if algo.startswith(("collnet", "nvls")):
            continue
        progs = [generate(Collective.ALL_REDUCE, algo, n, r, opts) for r in range(n)]
        for r in range(n):
            for q in {0, r ^ 8, r ^ 16}:
                p, o = progs[r], progs[q]
                if list(map(len, p.channels)) == list(map(len, o.channels)):
                    assert moved._xor_masks(p, o) == moved._xor_masks_read(p, o)
                    taken += r != q and [(s.src, s.dst) for c in p.channels for s in c] \
                        == [(s.src, s.dst) for c in o.channels for s in c]
    assert taken
