"""The shortcuts that make an 8-node sweep fast give the full path's answer bit for bit:
busy periods summed head-first (:func:`ringtree.sim.engines.fifo._periods`), layouts
with channels emptied read off the full layout (:func:`ringtree.sim.compile.structure.restrict`,
and where it must refuse), the fixed point's shape kept across sizes and its start
extrapolated from the sizes before (:mod:`ringtree.sim.engines.fixed_point`)."""

from __future__ import annotations

import numpy as np
import pytest

import ringtree.sim as sim
from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, copy, inp, out, scr
from ringtree.sim import Aware, Sweep, count_for, place
from ringtree.sim.compile.compiled import Lengths, compile_programs, moving
from ringtree.sim.compile.structure import Structure, restrict
from ringtree.sim.engines import dispatch, fifo, fixed_point, link_stages, reference
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules


def _periods_by_hand(arrive, ser, starts, free0):
    free, prev = np.empty(arrive.size), free0
    for k in range(arrive.size):
        t = max(arrive[k], prev) if k == 0 else (arrive[k] if starts[k] else prev)
        prev = free[k] = t + ser[k]
    return free


@pytest.mark.parametrize("rows", [0, 64])
def test_busy_periods_are_the_left_to_right_sums(rows, monkeypatch):
    """Every path (the heads across periods, few long periods one by one, many as rows)
    adds a period's services left to right from its start, as the engine does."""
    monkeypatch.setattr(fifo, "PERIOD_ROWS", rows)
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 400))
        arrive = np.sort(rng.random(n) * n * rng.choice([0.1, 1.0, 10.0]))
        ser = rng.random(n) * rng.choice([1e-3, 1.0, 1e3])
        starts = rng.random(n) < rng.choice([0.005, 0.1, 0.5, 1.0])
        starts[0] = True
        free0 = float(rng.choice([0.0, arrive[0] + 3.0]))
        got = fifo._periods(arrive, ser, starts, free0)
        assert np.array_equal(got, _periods_by_hand(arrive, ser, starts, free0))


def _fields(lay):
    return (lay.step_rank, lay.step_chan, lay.step_prev, lay.step_deps, lay.step_ops,
            lay.step_name, lay.send_to, lay.recv_from, lay.lo, lay.hi)


@pytest.mark.parametrize("algo,nbytes", [("direct2", 8), ("direct2", 256), ("direct", 16),
                                         ("ring", 8), ("tree", 24)])
def test_emptied_layouts_are_read_off_the_full_one(algo, nbytes):
    topo = presets.get("dgx_h100", 2)
    progs = sim.programs_for("all_reduce", algo, topo)
    st = Structure(progs)
    count = count_for(Collective.ALL_REDUCE, nbytes, topo.nranks)
    lengths = Lengths(st.n, count)
    _, base = st._prefix(lengths)
    pruned = [moving(p, lengths.of(p), False) for p in progs]
    drops = [tuple(d) for _, d in pruned]
    assert any(drops), "the case must empty some channel"
    want = st._layout([q for q, _ in pruned], base, count, 4, 1 << 20)
    full = st._layout(progs, base, count, 4, 1 << 20)
    got = restrict(full, drops)
    assert got is not None
    assert _fields(got) == _fields(want)


def test_restrict_refuses_a_kept_step_that_waits_on_a_dropped_one():
    """Channel 1 reads what channel 0 wrote: emptying channel 0 would change channel
    1's dependencies, so the layout is not read off the full one."""
    chans = ((copy(inp(0), scr(0)),), (copy(scr(0), out(0)), ir.send(1, out(0))))
    progs = [Program(Collective.ALL_REDUCE, "hand", 2, r, 1, chans if r == 0 else
                     ((), (ir.recv(0, out(0)),)), scratch=1) for r in range(2)]
    st = Structure(progs)
    lengths = Lengths(2, 4)
    _, base = st._prefix(lengths)
    full = st._layout(progs, base, 4, 4, 1 << 20)
    assert full.step_deps[1] == (0,)
    assert restrict(full, [(0,), ()]) is None
    assert restrict(full, [(), ()]) is not None


def _key(r):
    return (r.time_ns, r.rank_done, r.step_start, r.step_done, r.events, r.messages,
            r.bytes)


def test_a_sweep_of_one_shape_settles_from_its_extrapolated_start(monkeypatch):
    """Sizes that slice alike share a shape; from the third on the fixed point starts
    from the last two sizes' arrivals: the heap's answer, bit for bit, whether that
    start settles, fails or is replaced by noise (any start settles on the one point)."""
    topo = presets.get("dgx_h100", 2)
    progs = sim.programs_for("all_reduce", "direct2", topo)
    devices = place(progs, topo)
    sizes = [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10]
    plain = fixed_point._settle
    guessed = []

    def spy(eng, lv, sz, net, arrive, tries, progress):
        got = plain(eng, lv, sz, net, arrive, tries, progress)
        if tries == fixed_point.GUESSED_ITERATIONS:
            guessed.append(got is not None)
        return got

    monkeypatch.setattr(fixed_point, "_settle", spy)
    for guess in (4, 0):                         # a start that settles; one that fails
        monkeypatch.setattr(fixed_point, "GUESSED_ITERATIONS", guess)
        sweep, shapes = Sweep(), set()
        for nbytes in sizes:
            r = sim.simulate("all_reduce", "direct2", topo, nbytes, sweep=sweep)
            cp = compile_programs(progs, count_for(Collective.ALL_REDUCE, nbytes,
                                                   topo.nranks), 4)
            want = dispatch.run_compiled(cp, topo, devices, Aware(), engine="reference")
            assert _key(r.result) == _key(want), (guess, nbytes)
            shapes |= {id(s.memo.get("shape")) for s in _pairings(sweep)}
        assert len(shapes) == 1
    assert guessed[:3] == [True] * 3 and guessed[3:] == [False] * 3
    # a start of noise
    cp = compile_programs(progs, count_for(Collective.ALL_REDUCE, 3 << 20, topo.nranks), 4)
    want = dispatch.run_compiled(cp, topo, devices, Aware(), engine="reference")
    eng = reference._Engine(cp, topo, devices, Rules.of(Aware(), topo), False, fresh=False)
    lv = fixed_point.Levels(cp)
    tuples = fixed_point._tuples(cp.step_slices)
    sz = fixed_point._Size(eng, lv, fixed_point._Shape(eng, lv, tuples[2][tuples[0]]), tuples)
    noise = np.random.default_rng(3).random(sz.nchunks) * want.time_ns
    got = plain(eng, lv, sz, link_stages.Network(sz.shape.stages, sz.sizes), noise, 30, None)
    assert got is not None and _key(got[0]) == _key(want)


def _pairings(sweep):
    return [pr.cp for st in sweep.structures.values() for lay in st.layouts.values()
            for pr in lay.pairings.values()]


def test_chunk_bytes_by_blocks_and_one_by_one(monkeypatch):
    topo = presets.get("fat_tree2", 4)
    progs = sim.programs_for("all_reduce", "direct2", topo)
    cp = compile_programs(progs, 1001, 4, 512)
    eng = reference._Engine(cp, topo, place(progs, topo), Rules.of(Aware(), topo), False, fresh=False)
    lv = fixed_point.Levels(cp)
    shape = fixed_point._Shape(eng, lv, np.fromiter(map(len, cp.step_slices), np.int64))
    want = np.asarray([b for s in cp.msg_sstep for b in cp.step_slices[s]], np.float64)
    tuples = fixed_point._tuples(cp.step_slices)
    assert np.array_equal(fixed_point._chunk_bytes(tuples, shape), want)
    monkeypatch.setattr(fixed_point, "CHUNK_RUNS", 0)
    assert np.array_equal(fixed_point._chunk_bytes(tuples, shape), want)


@pytest.mark.parametrize("algo", ["direct", "direct2", "ring", "tree", "rabenseifner"])
def test_the_channels_emptied_are_those_moving_empties(algo):
    topo = presets.get("dgx_h100", 2)
    progs = sim.programs_for("all_reduce", algo, topo)
    st = Structure(progs)
    for nbytes in (8, 24, 256, 1000, 4096):
        count = count_for(Collective.ALL_REDUCE, nbytes, topo.nranks)
        lengths = Lengths(st.n, count)
        pre, base = st._prefix(lengths)
        full = st._layout(progs, base, count, 4, 1 << 20)
        want = [tuple(moving(p, lengths.of(p), False)[1]) for p in progs]
        assert st._drops(full, pre) == want, (algo, nbytes)


def test_a_channel_naming_a_kept_empty_chunk_is_kept():
    """Channel 1 moves no data but names the empty chunk channel 0 names too: neither
    :func:`moving` nor the sweep empties it."""
    chans = ((copy(inp(0), out(0)), copy(inp(1), scr(1))), (copy(inp(1), out(1)),))
    progs = [Program(Collective.ALL_REDUCE, "hand", 2, r, 2, chans, scratch=2)
             for r in range(2)]
    st = Structure(progs)
    lengths = Lengths(2, 1)                     # chunk 0: one element, chunk 1: none
    pre, base = st._prefix(lengths)
    full = st._layout(progs, base, 1, 4, 1 << 20)
    assert [moving(p, lengths.of(p), False)[1] for p in progs] == [[], []]
    assert st._drops(full, pre) == [(), ()]
    alone = [Program(Collective.ALL_REDUCE, "hand", 2, r, 2, (chans[0][:1], chans[1]),
                     scratch=2) for r in range(2)]
    st = Structure(alone)
    full = st._layout(alone, base, 1, 4, 1 << 20)
    assert st._drops(full, pre) == [(1,), (1,)] == \
        [tuple(moving(p, lengths.of(p), False)[1]) for p in alone]
