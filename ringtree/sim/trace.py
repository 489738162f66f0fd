"""Chrome / Perfetto trace of a simulated run (the Trace Event Format's JSON form).

One process (``pid``) per rank, one thread (``tid``) per channel — the layout the
profiler uses for real runs (NPKit-style) — with:

- an ``X`` (complete) event per transfer on the sender, from injection to arrival,
  named ``send → r<peer>``, and one on the receiver at arrival (``recv ← r<peer>``);
- ``s`` / ``f`` flow events joining each send to its receive (arrows in the UI);
- ``X`` events per step on lane 0 of the channel, from issue to completion.

Timestamps are µs. Events that overlap on one channel are spread over extra lanes
(``tid = channel + 1000·lane``) so every thread's slices nest, as Perfetto requires.
Virtual ranks (CollNet switches) get their own processes, named after the switch device.
"""

from __future__ import annotations

import json
from pathlib import Path

from ringtree.sim.compile.compiled import Compiled
from ringtree.sim.engines.contract import Result
from ringtree.sim.machine.cluster import Topology


def _lanes(events: list[dict]) -> None:
    """Move overlapping X events of one (pid, tid) onto extra lanes."""
    by: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        by.setdefault((e["pid"], e["tid"]), []).append(e)
    for (_, tid), evs in by.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        ends: list[float] = []
        for e in evs:
            lane = next((k for k, end in enumerate(ends) if end <= e["ts"]), len(ends))
            if lane == len(ends):
                ends.append(0.0)
            ends[lane] = e["ts"] + e["dur"]
            e["tid"] = tid + 1000 * lane


def build(result: Result, cp: Compiled, topo: Topology | None = None,
          devices: list[int] | None = None, name: str = "ringtree sim") -> dict:
    """The trace as a dict ``{"traceEvents": [...], "displayTimeUnit": "ns"}``."""
    if result.transfers is None:
        raise ValueError("simulate(..., trace=True) keeps the transfers a trace needs")
    steps, xfers = [], []
    for s in range(cp.nsteps):
        t0, t1 = result.step_start[s], result.step_done[s]
        steps.append({"name": cp.step_name[s], "ph": "X", "pid": cp.step_rank[s],
                      "tid": cp.step_chan[s], "ts": t0 / 1e3, "dur": max(0.0, t1 - t0) / 1e3,
                      "cat": "step", "args": {"step": s}})
    flows = []
    for k, (m, i, t0, t1, nbytes) in enumerate(result.transfers):
        a, b, c = cp.msg_src[m], cp.msg_dst[m], cp.msg_chan[m]
        args = {"bytes": nbytes, "slice": i, "message": m}
        xfers.append({"name": f"send → r{b}", "ph": "X", "pid": a, "tid": c,
                      "ts": t0 / 1e3, "dur": max(0.0, t1 - t0) / 1e3, "cat": "send",
                      "args": args})
        xfers.append({"name": f"recv ← r{a}", "ph": "X", "pid": b, "tid": c,
                      "ts": t1 / 1e3, "dur": 0.0, "cat": "recv", "args": args})
        flows.append((k, a, b, c, t0 / 1e3, t1 / 1e3))
    _lanes(steps)
    _lanes(xfers)
    for e in xfers:
        e["tid"] += 500
    # Flow events bind to the enclosing slice on their thread: use the lanes just chosen.
    events: list[dict] = []
    for k, (fid, a, b, _c, ts0, ts1) in enumerate(flows):
        snd, rcv = xfers[2 * k], xfers[2 * k + 1]
        events.append({"name": "transfer", "ph": "s", "id": fid, "pid": a,
                       "tid": snd["tid"], "ts": ts0, "cat": "flow"})
        events.append({"name": "transfer", "ph": "f", "bp": "e", "id": fid, "pid": b,
                       "tid": rcv["tid"], "ts": ts1, "cat": "flow"})
    meta = []
    nproc = max(cp.step_rank, default=-1) + 1
    for r in range(nproc):
        label = f"rank {r}" if r < cp.nranks else f"switch {r}"
        if topo is not None and devices is not None and r < len(devices):
            label += f" ({topo.devices[devices[r]].name})"
        meta.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": label}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": r,
                     "args": {"sort_index": r}})
    tids = {(e["pid"], e["tid"]) for e in steps + xfers}
    for pid, tid in sorted(tids):
        ch, lane = (tid % 1000) % 500, tid // 1000
        kind = "transfers" if tid % 1000 >= 500 else "steps"
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": f"channel {ch} {kind}" + (f" ({lane})" if lane else "")}})
    return {"traceEvents": meta + steps + xfers + events, "displayTimeUnit": "ns",
            "otherData": {"generator": name, "time_ns": result.time_ns}}


def write(path: str | Path, result: Result, cp: Compiled, topo: Topology | None = None,
          devices: list[int] | None = None) -> None:
    """Write the trace of a run (``simulate(..., trace=True)``) to ``path``."""
    Path(path).write_text(json.dumps(build(result, cp, topo, devices)))
