"""Every engine against the reference engine (:mod:`ringtree.sim.engines.reference`), on
every registered schedule the simulator runs, several small topologies and sizes, both
aware models and the unaware one: an engine that accepts a case must give the
reference's answer exactly — the time, and where it keeps them every step's start and
done, every rank's finish, events, messages and bytes (:mod:`ringtree.sim.engines.contract`).

The array engines are tried on every run here, not only where the dispatcher would pick
them (ranks sending many messages at once): :data:`~.contract.MANY_MSGS_PER_RANK` is 0."""

from __future__ import annotations

import pytest

import ringtree.sim as sim
from ringtree.ir.program import Collective
from ringtree.schedules import algorithms
from ringtree.sim.engines import contract, dispatch, native
from ringtree.sim.engines.contract import Declined, Job, Outcome
from ringtree.sim.fold import choice
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Aware, Rules, Unaware

CASES = [("dgx_h100_sharp", 2), ("fat_tree2", 6), ("torus", 6), ("switch_sharp", 5),
         ("ring", 5), ("local", 4)]
SIZES = (8, 5000, 3 << 20)
SLICE = 256 << 10
COLLECTIVES = [c for c in Collective if c is not Collective.BARRIER]
MODELS = (Aware(), Aware(integer_ns=True), Unaware())


def key(r):
    """What a run that keeps every step's times must reproduce."""
    return r.time_ns, r.rank_done, r.step_start, r.step_done, r.events, r.messages, r.bytes


def schedules(topo, model):
    """Every collective × algorithm that runs on ``topo`` (CollNet needs a reduction
    switch) at each size: its call under ``model`` and every rank's compiled Programs."""
    for coll in COLLECTIVES:
        for algo in algorithms(coll):
            call = sim._call(coll, algo, topo, model, 4, 0, None, (), SLICE, False, None)
            for nbytes in SIZES:
                try:
                    full = call.plan(nbytes, False, None, True, None, 0)
                except ValueError:
                    break
                yield call, nbytes, full


def _job(call, plan, rules, nbytes) -> Job:
    def compile_():
        return choice.compile_plan(plan, call.coll, call.algo, call.topo,
                                   call.options(nbytes), call.count(nbytes), call.itemsize,
                                   call.slice_bytes, call.in_place)

    return Job(plan, call.topo, rules, compile=compile_)


def _run(engine, job):
    """The engine's outcome, or None where it declines (before or while running)."""
    if engine.accepts(job, job.rules) is not None:
        return None
    got = engine.run(job)
    assert isinstance(got, (Outcome, Declined))
    return got if isinstance(got, Outcome) else None


@pytest.mark.parametrize("topo_name,nodes", CASES)
def test_every_engine_is_the_reference(topo_name, nodes, monkeypatch):
    monkeypatch.setattr(contract, "MANY_MSGS_PER_RANK", 0)
    topo = presets.get(topo_name, nodes)
    ref = dispatch.engine("reference")
    ran: dict[str, int] = {e.name: 0 for e in dispatch.ORDER}
    for model in MODELS:
        rules = Rules.of(model, topo)
        for call, nbytes, full in schedules(topo, model):
            where = (call.coll.value, call.algo, nbytes)
            want = ref.run(_job(call, full, rules, nbytes)).result
            for e in dispatch.ORDER:
                if e.name in ("reference", "batched", "alpha_beta"):
                    continue
                got = _run(e, _job(call, full, rules, nbytes))
                if got is not None:
                    ran[e.name] += 1
                    assert key(got.result) == key(want), (e.name, model, *where)
            if not rules.aware:
                fast = Rules.of("fast", topo)
                got = _run(dispatch.engine("alpha_beta"), _job(call, full, fast, nbytes))
                assert got is not None and got.time_ns == want.time_ns, where
                ran["alpha_beta"] += 1
            # the batched engine on the folded template, against the reference on the
            # same folded Programs and on every rank's own
            folded = call.plan(nbytes, True, None, True, None, 0)
            if folded.batch is None:
                continue
            got = _run(dispatch.engine("batched"), _job(call, folded, rules, nbytes))
            if got is not None:
                ran["batched"] += 1
                same = ref.run(_job(call, folded, rules, nbytes))
                assert got.time_ns == same.time_ns == want.time_ns, (model, *where)
    assert ran["reference"] == 0 and ran["alpha_beta"] and ran["fixed_point"]
    assert ran["rounds"] and ran["batched"]
    assert ran["native"] or not native.enabled()


def test_the_dispatcher_names_the_engine_and_why_the_others_declined():
    topo = presets.get("dgx_h100_sharp", 2)
    run = sim.simulate("all_reduce", "tree", topo, 1 << 20)
    assert run.engine == ("native" if native.enabled() else "reference")
    assert dict(run.declined)["batched"] == "no shared template for this run"
    ring = sim.simulate("all_reduce", "ring", topo, 1 << 20)
    assert ring.engine == "batched" and ring.declined == ()
    fast = sim.simulate("all_reduce", "ring", topo, 1 << 20, model="fast", symmetry=False)
    assert fast.engine == "alpha_beta"
    forced = sim.simulate("all_reduce", "ring", topo, 1 << 20, engine="reference")
    assert forced.engine == "reference" and forced.time_ns == ring.time_ns
    with pytest.raises(dispatch.EngineDeclined, match="no shared template"):
        sim.simulate("all_reduce", "tree", topo, 1 << 20, engine="batched")
    with pytest.raises(ValueError, match="no simulator engine"):
        sim.simulate("all_reduce", "tree", topo, 1 << 20, engine="heap")


def test_the_engine_forced_by_the_environment(monkeypatch):
    topo = presets.get("dgx_h100_sharp", 2)
    monkeypatch.setenv("RINGTREE_SIM_ENGINE", "reference")
    run = sim.simulate("all_reduce", "ring", topo, 1 << 20)
    assert run.engine == "reference" and run.declined == ()
    monkeypatch.setenv("RINGTREE_SIM_ENGINE", "auto")
    assert sim.simulate("all_reduce", "ring", topo, 1 << 20).engine == "batched"


def test_a_decline_after_trying_is_kept_for_the_sweep(monkeypatch):
    """A sweep's sizes after one whose rounds left the heap's order skip the rounds: the
    same answers as each size alone (which tries them again)."""
    monkeypatch.setattr(contract, "MANY_MSGS_PER_RANK", 0)
    monkeypatch.setenv("RINGTREE_SIM_NATIVE", "0")       # the rounds before the heap
    topo = presets.get("dgx_h100", 2)
    sweep = sim.Sweep()
    for algo in ("direct2", "ring", "tree", "rabenseifner"):
        for nbytes in (1 << 20, 3 << 20, 8 << 20, 12 << 20):
            got = sim.simulate("all_reduce", algo, topo, nbytes, sweep=sweep, symmetry=False)
            want = sim.simulate("all_reduce", algo, topo, nbytes, symmetry=False)
            assert key(got.result) == key(want.result), (algo, nbytes)
    assert any(name == "rounds" for st in sweep.structures.values()
               for lay in st.layouts.values() for pr in lay.pairings.values()
               for (name, _) in pr.cp.declined)


def test_the_command_names_each_rows_engine(capsys):
    from ringtree.sim import cli

    argv = ["all_reduce", "-t", "dgx_h100_sharp", "-N", "2", "--algo", "ring,tree", "-b", "8",
            "-e", "64K", "-f", "8", "-j", "1"]
    assert cli.main([*argv, "-v"]) == 0
    out = capsys.readouterr()
    assert "# ring 8-32768 B: batched\n" in out.err
    assert "# tree 8-32768 B: " in out.err and "batched: no shared template" in out.err
    assert cli.main([*argv, "--engine", "reference"]) == 0
    assert capsys.readouterr().out == out.out          # the same table on the reference
    assert cli.main([*argv, "--engine", "batched"]) == 0
    assert "# tree: skipped (engine batched declines" in capsys.readouterr().out
