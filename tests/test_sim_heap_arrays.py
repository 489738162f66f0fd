"""The compiled heap set up from a Compiled's arrays (:mod:`ringtree.sim.engines.heap_arrays`)
reads what it reads when set up from the reference engine's lists (:func:`.native.pack`),
value for value, and runs without making the lists."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ringtree.ir.program import Collective
from ringtree.sim import simulate
from ringtree.sim.compile import tree_wired
from ringtree.sim.compile.compiled import Compiled
from ringtree.sim.compile.wired import Wired, tuples
from ringtree.sim.engines import heap_arrays, native
from ringtree.sim.engines.contract import Job
from ringtree.sim.engines.reference import engine_for
from ringtree.sim.fold.choice import Plan, options
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules

AR = Collective.ALL_REDUCE


def _rows(start: np.ndarray, n: np.ndarray, pool: np.ndarray) -> list:
    """Every row of a pool read through its offsets (−1: none)."""
    return [None if s < 0 else pool[s:s + k].tolist()
            for s, k in zip(start.tolist(), n.tolist())]


@pytest.mark.parametrize("topo_name,nodes,params,algo,count", [
    ("dgx_h100", 4, (), "tree", 16384), ("dgx_h100", 4, (), "tree_updown", 3),
    ("dgx_h100", 5, (("pattern", "split_tree"),), "tree", 1000),
    ("dgx_a100", 3, (("pattern", "tree"),), "tree", 1 << 18), ("fat_tree3", 2, (), "tree", 77)])
def test_the_arrays_are_the_lists_packed(topo_name, nodes, params, algo, count):
    topo = presets.get(topo_name, nodes)
    cp = tree_wired.compile_tree(AR, algo, topo.nranks, options(topo, params=params), count,
                                 4, 1 << 15)
    assert isinstance(cp, Wired)
    job = Job(Plan(cp, list(topo.ranks)), topo, Rules.of("aware", topo))
    got, work = heap_arrays.arrays(job)
    assert cp._make                               # no list made by the arrays' set-up
    want, want_work = native.pack(engine_for(job))
    assert len(got) == len(want) and np.array_equal(work, want_work)
    sl_n = want[1]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, i
        if i not in (0, 2, 3, native.STATE - 4):   # pools: laid out otherwise
            assert np.array_equal(g, w), i
    assert _rows(got[0], sl_n, got[2]) == _rows(want[0], sl_n, want[2])
    k = native.STATE - 4
    assert _rows(got[3], sl_n, got[k]) == _rows(want[3], sl_n, want[k])


@pytest.mark.parametrize("topo_name,nodes,nbytes", [
    ("dgx_h100", 4, 64 << 10), ("dgx_h100", 2, 8), ("fat_tree3", 2, 100_000)])
def test_a_run_from_the_arrays_keeps_the_reference_floats(topo_name, nodes, nbytes,
                                                         monkeypatch):
    topo = presets.get(topo_name, nodes)
    want = simulate("all_reduce", "tree", topo, nbytes, engine="reference")
    monkeypatch.setattr(tree_wired, "FROM_STEPS", 0)
    made: list = []
    real = tree_wired.compile_tree
    monkeypatch.setattr(tree_wired, "compile_tree", lambda *a: made.append(real(*a)) or made[-1])
    got = simulate("all_reduce", "tree", topo, nbytes, engine="native")
    assert got.time_ns == want.time_ns and got.events == want.events
    r, w = got.result, want.result
    assert (r.rank_done, r.messages, r.bytes, r.step_start, r.step_done) == (
        w.rank_done, w.messages, w.bytes, w.step_start, w.step_done)
    lists = {f.name for f in dataclasses.fields(Compiled) if f.name.startswith(
        ("step_", "msg_", "conn"))}
    assert len(made) == 1 and set(made[0]._make) == lists     # no list was made


def test_packed_rows_read_back_as_tuples():
    off, ids = np.array([0, 0, 1, 3, 3, 6]), np.array([4, 5, 6, 7, 8, 9])
    assert tuples(off, ids) == [(), (4,), (5, 6), (), (7, 8, 9)]
    assert tuples(np.array([0, 2, 3]), np.array([1, 2, 3])) == [(1, 2), (3,)]
    assert tuples(np.zeros(1, np.int64), np.zeros(0, np.int64)) == []


def test_walks_forked_are_the_walks_here(monkeypatch):
    from ringtree.sim.compile import routes

    topo = presets.get("dgx_h100", 4)
    rng = np.random.default_rng(5)
    gpus = np.asarray(topo.ranks)
    a, b = rng.choice(gpus, 300), rng.choice(gpus, 300)
    ch = rng.integers(0, 16, 300)
    want = routes._walk(presets.get("dgx_h100", 4), list(zip(a.tolist(), b.tolist(),
                                                             ch.tolist())))
    monkeypatch.setattr(routes, "FORK_FROM", 0)
    monkeypatch.setattr(routes, "_two_cores", lambda: True)
    assert routes.walks(topo, a, b, ch) == want
    for k in (0, 1, 2):                           # the first walked before the fork
        assert routes.walks(topo, a[:k], b[:k], ch[:k]) == tuple(x[:k] for x in want)
