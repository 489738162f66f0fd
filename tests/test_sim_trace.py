"""The Chrome/Perfetto trace of a simulated run is valid JSON with the agreed layout."""

from __future__ import annotations

import json

from ringtree.sim import simulate, trace
from ringtree.sim.machine import presets


def test_trace_json(tmp_path):
    topo = presets.get("dgx_h100_sharp", 2, gpus_per_node=2, nics_per_node=2)
    run = simulate("all_reduce", "collnet_direct", topo, 3 << 20, trace=True)
    res = run.result
    f = tmp_path / "t.json"
    trace.write(f, res, res.compiled, topo, res.devices)
    data = json.loads(f.read_text())
    ev = data["traceEvents"]
    assert {e["ph"] for e in ev} == {"M", "X", "s", "f"}
    xs = [e for e in ev if e["ph"] == "X"]
    sends = [e for e in xs if e["cat"] == "send"]
    assert len(sends) == len(res.transfers) > 0
    assert max(e["ts"] + e["dur"] for e in xs) == run.time_ns / 1e3
    for e in ev:
        assert isinstance(e["pid"], int) and e["pid"] >= 0
        if e["ph"] != "M":
            assert isinstance(e["tid"], int) and e["ts"] >= 0
    assert {e["pid"] for e in xs} >= set(range(topo.nranks + 1))   # ranks + a switch
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and all(ends[i]["ts"] >= starts[i]["ts"] for i in starts)
    lanes: dict = {}
    for e in xs:                                     # slices on one thread never overlap
        lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
    names = [e["args"]["name"] for e in ev if e["name"] == "process_name"]
    assert "rank 0 (n0.gpu0)" in names and any(n.startswith("switch") for n in names)
