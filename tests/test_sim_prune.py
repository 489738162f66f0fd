"""Channels that move no data are left out of the compiled run, with exactly the same
times (:func:`ringtree.sim.compile.compiled.moving`)."""

from __future__ import annotations

import pytest

from ringtree.schedules import algorithms
from ringtree.sim import Aware, Unaware, count_for, place, programs_for
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.engines import alpha_beta, dispatch
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules

CASES = [("dgx_h100", 2), ("dgx_a100_sharp", 2), ("fat_tree2", 6), ("torus", 6),
         ("switch_sharp", 5)]


@pytest.mark.parametrize("topo_name,nodes", CASES)
def test_pruned_channels_change_no_time(topo_name, nodes):
    topo = presets.get(topo_name, nodes)
    pruned_some = 0
    for algo in algorithms("all_reduce"):
        try:
            progs = programs_for("all_reduce", algo, topo)
            devices = place(progs, topo)
        except ValueError:                      # CollNet without a reduction switch
            continue
        for nbytes in (8, 96, 4 << 10):
            count = count_for(progs[0].collective, nbytes, topo.nranks)
            full = compile_programs(progs, count, 4, 1 << 20, prune=False)
            cut = compile_programs(progs, count, 4, 1 << 20)
            pruned_some += cut.nsteps < full.nsteps
            assert cut.nmsgs == full.nmsgs and cut.declared == full.declared
            for model in (Aware(), Unaware()):
                a = dispatch.run_compiled(full, topo, devices, model)
                b = dispatch.run_compiled(cut, topo, devices, model)
                assert (a.time_ns, a.rank_done) == (b.time_ns, b.rank_done), (algo, nbytes)
            fast = Rules.of("fast", topo)
            assert alpha_beta.run(full, topo, devices, fast) == \
                alpha_beta.run(cut, topo, devices, fast)
    assert pruned_some


@pytest.mark.parametrize("topo_name,nodes", [("dgx_h100", 4), ("fat_tree2", 8), ("torus", 8)])
@pytest.mark.parametrize("model", ["aware", "unaware", "fast"])
def test_emptied_template_channels_change_no_time(topo_name, nodes, model):
    """The shared template leaves out channels that move no data on any rank too: the
    batched run gives the event engine's times (every rank's own Program)."""
    from ringtree.sim import simulate
    from ringtree.sim.compile import symbolic, template
    from ringtree.sim.fold.choice import options

    topo = presets.get(topo_name, nodes)
    t = symbolic.template("all_reduce", "ring", topo.nranks, options(topo))
    p0 = programs_for("all_reduce", "ring", topo)[0]
    assert template.moving(t, p0, 2, False)[0] is not t or topo.channels == 1
    for nbytes in (8, 200, 3 << 10, 1 << 20):
        a = simulate("all_reduce", "ring", topo, nbytes, model=model)
        b = simulate("all_reduce", "ring", topo, nbytes, model=model, symmetry=False)
        assert a.time_ns == b.time_ns, (nbytes, a.time_ns, b.time_ns)


@pytest.mark.parametrize("topo_name,nodes", [("dgx_h100", 2), ("fat_tree2", 6),
                                             ("switch_sharp", 5)])
def test_overlap_check_is_the_per_chunk_one(topo_name, nodes, monkeypatch):
    """The storage check of pruning (difference arrays over the chunks each channel
    names) answers what the per-chunk sets answer, for every schedule and collective."""
    from ringtree.sim.compile import compiled as sc

    monkeypatch.setattr(sc, "ARRAYS_FROM_CHUNKS", 0)       # the arrays for every buffer
    topo = presets.get(topo_name, nodes)
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        for algo in algorithms(coll):
            try:
                progs = programs_for(coll, algo, topo)[:topo.nranks]
            except ValueError:
                continue
            for nbytes in (8, 96, 1000, 4 << 10):
                lengths = sc.Lengths(topo.nranks, count_for(progs[0].collective, nbytes,
                                                              topo.nranks))
                for p in progs:
                    pre = lengths.of(p)
                    keep = [sc._moves(ch, pre) for ch in p.channels]
                    kept = [c for c, k in enumerate(keep) if k]
                    drop = [c for c, k in enumerate(keep) if not k]
                    if not kept or not drop:
                        continue
                    key = p.storage_map(False)
                    shared = sc._zero_keys(p, kept, pre, key, True)
                    want = bool(shared and shared & sc._zero_keys(p, drop, pre, key, False))
                    assert sc._overlap(p, kept, drop, pre, False) == want, (coll, algo, p.rank)


def test_a_channel_of_no_data_sharing_storage_is_kept(monkeypatch):
    """Channel 1 names only chunk 1, which holds no data, but channel 0 names it too:
    channel 1 must stay (it could be waited on), in the difference-array check as in
    the per-chunk one; a channel naming a chunk of its own is dropped."""
    from ringtree.ir.program import Collective, Program, copy, inp, out
    from ringtree.sim.compile import compiled as sc

    def prog(second):
        chans = ((copy(inp(0, 2), out(0, 2)),), (copy(inp(second), out(second)),))
        return Program(Collective.ALL_REDUCE, "test", 1, 0, 3, chans)

    monkeypatch.setattr(sc, "ARRAYS_FROM_CHUNKS", 0)
    pre = sc.Lengths(1, 1).of(prog(1))          # 1 element in 3 chunks: 1, 2 are empty
    assert sc._overlap(prog(1), [0], [1], pre, False)
    assert sc.moving(prog(1), pre, False) == (prog(1), [])
    assert not sc._overlap(prog(2), [0], [1], pre, False)
    assert sc.moving(prog(2), pre, False)[1] == [1]
