"""The compiled heap (:mod:`ringtree.sim.engines.native`) beyond the conformance suite:
trees and CollNet at 16 nodes against the reference engine's own loop, its progress
calls and its errors, and what it declines (traced and unaware runs, the switch)."""

from __future__ import annotations

import pytest
from test_sim_conformance import key

import ringtree.sim as sim
from ringtree.sim import Aware, Unaware, count_for, place
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.engines import dispatch, native
from ringtree.sim.engines.contract import Job
from ringtree.sim.fold.choice import Plan
from ringtree.sim.machine import presets
from ringtree.sim.machine.model import Rules

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="ringtree.sim.engines._heapc not built (no C compiler)")
MODELS = (Aware(), Aware(integer_ns=True))


def _compiled(topo, algo, nbytes):
    progs = sim.programs_for("all_reduce", algo, topo)
    devices = place(progs, topo)
    return compile_programs(progs, count_for(progs[0].collective, nbytes, topo.nranks), 4), \
        devices


@needs_native
@pytest.mark.parametrize("algo", ["tree", "tree_updown", "collnet_direct", "collnet_chain"])
def test_compiled_heap_on_trees_and_collnet_at_16_nodes(algo):
    """Trees and CollNet across two leaf switches' worth of nodes with pipelines of many
    slices, where up and down traffic share links (the README command's case, smaller)."""
    topo = presets.get("dgx_h100_sharp", 16)
    for nbytes in (4096, 1 << 20, 64 << 20):
        cp, devices = _compiled(topo, algo, nbytes)
        for model in MODELS:
            got = dispatch.run_compiled(cp, topo, devices, model, engine="native")
            want = dispatch.run_compiled(cp, topo, devices, model, engine="reference")
            assert key(got) == key(want), (nbytes, model)
            assert got.events > 0


def test_traced_and_unaware_runs_are_declined():
    """The compiled loop keeps no transfers and carries only the aware network: a traced
    run and an unaware one are declined, and a state it does not cover is refused."""
    topo = presets.get("dgx_h100_sharp", 2)
    cp, devices = _compiled(topo, "tree", 1 << 20)
    heap = native.NativeHeap()
    traced = Job(Plan(cp, devices), topo, Rules.of("aware", topo), trace=True)
    assert "trace" in heap.accepts(traced, traced.rules)
    unaware = Job(Plan(cp, devices), topo, Rules.of(Unaware(), topo))
    assert "unaware" in heap.accepts(unaware, unaware.rules)
    with pytest.raises(dispatch.EngineDeclined, match="trace"):
        dispatch.run_compiled(cp, topo, devices, Aware(), trace=True, engine="native")
    got = dispatch.run_compiled(cp, topo, devices, Aware(), trace=True)
    assert got.transfers
    from ringtree.sim.engines.reference import engine_for

    with pytest.raises(ValueError, match="compiled heap"):
        native.loop(engine_for(traced))


@needs_native
def test_compiled_heap_reports_progress_and_stops_on_its_error(monkeypatch):
    """The compiled loop calls ``progress`` at the same event counts as the Python loop,
    an exception raised there ends the run with that exception, and
    ``RINGTREE_SIM_NATIVE=0`` switches the compiled loop off."""
    topo = presets.get("dgx_h100_sharp", 16)
    cp, devices = _compiled(topo, "tree", 256 << 20)
    seen: dict[str, list[int]] = {}
    for name in ("reference", "native"):
        calls: list[int] = []
        dispatch.run_compiled(cp, topo, devices, Aware(), progress=calls.append, engine=name)
        seen[name] = calls
    assert len(seen["native"]) >= 2 and seen["native"] == seen["reference"]
    assert all(c % 0x10000 == 0 for c in seen["native"])

    def stop(events):
        raise KeyboardInterrupt(f"stopped at {events}")

    with pytest.raises(KeyboardInterrupt, match="stopped at 65536"):
        dispatch.run_compiled(cp, topo, devices, Aware(), progress=stop)
    monkeypatch.setenv("RINGTREE_SIM_NATIVE", "0")
    assert not native.enabled()
    monkeypatch.setattr(native, "loop", lambda *a, **k: pytest.fail("the compiled loop ran"))
    dispatch.run_compiled(cp, topo, devices, Aware())
