"""A sweep's sizes stacked into one batched run (:func:`ringtree.sim.simulate_sizes`,
:func:`ringtree.sim.compile.template.stacked`): every size's answer is :func:`simulate`'s, bit
for bit, also when some copies break the batch's order and go to the event engine."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective
from ringtree.schedules import algorithms
from ringtree.sim import Sweep, place, simulate, simulate_sizes
from ringtree.sim.compile import template
from ringtree.sim.engines import batched
from ringtree.sim.fold import choice
from ringtree.sim.machine import presets

SWEEP = [8 << i for i in range(0, 24, 3)] + [3 << 20, 24 << 20]


def _key(r) -> tuple:
    return (r.time_ns.hex(), r.events, r.simulated, r.nbytes)


def _alone(coll, algo, topo, sizes, **kw) -> list[tuple]:
    sw = Sweep()
    return [_key(simulate(coll, algo, topo, s, sweep=sw, **kw)) for s in sizes]


@pytest.mark.parametrize("topo_name,nodes", [
    ("ring", 8), ("torus", 16), ("fat_tree2", 16), ("nvswitch", 8), ("switch", 6),
    ("dgx_h100", 2), ("dgx_a100_sharp", 2)])
@pytest.mark.parametrize("model", ["aware", "unaware"])
def test_stacked_sizes_are_each_size_alone(topo_name, nodes, model):
    topo = presets.get(topo_name, nodes)
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for algo in algorithms(coll):
            if algo.startswith(("collnet", "nvls")):
                continue
            want = _alone(coll, algo, topo, SWEEP, model=model)
            got = simulate_sizes(coll, algo, topo, SWEEP, sweep=Sweep(), model=model)
            assert [_key(r) for r in got] == want, (coll, algo)


def test_sizes_in_any_order_and_repeated():
    topo = presets.get("torus", 16)
    sizes = [1 << 20, 8, 4 << 10, 1 << 20, 96, 64 << 10]
    got = simulate_sizes("all_reduce", "ring", topo, sizes, in_place=True)
    assert [_key(r) for r in got] == _alone("all_reduce", "ring", topo, sizes, in_place=True)


def test_stacked_runs_are_really_stacked(monkeypatch):
    """The ring's sizes from 4 KiB up share one structure: one batched run for them."""
    seen = []
    real = batched.run_copies

    def spy(tp, *a, **kw):
        seen.append(tp.copies)
        return real(tp, *a, **kw)

    monkeypatch.setattr(batched, "run_copies", spy)
    sizes = [4 << 10 << i for i in range(8)]
    simulate_sizes("all_reduce", "ring", presets.get("fat_tree2", 16), sizes)
    assert seen == [len(sizes)]


def test_copies_that_break_the_order_run_alone(monkeypatch):
    """On two DGX H100 nodes the ring's batch breaks the heap's order from 256 MiB on:
    those copies leave the stack one by one (each simulated alone, on the event engine)
    and the others are stacked again; every answer stays its own."""
    topo = presets.get("dgx_h100", 2)
    sizes = [64 << 20, 256 << 20, 128 << 20, 512 << 20]
    broke = []
    real = batched.run_copies

    def spy(tp, *a, **kw):
        try:
            return real(tp, *a, **kw)
        except batched.Unordered as e:
            broke.append((tp.copies, e.copy))
            raise

    monkeypatch.setattr(batched, "run_copies", spy)
    got = simulate_sizes("all_reduce", "ring", topo, sizes, sweep=Sweep())
    stacked = [b for b in broke if b[0] > 1]
    assert stacked and all(c is not None for _, c in stacked)
    assert [_key(r) for r in got] == _alone("all_reduce", "ring", topo, sizes)


def test_each_reports_every_size_once():
    topo = presets.get("ring", 8)
    sizes = [8, 1 << 10, 1 << 20, 16 << 20]
    told: dict[int, object] = {}

    def each(i, run):
        assert i not in told
        told[i] = run

    got = simulate_sizes("all_reduce", "ring", topo, sizes, each=each)
    assert sorted(told) == list(range(len(sizes)))
    assert [told[i] for i in range(len(sizes))] == got


def test_stacked_refuses_templates_of_another_structure():
    topo = presets.get("ring", 8)
    opts = choice.options(topo)

    def batch(coll: Collective):
        tp = choice.prepare(coll, "ring", topo, 1 << 16, 4, 1 << 20, aware=True, opts=opts,
                          place=place).batch
        assert tp is not None
        return tp

    with pytest.raises(ValueError, match="differ in structure"):
        template.stacked([batch(Collective.ALL_REDUCE), batch(Collective.ALL_GATHER)])
