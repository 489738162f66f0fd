"""CollNet schedules: correct with their virtual switch ranks, and run by the simulator."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Buf
from ringtree.ir.walk import walk
from ringtree.schedules import Options, generate_all
from ringtree.sim import place, programs_for, simulate
from ringtree.sim.machine import presets


def _execute(progs):
    """Tiny symbolic executor over real + virtual ranks: each slot holds a frozenset of
    contributing ranks; messages match in order per (sender, receiver, channel)."""
    n = progs[0].nranks
    mem = [{(Buf.INPUT, j): frozenset([r]) for j in range(p.chunks)} if r < n else {}
           for r, p in enumerate(progs)]

    def run(r, c, i, s, received):
        val = mem[r][(s.src.buf, s.src.index)] if s.src else frozenset()
        for got in received:
            assert not (s.reduce and val & got), "double counting"
            val = val | got if s.reduce or not s.src else got
        if s.dst:
            mem[r][(s.dst.buf, s.dst.index)] = val
        return val

    stuck, left = walk(progs, run)
    assert not stuck, "deadlock"
    assert not left, "unreceived messages"
    return mem


@pytest.mark.parametrize("algo", ["collnet_direct", "collnet_chain"])
@pytest.mark.parametrize("nodes,fanin,channels", [
    ((0, 0, 0, 0), 0, 1), ((0, 0, 1, 1, 2, 2), 0, 2), ((0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3), 2, 1),
    ((0, 1, 2, 3, 4), 2, 1), ((0, 0, 1, 1, 1), 0, 1)])
def test_collnet_all_reduce(algo, nodes, fanin, channels):
    n = len(nodes)
    opts = Options(channels=channels, nodes=nodes, params=(("collnet_fanin", fanin),))
    progs = generate_all("all_reduce", algo, n, opts)
    virtual = list(progs[0].meta["virtual_programs"])
    assert [v.rank for v in virtual] == list(range(n, n + len(virtual)))
    assert all(v.meta["virtual"] == "switch" for v in virtual)
    mem = _execute(list(progs) + virtual)
    for r in range(n):
        for j in range(progs[r].chunks):
            assert mem[r][(Buf.OUTPUT, j)] == frozenset(range(n)), (r, j)


def test_collnet_simulated_on_sharp_fat_tree():
    topo = presets.get("dgx_h100_sharp", 64)           # two rail groups → 2-level SHArP
    run = simulate("all_reduce", "collnet_chain", topo, 8)
    assert run.result is not None and run.time_ns > 0
    devices = place(programs_for("all_reduce", "collnet_chain", topo), topo)
    switches = {topo.devices[d].name for d in devices[topo.nranks:]}
    assert any(s.startswith("leaf") for s in switches)
    assert any(s.startswith("spine") for s in switches)
    with pytest.raises(ValueError, match="in-network reduction"):
        simulate("all_reduce", "collnet_direct", presets.get("dgx_h100", 2), 8)


@pytest.mark.parametrize("dims", [[("switch", 8, 50.0, 500.0)],
                                  [("ring", 2, 50.0, 500.0), ("switch", 4, 50.0, 500.0)]])
def test_collnet_routes_to_multidim_switch(dims):
    """Every member reaches its reduction switch over its own link, and the switch sends
    back the same way; CollNet then moves each byte once up and once down."""
    from ringtree.sim.machine import cluster as T

    topo = T.multidim(dims, sharp=True)
    for d, dev in enumerate(topo.devices):
        if dev.kind != "switch":
            continue
        members = {topo.links[li].dst for li in topo._router.out[d]}
        for m in members:
            up, down = topo.route(m, d), topo.route(d, m)
            assert [(topo.links[li].src, topo.links[li].dst) for li in up] == [(m, d)]
            assert [(topo.links[li].src, topo.links[li].dst) for li in down] == [(d, m)]
        for a in set(range(topo.nranks)) - members:      # others climb in dimension order
            path = topo.route(a, d)
            assert path and topo.links[path[-1]].dst == d and topo.links[path[0]].src == a
    if len(dims) > 1:
        return
    nbytes = 1 << 26
    wire = nbytes / 50.0                                   # ns at 50 GB/s
    for algo in ("collnet_direct", "collnet_chain"):
        for model in ("aware", "fast"):
            t = simulate("all_reduce", algo, topo, nbytes, model=model).time_ns
            assert wire <= t <= 1.05 * wire, (algo, model, t)
