"""A pipelined hierarchical all-reduce compiled per shape of Program: its generator shares
its references (:func:`ringtree.schedules.hierarchical._ref`), so the chain ranks of one
node compile once (:func:`ringtree.sim.compile.compiled.shape`), and what is compiled and
simulated is what every rank compiled alone gives, and the reference engine's answer, bit
for bit."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from ringtree.sim import count_for, place, programs_for, simulate, simulate_sizes
from ringtree.sim.compile.compiled import Compiled, compile_programs, shape
from ringtree.sim.compile.structure import Sweep
from ringtree.sim.machine import presets

MiB = 1 << 20
FIELDS = [f.name for f in dataclasses.fields(Compiled) if f.name not in ("memo", "declined")]


@pytest.mark.parametrize("nbytes,pieces", [(4 * MiB, 1), (16 * MiB, 2), (32 * MiB, 4)])
def test_chain_ranks_of_a_node_share_a_shape_and_compile_alike(nbytes, pieces):
    topo = presets.get("dgx_h100", 4)
    progs = programs_for("all_reduce", "hierarchical", topo, nbytes=nbytes)
    assert progs[0].chunks == 4 * topo.channels * pieces      # 4 leaders' ring, P pieces
    place(progs, topo)
    m = topo.nranks // 4
    shapes = {shape(p, -1) for p in progs}
    # per node: the leader, the middle of the chain (one shape), the last
    assert len(shapes) <= 3 * 4 < topo.nranks
    assert len({shape(p, -1) for p in progs[1:m - 1]}) == 1
    alone = [copy.deepcopy(p) for p in progs]
    count = count_for(progs[0].collective, nbytes, topo.nranks)
    want = compile_programs(alone, count, 4, 1 << 20)
    got = compile_programs(progs, count, 4, 1 << 20)
    for name in FIELDS:
        assert getattr(got, name) == getattr(want, name), name


def test_pipelined_sweep_is_the_reference_engines_bit_for_bit():
    topo = presets.get("dgx_h100_sharp", 4)
    sizes = [32 * MiB, 16 * MiB, 4 * MiB, 64 << 10]
    runs = simulate_sizes("all_reduce", "hierarchical", topo, sizes, sweep=Sweep())
    for nbytes, run in zip(sizes, runs):
        ref = simulate("all_reduce", "hierarchical", topo, nbytes, engine="reference",
                       symmetry=False, max_work=0)
        assert run.time_ns == ref.time_ns, nbytes
        assert run.result is None or run.result.rank_done[:run.simulated] == \
            ref.result.rank_done[:run.simulated]
