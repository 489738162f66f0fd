"""In rounds, the event engine processes a step's ready slices as arrays
(:func:`ringtree.sim.engines.rounds.slices_at_once`): the same times and events as slice by
slice, and as the event heap."""

from __future__ import annotations

import pytest

from ringtree.schedules import algorithms
from ringtree.sim import Aware, count_for, place, programs_for
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.engines import dispatch, rounds
from ringtree.sim.engines.contract import Job, Outcome
from ringtree.sim.fold.choice import Plan
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules

CASES = [("dgx_h100", 2), ("dgx_a100_sharp", 1), ("fat_tree2", 6), ("torus", 6),
         ("switch_sharp", 5)]


def _key(r):
    return r.time_ns, r.rank_done, r.step_done, r.events


@pytest.mark.parametrize("topo_name,nodes", CASES)
def test_slices_at_once_are_the_slices_one_by_one(topo_name, nodes, monkeypatch):
    topo = presets.get(topo_name, nodes)
    at_once, carry = rounds.slices_at_once, rounds.carry
    seen = {"at_once": 0, "rounds": 0}

    def counted_at_once(*a):
        seen["at_once"] += 1
        return at_once(*a)

    def counted_carry(eng, *a):
        done = carry(eng, *a)
        seen["rounds"] += done is True and seen["at_once"] > 0
        return done

    monkeypatch.setattr(rounds, "slices_at_once", counted_at_once)
    monkeypatch.setattr(rounds, "carry", counted_carry)
    engine = rounds.RoundsEngine()
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for algo in algorithms(coll):
            try:
                progs = programs_for(coll, algo, topo)
                devices = place(progs, topo)
            except ValueError:                  # CollNet without a reduction switch
                continue
            for nbytes in (5000, 3 << 20):
                count = count_for(progs[0].collective, nbytes, topo.nranks)
                cp = compile_programs(progs, count, 4, 16 << 10)
                for model in (Aware(), Aware(integer_ns=True)):
                    heap = dispatch.run_compiled(cp, topo, devices, model, engine="reference")
                    for least in (1, 3, 1 << 30):
                        monkeypatch.setattr(rounds, "AT_ONCE", least)
                        # rounds for every run, whatever its messages a rank
                        got = engine.run(Job(Plan(cp, devices), topo, Rules.of(model, topo)))
                        if isinstance(got, Outcome):
                            assert _key(got.result) == _key(heap), (coll, algo, nbytes, least)
    assert seen["rounds"]             # runs that finished in rounds, slices sent at once
