"""In rounds, the event engine processes a step's ready slices as arrays
(:func:`ringtree.sim.feedforward.slices_at_once`): the same times and events as slice by
slice, and as the event heap."""

from __future__ import annotations

import pytest

from ringtree.schedules import algorithms
from ringtree.sim import Aware, count_for, engine, feedforward, place, presets, programs_for
from ringtree.sim.compile import compile_programs

CASES = [("dgx_h100", 2), ("dgx_a100_sharp", 1), ("fat_tree2", 6), ("torus", 6),
         ("switch_sharp", 5)]


def _key(r):
    return r.time_ns, r.rank_done, r.step_done, r.events


@pytest.mark.parametrize("topo_name,nodes", CASES)
def test_slices_at_once_are_the_slices_one_by_one(topo_name, nodes, monkeypatch):
    topo = presets.get(topo_name, nodes)
    monkeypatch.setattr(engine, "ROUNDS_MSGS_PER_RANK", 0)       # rounds for every run
    monkeypatch.setattr(engine, "FIXED_POINT", False)
    at_once, rounds = feedforward.slices_at_once, engine._Engine.rounds
    seen = {"at_once": 0, "rounds": 0}

    def counted_at_once(*a):
        seen["at_once"] += 1
        return at_once(*a)

    def counted_rounds(self, *a):
        done = rounds(self, *a)
        seen["rounds"] += done is True and seen["at_once"] > 0
        return done

    monkeypatch.setattr(feedforward, "slices_at_once", counted_at_once)
    monkeypatch.setattr(engine._Engine, "rounds", counted_rounds)
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
                    heap = engine.run(cp, topo, devices, model, batch=False)
                    for least in (1, 3, 1 << 30):
                        monkeypatch.setattr(engine, "AT_ONCE", least)
                        got = engine.run(cp, topo, devices, model)
                        assert _key(got) == _key(heap), (coll, algo, nbytes, least)
    assert seen["rounds"]             # runs that finished in rounds, slices sent at once


def test_a_sweep_goes_to_the_heap_after_the_rounds_failed(monkeypatch):
    """Sizes after one whose rounds were out of order run on the heap at once: the same
    answers as each size alone (which tries the rounds again)."""
    from ringtree.sim import Sweep, simulate

    monkeypatch.setattr(engine, "ROUNDS_MSGS_PER_RANK", 0)
    monkeypatch.setattr(engine, "FIXED_POINT", False)
    topo = presets.get("dgx_h100", 2)
    sweep, failed = Sweep(), 0
    for algo in ("direct2", "ring", "tree", "rabenseifner"):
        for nbytes in (1 << 20, 3 << 20, 8 << 20, 12 << 20):
            got = simulate("all_reduce", algo, topo, nbytes, sweep=sweep, symmetry=False)
            want = simulate("all_reduce", algo, topo, nbytes, symmetry=False)
            assert _key(got.result) == _key(want.result), (algo, nbytes)
        failed += any(k[0] == "rounds failed" for st in sweep.structures.values()
                      for lay in st.layouts.values() for pr in lay.pairings.values()
                      for k in pr.cp.memo)
    assert failed
