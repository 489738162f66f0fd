"""A sweep priced for NCCL's three protocols: a protocol whose lower bound
(:mod:`ringtree.sim.egress`) exceeds the fastest time so far is not simulated, and the
answers are those of pricing every protocol at every size; what the fold's proof reads of
the Programs alone is proved once for the three priced topologies."""

from __future__ import annotations

import pytest

from ringtree.schedules import algorithms
from ringtree.sim import _call, egress, simulate, simulate_sizes
from ringtree.sim.compile import recent
from ringtree.sim.compile.structure import Sweep
from ringtree.sim.fold import symmetry
from ringtree.sim.machine import presets, protocols
from ringtree.sim.machine.model import Aware

SIZES = [1 << 30, 1 << 24, 1 << 20, 65536, 4096, 8]


def _fields(runs):
    return [(r.time_ns, r.proto, r.events, r.simulated, r.engine) for r in runs]


def test_the_bound_is_below_the_reference_engines_time():
    topo = presets.get("dgx_h100_sharp", 2)
    for algo in algorithms("all_reduce"):
        for p in protocols.allowed(algo):
            for nbytes in (1 << 21,):
                call = _call("all_reduce", algo, topo, "aware", 4, 0, None, (), 1 << 20,
                             False, None, p)
                try:
                    ref = simulate("all_reduce", algo, topo, nbytes, proto=p,
                                   engine="reference", symmetry=False, max_work=0)
                except ValueError:
                    continue                     # CollNet without a SHArP switch
                n, count = topo.nranks, call.count(nbytes)
                progs = [call_program(call, nbytes, r) for r in range(n)]
                for prog in progs:
                    b = egress.lower_bound_ns(prog, call.topo, count, 4)
                    assert b <= ref.time_ns - call.topo.launch_ns, (algo, p, nbytes)
                assert max(egress.lower_bound_ns(q, call.topo, count, 4)
                           for q in progs) > 0, (algo, p, nbytes)


def call_program(call, nbytes, r):
    from ringtree.schedules import generate

    return generate(call.coll, call.algo, call.topo.nranks, r, call.options(nbytes))


@pytest.mark.parametrize("algo", ["ring", "hierarchical", "rabenseifner", "tree"])
def test_skipped_protocols_leave_every_answer_as_pricing_all(algo, monkeypatch):
    topo = presets.get("dgx_h100_sharp", 2)
    skipped = []
    exceeds = egress.exceeds

    def spy(bound, t):
        out = exceeds(bound, t)
        skipped.append(out)
        return out

    monkeypatch.setattr(egress, "exceeds", spy)
    got = simulate_sizes("all_reduce", algo, topo, SIZES, sweep=Sweep(), proto="auto")
    assert any(skipped)                          # LL at 1 GiB at least
    each = [simulate_sizes("all_reduce", algo, topo, SIZES, sweep=Sweep(), proto=p)
            for p in protocols.PROTOCOLS]
    want = [min(row, key=lambda r: r.time_ns) for row in zip(*each)]
    assert _fields(got) == _fields(want)


def test_no_bound_in_the_unaware_model_or_the_integer_clock(monkeypatch):
    topo = presets.get("dgx_h100", 2)
    monkeypatch.setattr(egress, "exceeds", lambda b, t: pytest.fail("bound read"))
    for model in ("unaware", Aware(integer_ns=True)):
        simulate_sizes("all_reduce", "ring", topo, SIZES[:2], model=model, proto="auto")


def test_the_programs_part_of_a_fold_is_proved_once_for_every_protocol(monkeypatch):
    topo = presets.get("dgx_h100_sharp", 8)
    sizes = [1 << 24, 1 << 20]
    recent.clear()
    scans, renamings = [], []
    scan, all_ranks = symmetry._scan, symmetry._all_ranks
    monkeypatch.setattr(symmetry, "_scan", lambda *a: scans.append(a[1:3]) or scan(*a))
    monkeypatch.setattr(symmetry, "_all_ranks",
                        lambda *a: renamings.append(a[1:3]) or all_ranks(*a))
    monkeypatch.setattr(egress, "exceeds", lambda b, t: False)   # every protocol runs
    got = simulate_sizes("all_reduce", "hierarchical", topo, sizes, sweep=Sweep(),
                         proto="auto")
    assert got[0].simulated < topo.nranks       # folded
    assert len(scans) == len(set(scans)) and len(renamings) == len(set(renamings))
    # each protocol proved alone, every cache emptied before it
    alone = []
    for p in protocols.PROTOCOLS:
        recent.clear()
        alone.append(simulate_sizes("all_reduce", "hierarchical", topo, sizes,
                                    sweep=Sweep(), proto=p))
    want = [min(row, key=lambda r: r.time_ns) for row in zip(*alone)]
    assert _fields(got) == _fields(want)
