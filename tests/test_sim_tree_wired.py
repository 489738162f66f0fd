"""The tree all-reduce compiled from its wiring (:mod:`ringtree.sim.compile.tree_wired`)
is the Compiled of every rank's Program, field by field, and runs to the reference
engine's floats; where a part's ranks do not read as one Program with other peers it
declines."""

from __future__ import annotations

import dataclasses

import pytest

from ringtree.ir.program import Collective
from ringtree.schedules import generate
from ringtree.sim import simulate
from ringtree.sim.compile import tree_wired
from ringtree.sim.compile.compiled import Compiled, compile_programs
from ringtree.sim.fold.choice import options
from ringtree.sim.machine import presets

FIELDS = [f.name for f in dataclasses.fields(Compiled) if f.name not in ("memo", "declined")]
AR = Collective.ALL_REDUCE


@pytest.mark.parametrize("topo_name,nodes,params", [
    ("dgx_h100", 4, ()), ("dgx_h100", 5, (("pattern", "split_tree"),)),
    ("dgx_a100", 3, (("pattern", "tree"),)), ("fat_tree2", 3, ()),
    ("fat_tree2", 7, (("flat", True),)), ("dgx_h100", 1, ())])
@pytest.mark.parametrize("algo", ["tree", "tree_updown"])
def test_the_wiring_gives_every_ranks_compiled_program(topo_name, nodes, params, algo):
    topo = presets.get(topo_name, nodes)
    opts = options(topo, params=params)
    n = topo.nranks
    progs = [generate(AR, algo, n, r, opts) for r in range(n)]
    for count in (1, 3, 1000, 16384):
        for itemsize, slice_bytes in ((4, 1 << 17), (2, 1 << 10)):
            want = compile_programs(progs, count, itemsize, slice_bytes, shares=False)
            got = tree_wired.compile_tree(AR, algo, n, opts, count, itemsize, slice_bytes)
            assert got is not None
            for name in FIELDS:
                assert getattr(got, name) == getattr(want, name), (name, count)
            assert got.nsteps == want.nsteps and got.nmsgs == want.nmsgs


@pytest.mark.parametrize("topo_name,nodes,nbytes", [
    ("dgx_h100", 4, 64 << 10), ("dgx_h100", 4, 8), ("dgx_a100", 3, 3 << 20),
    ("fat_tree3", 2, 100_000)])
def test_a_run_compiled_from_the_wiring_keeps_the_reference_floats(
        topo_name, nodes, nbytes, monkeypatch):
    topo = presets.get(topo_name, nodes)
    want = simulate("all_reduce", "tree", topo, nbytes, engine="reference")
    monkeypatch.setattr(tree_wired, "FROM_STEPS", 0)
    made: list = []
    real = tree_wired.compile_tree
    monkeypatch.setattr(tree_wired, "compile_tree",
                        lambda *a: made.append(real(*a)) or made[-1])
    for engine in ("reference", None):
        got = simulate("all_reduce", "tree", topo, nbytes, engine=engine)
        assert got.time_ns == want.time_ns and got.events == want.events
    assert made and all(cp is not None for cp in made)      # the runs took the path


def test_a_part_whose_ranks_differ_but_in_peers_is_declined(monkeypatch):
    topo = presets.get("dgx_h100", 2)
    opts, n = options(topo), topo.nranks
    assert tree_wired.compile_tree(AR, "ring", n, opts, 100, 4, 1 << 17) is None
    # every rank answered with rank 0's Program: a part's last rank names peers that
    # are no links of its own in the trees
    monkeypatch.setattr(tree_wired, "generate",
                        lambda coll, algo, n, r, opts: generate(coll, algo, n, 0, opts))
    assert tree_wired.compile_tree(AR, "tree", n, opts, 100, 4, 1 << 17) is None
