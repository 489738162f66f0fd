"""The network carried in rounds, link by link (:mod:`ringtree.sim.engines.rounds`), gives
exactly the event engine's times and events, and refuses rounds out of the heap's order."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ringtree.schedules import algorithms
from ringtree.sim import Aware, count_for, place, programs_for
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.engines import dispatch, fifo, rounds
from ringtree.sim.engines.contract import Job, Outcome
from ringtree.sim.fold.choice import Plan
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules

CASES = [("dgx_h100", 2), ("dgx_a100_sharp", 2), ("fat_tree2", 6), ("torus", 6),
         ("switch_sharp", 5), ("nvswitch", 8)]


def _both(topo, coll, algo, nbytes, model, monkeypatch):
    progs = programs_for(coll, algo, topo)
    devices = place(progs, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, nbytes, topo.nranks), 4,
                          1 << 20)
    seen = []
    carry = rounds.Rounds.carry

    def counted(self, *a):
        got = carry(self, *a)
        seen.append(got is not None)
        return got

    want = dispatch.run_compiled(cp, topo, devices, model, engine="reference")
    with monkeypatch.context() as m:
        m.setattr(rounds.Rounds, "carry", counted)
        # the rounds for every run here, whatever its messages a rank; a run they decline
        # goes on to the next engine (the reference's answer)
        got = rounds.RoundsEngine().run(Job(Plan(cp, devices), topo, Rules.of(model, topo)))
    return seen, got.result if isinstance(got, Outcome) else want, want


@pytest.mark.parametrize("topo_name,nodes", CASES)
def test_batched_network_is_the_event_engine(topo_name, nodes, monkeypatch):
    topo = presets.get(topo_name, nodes)
    outcomes = set()
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for algo in algorithms(coll):
            for nbytes in (8, 5000, 3 << 20):
                for model in (Aware(), Aware(integer_ns=True)):
                    try:
                        seen, a, b = _both(topo, coll, algo, nbytes, model, monkeypatch)
                    except ValueError:             # CollNet without a reduction switch
                        continue
                    if seen:
                        outcomes.add(seen[-1])
                    if algo == "direct" and coll != "broadcast":
                        assert seen in ([], [True]), (coll, nbytes)     # one round
                    assert (a.time_ns, a.rank_done, a.step_done, a.events) == \
                        (b.time_ns, b.rank_done, b.step_done, b.events), (coll, algo, nbytes)
    assert True in outcomes                # runs finished in rounds, and (DGX) refused
    assert False in outcomes or not topo_name.startswith("dgx")


def test_routes_that_cycle_run_on_the_heap(monkeypatch):
    """No link order: the held injections enter the heap, same answer."""
    assert fifo.link_order([[0, 1], [1, 0]], 2) is None
    assert fifo.link_order([[0, 1], [1, 2]], 3) == [0, 1, 2]
    topo = presets.get("dgx_h100", 2)
    want = _both(topo, "all_reduce", "direct", 3 << 20, Aware(), monkeypatch)[2]
    monkeypatch.setattr(fifo, "link_order", lambda routes, n: None)
    seen, got, _ = _both(topo, "all_reduce", "direct", 3 << 20, Aware(), monkeypatch)
    assert not seen
    assert (got.time_ns, got.rank_done, got.events) == (want.time_ns, want.rank_done,
                                                        want.events)


def _serve_one_by_one(arrive, ser, lat, integer, free=0.0):
    out = []
    for a, s in zip(arrive.tolist(), ser.tolist()):
        st = free
        if a > st:
            st = a
        free = st + s
        t = free + lat
        out.append(float(int(t)) if integer else t)
    return np.array(out), free


def test_serve_is_the_per_chunk_recurrence():
    """Busy periods, idle gaps, exact ties and a link still busy, bit for bit."""
    rng = random.Random(7)
    for trial in range(300):
        n = rng.choice([1, 2, 5, 63, 64, 65, 200, 1000])
        gaps = rng.random()
        a, t = [], 0.0
        for _ in range(n):
            t += rng.choice([0.0, 0.0, 0.1, 1 / 3, 7.0]) if rng.random() < gaps else 0.0
            a.append(t)
        ser = np.array([rng.choice([1 / 3, 0.1, 2.0, 1e-3]) for _ in range(n)])
        arrive = np.array(a)
        f0 = rng.choice([0.0, 0.0, 0.5, 50.0])           # the link busy from a round before
        for integer in (False, True):
            want, want_free = _serve_one_by_one(arrive, ser, 0.7, integer, f0)
            got, free = fifo.serve(arrive, ser, 0.7, integer, f0)
            assert np.array_equal(got, want), trial
            assert np.array_equal(fifo._windows(arrive, ser, 0.7, integer, f0)[0],
                                  want)
            assert free == want_free
