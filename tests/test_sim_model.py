"""Exactness of the network models: ASTRA-sim's closed-form cases, fast path = engine,
symmetry folding = full simulation."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective, Program, inp, out, parse_collective, recv, send
from ringtree.schedules import algorithms
from ringtree.sim import count_for, place, programs_for, simulate
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.engines import dispatch
from ringtree.sim.fold import symmetry
from ringtree.sim.machine import cluster as T
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Aware, Unaware

MiB = 1 << 20


def _p2p(n: int, a: int, b: int) -> list[Program]:
    progs = []
    for r in range(n):
        ch: tuple = ()
        if r == a:
            ch = (send(b, inp(0)),)
        elif r == b:
            ch = (recv(a, out(0)),)
        progs.append(Program(Collective.BROADCAST, "p2p", n, r, 1, (ch,)))
    return progs


def _one_message(topo: T.Topology, a: int, b: int, model=None) -> float:
    cp = compile_programs(_p2p(topo.nranks, a, b), MiB, 1, MiB)
    return dispatch.run_compiled(cp, topo, list(topo.ranks), model or Unaware(integer_ns=True)).time_ns


@pytest.mark.parametrize("make,expect", [
    (lambda: T.ring(16, 50, 500, gb=2**30), 21_031),
    (lambda: T.fully_connected(16, 50, 500, gb=2**30), 20_031),
    (lambda: T.switch(16, 50, 500, gb=2**30), 20_531),
])
def test_astra_a1(make, expect):
    """A1: 1 MiB from NPU 1 to NPU 4, 50 GB/s (2^30), 500 ns per hop."""
    assert _one_message(make(), 1, 4) == expect


@pytest.mark.parametrize("a,b,expect", [(0, 1, 4_932), (37, 41, 10_265), (26, 42, 23_531)])
def test_astra_a2(a, b, expect):
    """A2: Ring(2) × FullyConnected(8) × Switch(4), first differing dimension only."""
    topo = T.multidim([("ring", 2, 200, 50), ("fc", 8, 100, 500), ("switch", 4, 50, 2000)],
                      gb=2**30)
    assert _one_message(topo, a, b) == expect


def test_aware_store_and_forward():
    """Congestion-aware: one chunk over 3 ring hops pays serialization at every hop."""
    topo = T.ring(16, 50, 500, gb=2**30)
    assert _one_message(topo, 1, 4, Aware()) == pytest.approx(3 * (19_531.25 + 500))


def test_aware_fifo_contention():
    """Two senders into one switch port share the egress link: the second waits."""
    topo = T.switch(4, 50, 0)
    progs = []
    for r in range(4):
        ch: tuple = ()
        if r in (0, 1):
            ch = (send(2, inp(0)),)
        elif r == 2:
            ch = (recv(0, out(0)),)
        progs.append(Program(Collective.BROADCAST, "p2p", 4, r, 1, (ch,)))
    progs[2] = Program(Collective.BROADCAST, "p2p", 4, 2, 1, ((recv(0, out(0)),),
                                                             (recv(1, out(0)),)))
    progs[1] = Program(Collective.BROADCAST, "p2p", 4, 1, 1, ((), (send(2, inp(0)),)))
    cp = compile_programs(progs, 1000, 1, MiB)
    ser = 1000 / 50
    assert dispatch.run_compiled(cp, topo, list(topo.ranks), Aware()).time_ns == pytest.approx(3 * ser)
    assert dispatch.run_compiled(cp, topo, list(topo.ranks), Unaware()).time_ns == pytest.approx(ser)


TOPOS = [lambda: T.ring(8, 50, 500), lambda: presets.get("switch", 6),
         lambda: presets.get("dgx_a100", 2, gpus_per_node=4, nics_per_node=2)]


@pytest.mark.parametrize("make", TOPOS)
def test_fast_path_equals_engine(make):
    topo = make()
    for algo in algorithms("all_reduce"):
        if algo.startswith(("collnet", "nvls")):
            continue
        for nbytes in (8, 3 * MiB + 12):
            a = simulate("all_reduce", algo, topo, nbytes, model="unaware", symmetry=False)
            b = simulate("all_reduce", algo, topo, nbytes, model="fast", symmetry=False)
            assert b.time_ns == pytest.approx(a.time_ns, rel=1e-12), algo


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_symmetry_is_exact(coll):
    """Folding symmetric ranks gives exactly the full simulation's answer."""
    folded = 0
    for topo in (presets.get("dgx_a100", 6, gpus_per_node=2, nics_per_node=2, leaf_ports=2),
                 T.ring(6, 50, 500)):
        for algo in algorithms(coll):
            if algo.startswith(("collnet", "nvls")):
                continue
            progs = programs_for(coll, algo, topo, channels=1)
            for model in ("aware", "unaware"):
                for nbytes in (8, 6 * MiB, 5 * MiB + 4):
                    count = count_for(parse_collective(coll), nbytes, topo.nranks)
                    folded += bool(symmetry.period(progs, topo, place(progs, topo), count,
                                               model == "aware"))
                    full = simulate(coll, algo, topo, nbytes, model=model, channels=1,
                                    symmetry=False)
                    fold = simulate(coll, algo, topo, nbytes, model=model, channels=1)
                    assert fold.time_ns == full.time_ns, (algo, model, nbytes)
    assert folded > 0 or coll == "broadcast"          # rooted: never symmetric
