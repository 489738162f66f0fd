"""A sweep compiles the Programs' structure once (:mod:`ringtree.sim.compile.structure`): every
size then gives the uncached compiler's run field by field, and the same tables."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from ringtree.schedules import algorithms
from ringtree.sim import Sweep, count_for, place, programs_for, simulate
from ringtree.sim.compile import pairing
from ringtree.sim.compile.compiled import Compiled, compile_programs, folded_sender, pair
from ringtree.sim.compile.structure import Structure
from ringtree.sim.machine import presets

SIZES = [8, 24, 96, 1000, 4 << 10, 3 << 20, 40 << 20]
FIELDS = [f.name for f in dataclasses.fields(Compiled) if f.name != "memo"]


def _same(st: Structure, progs, count: int, itemsize: int, slice_bytes: int, **kw) -> None:
    try:
        want = compile_programs(progs, count, itemsize, slice_bytes, **kw)
    except ValueError as e:                     # the same error, from the same compiler
        with pytest.raises(ValueError, match=re.escape(str(e))):
            st.compile(count, itemsize, slice_bytes)
        return
    got = st.compile(count, itemsize, slice_bytes)
    for name in FIELDS:
        assert getattr(got, name) == getattr(want, name), name


EVERY = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


@pytest.mark.parametrize("topo_name,nodes,in_place,colls", [
    ("dgx_h100", 2, False, ("all_reduce",)), ("dgx_a100_sharp", 2, True, ("all_reduce",)),
    ("fat_tree2", 5, False, EVERY), ("switch_sharp", 6, True, EVERY),
    ("torus", 6, False, EVERY)])
def test_structure_compiles_what_the_compiler_does(topo_name, nodes, in_place, colls):
    topo = presets.get(topo_name, nodes)
    for coll in colls:
        for algo in algorithms(coll):
            try:
                progs = programs_for(coll, algo, topo)
                place(progs, topo)
            except ValueError:                  # CollNet without a reduction switch
                continue
            for shares in (False, True):
                st = Structure(progs, in_place, 0, True, shares)
                for nbytes in SIZES[::-1] + SIZES:     # every size twice, both orders
                    count = count_for(progs[0].collective, nbytes, topo.nranks)
                    _same(st, progs, count, 4, 1 << 20, in_place=in_place, shares=shares)
            assert len(st.layouts) >= 1


@pytest.mark.parametrize("topo_name,nodes", [("dgx_h100", 2), ("fat_tree2", 5)])
def test_a_large_structure_lays_out_only_the_channels_kept(topo_name, nodes):
    """Past ``full_steps`` a size's pruned channels are never laid out (compiled from
    the emptied Programs, the full layout only when a size keeps every channel): the
    same run, field by field, in either order of sizes."""
    topo = presets.get(topo_name, nodes)
    for algo in algorithms("all_reduce"):
        try:
            progs = programs_for("all_reduce", algo, topo)
            place(progs, topo)
        except ValueError:                      # CollNet without a reduction switch
            continue
        for sizes in ([8, 96, 3 << 20], [3 << 20, 8, 96]):
            st = Structure(progs, full_steps=0)
            for nbytes in sizes:
                count = count_for(progs[0].collective, nbytes, topo.nranks)
                _same(st, progs, count, 4, 1 << 20)


@pytest.mark.parametrize("topo_name,nodes,algo,g", [
    ("torus", 8, "hierarchical", 4), ("torus", 8, "recursive_doubling", 4),
    ("dgx_a100", 4, "rabenseifner", 16)])
def test_structure_of_a_folded_run(topo_name, nodes, algo, g):
    topo = presets.get(topo_name, nodes)
    progs = programs_for("all_reduce", algo, topo)
    st = Structure(progs[:g], fold=g)
    for nbytes in SIZES:
        count = count_for(progs[0].collective, nbytes, topo.nranks)
        _same(st, progs[:g], count, 2, 1 << 16, fold=g)


@pytest.mark.parametrize("topo_name,nodes,model", [
    ("dgx_h100_sharp", 1, "aware"), ("fat_tree2", 8, "unaware"), ("switch_sharp", 5, "fast"),
    ("torus", 6, "aware")])
def test_a_sweep_gives_the_same_results(topo_name, nodes, model):
    topo = presets.get(topo_name, nodes)
    for algo in algorithms("all_reduce"):
        sweep = Sweep()
        for nbytes in SIZES:
            try:
                want = simulate("all_reduce", algo, topo, nbytes, model=model)
            except ValueError:
                break
            got = simulate("all_reduce", algo, topo, nbytes, model=model, sweep=sweep)
            assert (got.time_ns, got.events, got.simulated) == \
                (want.time_ns, want.events, want.simulated), (algo, nbytes)
            if got.result is not None:
                assert got.result.rank_done == want.result.rank_done
                assert got.result.step_done == want.result.step_done


def test_a_sweep_compiles_big_runs_per_size():
    topo = presets.get("fat_tree2", 8)
    sweep = Sweep(max_steps=10)
    a = simulate("all_reduce", "tree", topo, 1 << 20, sweep=sweep)
    assert not sweep.structures
    assert a.time_ns == simulate("all_reduce", "tree", topo, 1 << 20).time_ns


@pytest.mark.parametrize("argv", [
    ["all_reduce", "-t", "fat_tree2", "-N", "8", "-b", "8", "-e", "16M", "-f", "8"],
    ["all_gather", "-t", "dgx_h100", "-N", "1", "-b", "8", "-e", "64M", "-f", "16",
     "--model", "unaware"],
    ["all_reduce", "-t", "switch_sharp", "-N", "6", "-b", "8", "-e", "4M", "-f", "8",
     "--algo", "collnet_direct,direct,direct2,tree"]])
def test_the_cli_table_is_the_one_compiled_per_size(argv, capsys, monkeypatch):
    from ringtree.sim import cli

    assert cli.main(argv) == 0
    swept = capsys.readouterr().out
    monkeypatch.setattr(cli, "Sweep", lambda: Sweep(max_steps=0))
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == swept


def _paired_by_dicts(st: Structure, lay, mask):
    """The messages as the compiler pairs them (:func:`ringtree.sim.compile.compiled.pair`, one
    dict of lists per connection), or None where it refuses."""
    sends, recvs, first = {}, {}, {}
    for gid, rank in enumerate(lay.step_rank):      # first sends, empty steps included
        for pos, q in enumerate(lay.send_to[gid]):
            first.setdefault((rank, q, lay.step_chan[gid]), (gid, pos))
    send_ids = [[] for _ in lay.step_rank]
    recv_ids = [[] for _ in lay.step_rank]
    for gid in np.flatnonzero(mask).tolist():
        rank, c = lay.step_rank[gid], lay.step_chan[gid]
        for pos, q in enumerate(lay.send_to[gid]):
            sends.setdefault((rank, q, c), []).append((gid, pos))
        for pos, q in enumerate(lay.recv_from[gid]):
            a, b = folded_sender(q, rank, st.fold, st.n, st.xor) if st.fold else (q, rank)
            recvs.setdefault((a, b, c), []).append((gid, pos))
        send_ids[gid] = [0] * len(lay.send_to[gid])
        recv_ids[gid] = [0] * len(lay.recv_from[gid])
    cp = Compiled(st.n)
    try:
        pair(cp, sends, recvs, send_ids, recv_ids, None, first.get)
    except ValueError:
        return None
    return cp


MSG_FIELDS = ["conns", "conn_ranks", "msg_src", "msg_dst", "msg_chan", "msg_conn",
              "msg_sstep", "msg_rstep", "step_send", "step_recv"]


@pytest.mark.parametrize("topo_name,nodes,algo,fold,xor", [
    ("dgx_h100", 2, "direct2", 0, False), ("dgx_h100", 1, "tree", 0, False),
    ("fat_tree2", 6, "hierarchical", 0, False), ("torus", 8, "hierarchical", 4, False),
    ("dgx_a100", 4, "rabenseifner", 16, True), ("torus", 8, "recursive_doubling", 4, True)])
def test_messages_paired_as_arrays_are_the_compilers(topo_name, nodes, algo, fold, xor):
    """:func:`ringtree.sim.compile.pairing.pair` against the compiler's pairing, field by field,
    on every step, on the steps of each channel (what a small size keeps), on random
    subsets (most of which leave a connection with more sends than receives: both
    refuse), and on none."""
    topo = presets.get(topo_name, nodes)
    progs = programs_for("all_reduce", algo, topo)
    if fold:
        progs = progs[:fold]
    st = Structure(progs, fold=fold, xor=xor)
    st.compile(count_for(progs[0].collective, 1 << 20, topo.nranks), 4, 1 << 18)
    lay = next(iter(st.layouts.values()))
    n = len(lay.step_rank)
    chan = np.asarray(lay.step_chan)
    rng = np.random.default_rng(7)
    masks = [np.ones(n, bool), np.zeros(n, bool)]
    masks += [chan == c for c in range(int(chan.max()) + 1)]
    masks += [rng.random(n) < p for p in (0.02, 0.5, 0.98)]
    refused = paired = 0
    for mask in masks:
        want = _paired_by_dicts(st, lay, mask)
        got = Compiled(st.n)
        ends = pairing.Ends(lay.step_rank, lay.step_chan, lay.send_to, lay.recv_from,
                            fold, st.n, xor)
        ok = pairing.pair(got, ends, mask)
        assert ok == (want is not None)
        if want is None:
            assert got.conns == [] and got.msg_src == []       # untouched
            refused += 1
            continue
        paired += 1
        for name in MSG_FIELDS:
            assert getattr(got, name) == getattr(want, name), name
    assert paired >= 3 and refused >= 1
