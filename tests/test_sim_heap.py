"""The event heap as one loop over local names (:mod:`ringtree.sim.heap`) and the same
loop compiled (:mod:`ringtree.sim.native`) are the engine's own loop
(:meth:`ringtree.sim.engine._Engine.loop`): the same time, every step's start and done,
every rank's finish, events, messages and bytes, bit for bit, on trees, CollNet and every
other schedule, both aware models; the traced and unaware runs keep the engine's loop."""

from __future__ import annotations

import pytest
from test_sim_dataflow import _key, every_schedule

import ringtree.sim as sim
from ringtree.sim import Aware, Unaware, count_for, engine, native, place, presets
from ringtree.sim.compile import compile_programs

needs_native = pytest.mark.skipif(not native.available(),
                                  reason="ringtree.sim._heapc not built (no C compiler)")

CASES = [("dgx_h100_sharp", 2), ("dgx_a100", 2), ("fat_tree2", 6), ("fat_tree3", 8),
         ("torus", 6), ("switch_sharp", 5), ("nvswitch", 8), ("ring", 5), ("local", 4)]
MODELS = (Aware(), Aware(integer_ns=True))


def _both(cp, topo, devices, model, monkeypatch, **kw):
    """The run with the engine's loop and with :func:`ringtree.sim.heap.loop`; where the
    extension is built, the compiled loop's run must be the Python loop's too, and must
    have run wherever the Python loop did."""
    monkeypatch.setattr(engine, "FUSED", False)
    want = engine.run(cp, topo, devices, model, **kw)
    monkeypatch.setattr(engine, "FUSED", True)
    monkeypatch.setattr(engine, "NATIVE", False)
    ran: list[str] = []
    python_loop, compiled_loop = engine.fused_loop, native.loop
    monkeypatch.setattr(engine, "fused_loop",
                        lambda eng, progress=None: ran.append("py") or python_loop(eng, progress))
    got = engine.run(cp, topo, devices, model, **kw)
    if native.available():
        monkeypatch.setattr(engine, "NATIVE", True)
        monkeypatch.setattr(native, "loop", lambda eng, progress=None:
                            ran.append("c") or compiled_loop(eng, progress))
        compiled = engine.run(cp, topo, devices, model, **kw)
        assert _key(compiled) == _key(got)
        assert ran.count("c") == ran.count("py")
        monkeypatch.setattr(native, "loop", compiled_loop)
    monkeypatch.setattr(engine, "fused_loop", python_loop)
    return got, want


@pytest.mark.parametrize("topo_name,nodes", CASES)
def test_fused_heap_is_the_engine(topo_name, nodes, monkeypatch):
    topo = presets.get(topo_name, nodes)
    ran = set()
    for coll, algo, nbytes, cp, devices in every_schedule(topo):
        for model in MODELS:
            # batch=False: the heap from the start, whatever the run
            got, want = _both(cp, topo, devices, model, monkeypatch, batch=False)
            assert _key(got) == _key(want), (coll, algo, nbytes, model)
            ran.add(algo)
    assert {"tree", "ring"} <= ran
    if topo.name.endswith("sharp"):
        assert {"collnet_direct", "collnet_chain", "tree_updown"} <= ran


@pytest.mark.parametrize("algo", ["tree", "tree_updown", "collnet_direct", "collnet_chain"])
def test_fused_heap_on_trees_and_collnet_at_16_nodes(algo, monkeypatch):
    """Trees and CollNet across two leaf switches' worth of nodes with pipelines of many
    slices, where up and down traffic share links (the README command's case, smaller)."""
    topo = presets.get("dgx_h100_sharp", 16)
    progs = sim.programs_for("all_reduce", algo, topo)
    devices = place(progs, topo)
    for nbytes in (4096, 1 << 20, 64 << 20):
        cp = compile_programs(progs, count_for(progs[0].collective, nbytes, topo.nranks), 4)
        for model in MODELS:
            got, want = _both(cp, topo, devices, model, monkeypatch)
            assert _key(got) == _key(want), (nbytes, model)
            assert got.events > 0


def test_fused_heap_after_rounds(monkeypatch):
    """Runs whose rounds (:mod:`ringtree.sim.feedforward`) kept the heap's order, and
    runs whose rounds failed and started again on the heap, end the same way."""
    topo = presets.get("dgx_h100", 2)
    monkeypatch.setattr(engine, "FIXED_POINT", False)
    for algo, nbytes in (("direct", 5000), ("direct2", 3 << 20), ("direct2", 8)):
        progs = sim.programs_for("all_reduce", algo, topo)
        devices = place(progs, topo)
        cp = compile_programs(progs, count_for(progs[0].collective, nbytes, topo.nranks), 4)
        got, want = _both(cp, topo, devices, Aware(), monkeypatch)
        assert _key(got) == _key(want), (algo, nbytes)
        cp.memo.clear()
        heap_only = engine.run(cp, topo, devices, Aware(), batch=False)
        assert _key(got)[:4] == _key(heap_only)[:4], (algo, nbytes)


def test_traced_and_unaware_runs_keep_the_engine_loop(monkeypatch):
    """The fused loop keeps no transfers and carries only the aware network: a traced
    run and an unaware one never reach it, and a state it does not cover is refused."""
    topo = presets.get("dgx_h100_sharp", 2)
    progs = sim.programs_for("all_reduce", "tree", topo)
    devices = place(progs, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, 1 << 20, topo.nranks), 4)
    monkeypatch.setattr(engine, "FUSED", False)
    want = engine.run(cp, topo, devices, Aware(), trace=True)
    want_u = engine.run(cp, topo, devices, Unaware())
    monkeypatch.setattr(engine, "FUSED", True)

    def refuse(eng, progress=None):
        raise AssertionError("the fused loop ran")

    monkeypatch.setattr(engine, "fused_loop", refuse)
    got = engine.run(cp, topo, devices, Aware(), trace=True)
    assert _key(got) == _key(want) and got.transfers == want.transfers
    assert _key(engine.run(cp, topo, devices, Unaware())) == _key(want_u)
    monkeypatch.undo()
    from ringtree.sim import heap

    eng = engine._Engine(cp, topo, devices, Aware(), True)
    with pytest.raises(ValueError, match="fused heap"):
        heap.loop(eng)
    eng = engine._Engine(cp, topo, devices, Unaware(), False)
    with pytest.raises(ValueError, match="fused heap"):
        heap.loop(eng)


@needs_native
def test_compiled_heap_reports_progress_and_stops_on_its_error(monkeypatch):
    """The compiled loop calls ``progress`` at the same event counts as the Python loop,
    an exception raised there ends the run with that exception, and
    ``RINGTREE_SIM_NATIVE=0`` switches the compiled loop off."""
    topo = presets.get("dgx_h100_sharp", 16)
    progs = sim.programs_for("all_reduce", "tree", topo)
    devices = place(progs, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, 256 << 20, topo.nranks), 4)
    seen: dict[bool, list[int]] = {}
    for compiled in (False, True):
        monkeypatch.setattr(engine, "NATIVE", compiled)
        calls: list[int] = []
        engine.run(cp, topo, devices, Aware(), progress=calls.append)
        seen[compiled] = calls
    assert len(seen[True]) >= 2 and seen[True] == seen[False]
    assert all(c % 0x10000 == 0 for c in seen[True])

    def stop(events):
        raise KeyboardInterrupt(f"stopped at {events}")

    with pytest.raises(KeyboardInterrupt, match="stopped at 65536"):
        engine.run(cp, topo, devices, Aware(), progress=stop)
    monkeypatch.setenv("RINGTREE_SIM_NATIVE", "0")
    assert not native.enabled()
    monkeypatch.setattr(native, "loop", lambda *a, **k: pytest.fail("the compiled loop ran"))
    engine.run(cp, topo, devices, Aware())
