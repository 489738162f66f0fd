"""The simulator's work limit, and the cheap proof that a run cannot fold."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective
from ringtree.runtime.plan import compile_program
from ringtree.schedules import algorithms
from ringtree.sim import budget, count_for, place, programs_for, simulate
from ringtree.sim.cli import main as sim_main
from ringtree.sim.compile.compiled import Lengths, moving
from ringtree.sim.fold import choice, symmetry
from ringtree.sim.machine import presets

PRESETS = [("dgx_h100", 4), ("dgx_a100_sharp", 2), ("fat_tree2", 16), ("torus", 16),
           ("switch", 6), ("fat_tree3", 64)]


@pytest.mark.parametrize("name,nodes", PRESETS)
def test_no_fold_bound_only_when_period_finds_nothing(name, nodes):
    """Where :func:`symmetry.fold_bound` says no fold exists, the full proof agrees."""
    topo = presets.get(name, nodes)
    opts = choice.options(topo)
    said = folded = 0
    for coll in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        for algo in algorithms(coll):
            try:
                progs = choice.Lazy(coll, algo, topo.nranks, opts)
                devices = place(progs, topo)
            except ValueError:                   # CollNet without a reduction switch,
                continue                         # NVLS all-gather across nodes
            for nbytes in (8, 3 << 20):
                count = count_for(coll, nbytes, topo.nranks)
                for aware in (True, False):
                    g = symmetry.period(progs, topo, devices, count, aware)
                    no = not symmetry.fold_bound(progs, topo, devices, count, aware)
                    assert not (no and g), (coll, algo, nbytes, aware, g)
                    said += no
                    folded += g > 0
    assert said                                  # the shortcut is taken somewhere
    assert folded or name in ("switch", "torus")  # one node / no node blocks


def test_over_the_limit_is_refused_before_simulating():
    topo = presets.get("dgx_h100", 2)
    r = simulate("all_reduce", "direct", topo, 1 << 24)
    with pytest.raises(budget.TooLarge, match="steps and slices"):
        simulate("all_reduce", "direct", topo, 1 << 24, max_work=r.events // 4)
    again = simulate("all_reduce", "direct", topo, 1 << 24, max_work=0)
    assert again.time_ns == r.time_ns


def test_cli_says_an_algorithm_is_too_large(capsys):
    assert sim_main(["all_reduce", "-t", "dgx_h100", "-N", "2", "--algo", "direct,ring",
                     "-b", "1M", "-e", "4M", "--max-work", "2000"]) == 0
    out = capsys.readouterr().out
    assert "# direct: skipped (about" in out and "--max-work" in out
    assert "# algo: ring" in out


def test_work_counts_what_the_compiler_makes():
    """Rank 0's steps plus slices sent, counted from chunk lengths, are those of the
    compiled Program, channels that move no data left out, at every size."""
    topo = presets.get("dgx_h100_sharp", 2)
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for algo in algorithms(coll):
            try:
                p = programs_for(coll, algo, topo)[0]
            except ValueError:                   # NVLS all-gather across nodes
                continue
            ib, ob = p.collective.blocks(p.nranks)
            for nbytes in (8, 100, 4096, 3 << 20, 1 << 30):
                count = count_for(p.collective, nbytes, topo.nranks)
                for in_place in (False, True):
                    pruned, _ = moving(p, Lengths(p.nranks, count).of(p), in_place)
                    steps = compile_program(pruned, [count] * ib, [count] * ob, count, 4,
                                            1 << 20, in_place)
                    want = sum(1 + len(cs.slices) * len(cs.step.send_to)
                               for ch in steps for cs in ch)
                    assert budget.work(p, count, 4, 1 << 20, in_place) == want, (algo, nbytes)
