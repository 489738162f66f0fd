"""The simulator replays the Program the runtime runs.

For every registered algorithm of every collective, on node layouts from one host to one
rank per host, at sizes on both sides of every per-size option (hierarchical's pieces),
the Program the simulator generates for a call (its options as ``simulate`` sets them,
``sim._call(...).options(nbytes)``) is the Program the planner builds for the same call
(``Planner.program`` with the planner's count and bytes). They share one function
(:func:`ringtree.schedules.build`); this test keeps anything from going around it.
"""

from __future__ import annotations

import pytest

from ringtree import sim
from ringtree.ir.collectives import Collective
from ringtree.runtime.planner import Planner
from ringtree.schedules import algorithms, generate
from ringtree.sim.machine import presets

LAYOUTS = {
    "1 host x 8": lambda: presets.dgx_h100(1),
    "2 hosts x 8": lambda: presets.dgx_h100(2),
    "4 hosts x 1": lambda: presets.fat_tree2(4),
    "3 hosts x 1": lambda: presets.ring(3),
}
SIZES = (8, 64 << 10, 4 << 20, 64 << 20)


def _planned(coll, algo, topo, nbytes, rank):
    n, nodes = topo.nranks, tuple(topo.nodes())
    call = sim._call(coll, algo, topo, "aware", 4, 0, None, (), 1 << 20, False, None)
    count = call.count(nbytes)
    nin, nout = coll.blocks(n)
    planner = Planner(rank, n, nodes, nchannels=topo.channels, slice_bytes=1 << 20,
                      algo_enabled={}, link="shm")
    try:
        ran = planner.program(coll, algo, 0, count * 4 * max(nin, nout, 1))
    except ValueError as e:
        ran = f"error: {e}"
    try:
        replayed = generate(coll, algo, n, rank, call.options(nbytes))
    except ValueError as e:
        replayed = f"error: {e}"
    return ran, replayed


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("coll", list(Collective), ids=lambda c: c.value)
def test_the_simulator_replays_the_planners_program(coll, layout):
    topo = LAYOUTS[layout]()
    n = topo.nranks
    for algo in algorithms(coll):
        for nbytes in SIZES:
            if nbytes < sim.count_for(coll, 0, n) or sim.count_for(coll, nbytes, n) < 1:
                continue
            for rank in sorted({0, n // 2, n - 1}):
                ran, replayed = _planned(coll, algo, topo, nbytes, rank)
                assert ran == replayed, (algo, nbytes, rank)
