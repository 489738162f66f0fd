"""The fixed point (:mod:`ringtree.sim.engines.fixed_point`) and the links it serves as
arrays (:mod:`ringtree.sim.engines.link_stages`): what does not settle goes on to the next
engine, and the array FIFOs are the per-chunk ones. Its answers against the reference
engine: ``tests/test_sim_conformance.py``."""

from __future__ import annotations

import numpy as np

import ringtree.sim as sim
from ringtree.schedules import algorithms
from ringtree.sim import Aware, count_for, place
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.engines import dispatch, fifo, fixed_point, link_stages, reference
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules

CASES = [("dgx_h100", 2), ("dgx_a100_sharp", 2), ("fat_tree2", 6), ("torus", 6),
         ("switch_sharp", 5), ("nvswitch", 8), ("ring", 5), ("local", 4)]


def _key(r):
    return r.time_ns, r.rank_done, r.step_start, r.step_done, r.events, r.messages, r.bytes


def every_schedule(topo, sizes=(8, 5000, 3 << 20)):
    """Every collective and algorithm that runs on ``topo``, compiled at each of
    ``sizes`` (4 slots, 256 KiB slices): (collective, algorithm, bytes, Compiled,
    devices)."""
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for algo in algorithms(coll):
            try:
                progs = sim.programs_for(coll, algo, topo)
                devices = place(progs, topo)
            except ValueError:                  # CollNet without a reduction switch
                continue
            for nbytes in sizes:
                cp = compile_programs(progs, count_for(progs[0].collective, nbytes,
                                                       topo.nranks), 4, 256 << 10)
                yield coll, algo, nbytes, cp, devices


def _settled(cp, topo, devices, model):
    return fixed_point.run(reference._Engine(cp, topo, devices, Rules.of(model, topo), False))


def test_what_does_not_settle_runs_on_the_heap(monkeypatch):
    """One pass is not a fixed point of a two-shot all-reduce; the heap answers, and a
    sweep does not try the fixed point again; routes that cycle are refused."""
    topo = presets.get("dgx_h100", 2)
    progs = sim.programs_for("all_reduce", "direct2", topo)
    devices = place(progs, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, 3 << 20, topo.nranks), 4)
    want = dispatch.run_compiled(cp, topo, devices, Aware(), engine="reference")
    monkeypatch.setattr(fixed_point, "MAX_ITERATIONS", 1)
    assert _settled(cp, topo, devices, Aware()) is None
    got = dispatch.run_compiled(cp, topo, devices, Aware())
    assert _key(got) == _key(want)
    assert ("fixed_point", Rules.of(Aware(), topo)) in cp.declined
    monkeypatch.setattr(fixed_point, "MAX_ITERATIONS", 12)
    cp.memo.clear()
    cp.declined.clear()
    monkeypatch.setattr(fifo, "link_order", lambda routes, n: None)
    assert _settled(cp, topo, devices, Aware()) is None
    assert _key(dispatch.run_compiled(cp, topo, devices, Aware())) == _key(want)


def test_direct_settles_in_one_carry(monkeypatch):
    """One-shot direct: no send waits on a receive, so the injections from the first
    arrivals are those it started from."""
    topo = presets.get("dgx_h100", 2)
    progs = sim.programs_for("all_reduce", "direct", topo)
    devices = place(progs, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, 5000, topo.nranks), 4)
    monkeypatch.setattr(fixed_point, "MAX_ITERATIONS", 1)
    got = _settled(cp, topo, devices, Aware())
    assert got is not None
    assert _key(got) == _key(dispatch.run_compiled(cp, topo, devices, Aware(), engine="reference"))


def test_links_served_together_are_each_link_served_alone():
    """Busy periods, idle gaps, ties, several links one after another, bit for bit."""
    import random

    import numpy as np

    rng = random.Random(11)
    for trial in range(200):
        parts, heads = [], []
        for _ in range(rng.choice([1, 2, 3, 7])):
            n = rng.choice([1, 2, 5, 64, 300])
            t, a = rng.choice([0.0, 5.0, 1e4]), []
            for _ in range(n):
                t += rng.choice([0.0, 0.0, 0.1, 1 / 3, 7.0, 400.0])
                a.append(t)
            ser = [rng.choice([1 / 3, 0.1, 2.0, 1e-3, 50.0]) for _ in range(n)]
            parts.append((np.array(a), np.array(ser), rng.choice([0.0, 0.7, 500.0])))
            heads += [True] + [False] * (n - 1)
        arrive = np.concatenate([p[0] for p in parts])
        ser = np.concatenate([p[1] for p in parts])
        lat = np.concatenate([np.full(p[0].size, p[2]) for p in parts])
        for integer in (False, True):
            each = [fifo.serve(a, s, lt, integer) for a, s, lt in parts]
            want = np.concatenate([out for out, _ in each])
            got = link_stages.serve_links(arrive, ser, lat, np.array(heads), integer)
            assert np.array_equal(got, want), trial
            alone = link_stages._one_by_one(arrive, ser, lat, np.array(heads), integer)
            assert np.array_equal(alone, want), trial
            for way in (link_stages.serve_links, link_stages._one_by_one):    # and when free again
                out, free = way(arrive, ser, lat, np.array(heads), integer, last=True)
                assert np.array_equal(out, want), trial
                assert free.tolist() == [f for _, f in each], trial


def test_a_busy_link_serves_as_one_whose_first_chunk_waits():
    """Rounds continue a link busy until free0 by lifting its first arrival to free0
    (:meth:`.feedforward.Rounds.carry`): the same times as serving from free0."""
    import random

    import numpy as np

    rng = random.Random(5)
    for trial in range(300):
        n = rng.choice([1, 2, 6, 80])
        a = np.cumsum([rng.choice([0.0, 0.1, 3.0, 90.0]) for _ in range(n)]) + \
            rng.choice([0.0, 2.5, 1e3])
        ser = np.array([rng.choice([1 / 3, 0.1, 2.0, 40.0]) for _ in range(n)])
        free0 = rng.choice([0.0, float(a[0]), float(a[0]) + 7.25, float(a[-1]) + 1.0])
        for integer in (False, True):
            out, free = fifo.serve(a, ser, 0.7, integer, free0)
            lifted = a.copy()
            lifted[0] = max(lifted[0], free0)
            got, end = link_stages.serve_links(lifted, ser, np.full(n, 0.7),
                                          np.eye(1, n, dtype=bool)[0], integer, last=True)
            assert np.array_equal(got, out) and end.tolist() == [free], trial


def test_links_sorted_as_rows_is_the_lexsort():
    """:func:`ringtree.sim.engines.link_stages.by_link` with every link as many chunks (a matrix
    sorted row by row) is ``np.lexsort((x, seg))``: the same permutation, ties (many,
    here) in place; with unequal links it is the lexsort itself; and the stages of
    ``direct2`` on a DGX node, whose links carry as many chunks, are marked for it."""
    rng = np.random.default_rng(3)
    for links, per in ((64, 896), (1, 5), (7, 1), (3, 1000)):
        seg = np.repeat(np.arange(links), per)
        for x in (rng.integers(0, 20, seg.size).astype(np.float64),     # many ties
                  rng.random(seg.size), np.zeros(seg.size),
                  np.arange(seg.size, 0, -1, dtype=np.float64)):
            assert np.array_equal(link_stages.by_link(x, per), np.lexsort((x, seg)))
    seg = np.repeat(np.arange(3), [4, 1, 6])
    x = rng.integers(0, 3, seg.size).astype(np.float64)
    assert np.array_equal(link_stages.by_link(x, seg), np.lexsort((x, seg)))
    # direct2 on one DGX node: every NVLink link carries as many chunks
    marks = [st[3] for st in _link_stages("direct2", 1, 1 << 16)[0][0]]
    assert marks and all(isinstance(m, int) for m in marks)


def _link_stages(algo: str, nodes: int, nbytes: int):
    """The link stages of an all-reduce on dgx_h100 (:func:`link_stages.link_stages`) and
    its number of chunks."""
    topo = presets.get("dgx_h100", nodes)
    progs = sim.programs_for("all_reduce", algo, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, nbytes, topo.nranks), 4)
    eng = reference._Engine(cp, topo, place(progs, topo), Rules.of(Aware(), topo), False)
    conn = np.asarray(cp.msg_conn, np.int64)
    first = np.concatenate(([0], np.cumsum([len(cp.step_slices[s]) for s in cp.msg_sstep])))
    return link_stages.link_stages(eng, conn, first), int(first[-1])


def test_chunks_of_one_size_serve_in_the_times_gathered():
    """A network whose chunks all have one size writes every stage's service time out
    once (:class:`ringtree.sim.engines.link_stages.Network`): the times the gather and division
    give, bit for bit; chunks of two sizes, and a rate per chunk, keep the gather."""
    got, n = _link_stages("direct", 2, 3 << 20)
    rates = [st[1] for st in got[0]]
    for sizes in (np.full(n, 3.0 * (1 << 18)), np.full(n, 1e-3 / 7),
                  np.where(np.arange(n) % 3, 5.0, 7.0)):
        net = link_stages.Network(got, sizes.copy())
        for (idx, rate, *_), (_, ser, const, *_) in zip(got[0], net.stages):
            # one time for every chunk: read from the start, as long as a stage or link
            want = sizes[idx] / rate
            assert np.array_equal(ser, want[:ser.size] if const else want)
            assert const == (float(sizes.min()) == float(sizes.max()))
    # a stage of links of different rates: a rate per chunk, gathered
    first_stage = list(got[0][0])
    first_stage[1] = np.linspace(1.0, 3.0, first_stage[0].size)
    net = link_stages.Network(([tuple(first_stage)], got[1], got[2]), np.full(n, 11.0))
    assert np.array_equal(net.stages[0][1], 11.0 / first_stage[1])
    assert all(isinstance(r, float) for r in rates)
