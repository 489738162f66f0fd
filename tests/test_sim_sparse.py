"""The small-message path (:mod:`ringtree.sim.compile.sparse`): a template's moving steps
only, empty steps contracted, against the reference engine on every rank's full
Programs — the time, every rank's finish, messages, bytes, heap events, and every moving
step's start and done, bit for bit — on the 8-node DGX presets and small topologies,
every collective with a template, in place and not (in place brings memory
dependencies to contract), both aware models and the unaware one."""

from __future__ import annotations

import numpy as np
import pytest

import ringtree.sim as sim
from ringtree.ir.program import Collective, Ref
from ringtree.schedules import algorithms
from ringtree.sim.compile import sparse, symbolic
from ringtree.sim.engines import dispatch
from ringtree.sim.engines.contract import Job
from ringtree.sim.fold import choice
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Aware, Unaware

TEMPLATED = [(Collective.ALL_REDUCE, "ring"), (Collective.ALL_GATHER, "ring"),
             (Collective.REDUCE_SCATTER, "ring"), (Collective.ALL_GATHER, "direct"),
             (Collective.ALL_TO_ALL, "pairwise")]


def _sparse(call, nbytes):
    count = call.count(nbytes)
    return choice.sparse_plan(call.coll, call.algo, call.topo, call.options(nbytes), count,
                              call.itemsize, call.slice_bytes, call.rules.aware,
                              call.in_place, from_cells=0, share=1)


def _moving(res, cp):
    """(rank, channel, start, done) of every step that moves data, in step order."""
    return [(cp.step_rank[s], cp.step_chan[s], res.step_start[s], res.step_done[s])
            for s in range(cp.nsteps) if cp.step_slices[s]]


def _check(topo_name, nodes, coll, algo, nbytes, model, in_place, engine="reference"):
    topo = presets.get(topo_name, nodes)
    call = sim._call(coll, algo, topo, model, 4, 0, None, (), 64 << 10, in_place, None)
    plan = _sparse(call, nbytes)
    assert plan is not None, "no sparse plan"
    full = call.plan(nbytes, False, None, True, None, 0)
    ref, _ = dispatch.run(Job(full, topo, call.rules), "reference")
    got, name = dispatch.run(Job(plan, topo, call.rules), engine)
    a, b = ref.result, got.result
    assert (b.time_ns, b.rank_done, b.messages, b.bytes) == \
        (a.time_ns, a.rank_done, a.messages, a.bytes)
    assert _moving(b, plan.compiled) == _moving(a, full.compiled)
    if name == "reference":
        assert b.events == a.events
    assert plan.compiled.nsteps <= full.compiled.nsteps


@pytest.mark.parametrize("topo_name", ["dgx_a100", "dgx_a100_sharp", "dgx_h100",
                                       "dgx_h100_sharp"])
@pytest.mark.parametrize("nbytes", [8, 256])
def test_ring_all_reduce_on_the_dgx_presets(topo_name, nbytes):
    for model in (Aware(), Unaware()):
        for in_place in (False, True):
            _check(topo_name, 8, Collective.ALL_REDUCE, "ring", nbytes, model, in_place)


def test_every_channel_moving_on_a_dgx_preset():
    """5,000 B: every channel moves data, some blocks are empty."""
    _check("dgx_h100", 8, Collective.ALL_REDUCE, "ring", 5000, Aware(), False)


@pytest.mark.parametrize("coll,algo", TEMPLATED)
@pytest.mark.parametrize("topo_name,nodes", [("fat_tree2", 6), ("torus", 4)])
def test_every_template_on_small_topologies(coll, algo, topo_name, nodes):
    assert algo in algorithms(coll)
    for nbytes in (8, 3000):
        for model in (Aware(integer_ns=True), Unaware()):
            for in_place in (False, True):
                _check(topo_name, nodes, coll, algo, nbytes, model, in_place)


def test_the_dispatcher_engines_agree():
    """The engine the dispatcher picks for the sparse run (the compiled heap) too."""
    _check("dgx_h100", 8, Collective.ALL_REDUCE, "ring", 8, Aware(), False, None)


def test_moving_ranks_inverts_the_expression():
    """The ranks read off ``m·((r + a) mod M) + b`` at the chunks with data are those
    where evaluating the expression at every rank finds data."""
    rng = np.random.default_rng(5)
    n = 12
    for m, a, mod, b in [(1, 3, 12, 0), (1, -1, 12, 24), (2, 5, 6, 1), (3, 0, 0, 2),
                         (1, 7, 4, 8), (-1, 0, 12, 11)]:
        rg = rng.integers(0, 3, 40) * (rng.random(40) < 0.3)
        regs = {0: rg}
        got = sparse.moving_ranks(Ref(0, symbolic.Sym(m, a, mod, b)), regs, n)
        r = np.arange(n)
        idx = m * ((r + a) % mod) + b if mod else m * r + b
        assert got is not None
        assert got[0].tolist() == r[rg[idx] > 0].tolist()
        assert got[1].tolist() == rg[idx][rg[idx] > 0].tolist()
    assert sparse.moving_ranks(Ref(0, symbolic.Sym(1, 0, 12, 30)), {0: np.ones(40)}, n) \
        is None


def test_dense_runs_keep_their_plans():
    """A template where most steps move data is left to the batched engine, and a run
    below the size threshold never builds the sparse plan."""
    topo = presets.get("dgx_h100", 8)
    call = sim._call("all_reduce", "ring", topo, "aware", 4, 0, None, (), 1 << 20, False,
                     None)
    count = call.count(1 << 30)
    assert choice.sparse_plan(call.coll, "ring", topo, call.options(1 << 30), count, 4,
                              1 << 20, True, False, from_cells=0) is None
    assert choice.sparse_plan(call.coll, "ring", topo, call.options(8), call.count(8), 4,
                              1 << 20, True, False) is None


def test_the_alpha_beta_engine_agrees():
    """``model="fast"`` (the α-β longest path) on the sparse run gives its time on every
    rank's full Programs."""
    topo = presets.get("dgx_h100", 8)
    for nbytes in (8, 5000):
        call = sim._call("all_reduce", "ring", topo, "fast", 4, 0, None, (), 1 << 20, False,
                         None)
        plan = _sparse(call, nbytes)
        full = call.plan(nbytes, False, None, True, None, 0)
        a, na = dispatch.run(Job(full, topo, call.rules))
        b, nb = dispatch.run(Job(plan, topo, call.rules))
        assert na == nb == "alpha_beta"
        assert a.time_ns == b.time_ns
