"""Replay a recorded training step's communication on a modeled cluster.

    ringtree sim --workload step.json --topology dgx_h100 --nodes 64 --dp 16 --tp 8 --pp 4

The workload is what ``ringtree train --record-comm`` writes (format ``ringtree-comm/1``,
documented in :mod:`ringtree.apps.parallel.record`): every rank's collectives and p2p
transfers of one step, in issue order, with their groups, sizes and dependencies. This
is ASTRA-sim's workload layer (Chakra execution traces) with the compute nodes left
out: the replay predicts the step's *communication* time.

Scaling to the target grid ``(D, T, P)`` (default: the recorded tp and pp, dp filling
the topology). Rank ``(d, p, t)`` of the recording replays its own event sequence as
rank ``(d mod D, p mod P, t mod T)`` of the target grid (``rank = (d P + p) T + t``,
tp fastest, so a tp group sits inside an NVLink node as Megatron places it), and each
event runs on that rank's group along the event's axis, with these sizes:

- tp and pp events keep their recorded bytes (activations: micro-batch x sequence x
  hidden, independent of the grid);
- dp events (gradient buckets, ZeRO-1's all-gather) scale by ``tp0 pp0 / (T P)``, the
  share of the model one rank holds.

Event cost: a collective is simulated on its group's devices with every algorithm
ringtree has for it (``ringtree.sim.simulate``, closed-form α-β ``fast`` model by
default) and the fastest counts, as the tuner would pick it; a send costs the sender
overhead plus the route's latency plus bytes over its narrowest link. Timing follows
the dependencies: a rank's events run one after another, a collective starts when all
its members have reached it, a receive ends no earlier than its send. Groups are
simulated alone (no contention between concurrent groups) and compute is zero, so the
result is a lower bound of the exposed communication, split by parallelism.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ringtree.sim.machine.cluster import Topology

FORMAT = "ringtree-comm/1"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def load(path: str) -> dict:
    """Read and check a workload file."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r} "
                         f"(written by ringtree train --record-comm)")
    return doc


@dataclass
class Replay:
    """The replay's answer (times in ns)."""

    grid: dict
    step_ns: float                                   # critical path over all ranks
    axis_ns: dict[str, float]                        # op time per axis on the slowest rank
    axis_ops: dict[str, int]
    axis_bytes: dict[str, int]
    slowest_rank: int
    per_rank_ns: dict[int, float] = field(default_factory=dict)


def target_grid(doc: dict, nranks: int, dp: int | None, tp: int | None,
                pp: int | None) -> tuple[int, int, int]:
    g = doc["grid"]
    tp = tp or g["tp"]
    pp = pp or g["pp"]
    dp = dp or nranks // (tp * pp)
    if dp * tp * pp != nranks:
        raise ValueError(f"grid dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} ranks, but the "
                         f"topology has {nranks} GPUs")
    return dp, tp, pp


def replay(doc: dict, topo: Topology, dp: int | None = None, tp: int | None = None,
           pp: int | None = None, model: str = "fast") -> Replay:
    """Time the recorded step on ``topo`` with grid ``(dp, tp, pp)``; see the module doc."""
    D, T, P = target_grid(doc, topo.nranks, dp, tp, pp)
    g0 = doc["grid"]
    dp_scale = (g0["tp"] * g0["pp"]) / (T * P)

    def new_rank(c: dict) -> int:
        return ((c["dp"] % D) * P + c["pp"] % P) * T + c["tp"] % T

    def group(c: dict, axis: str) -> tuple[int, ...]:
        d, p, t = c["dp"] % D, c["pp"] % P, c["tp"] % T
        if axis == "tp":
            return tuple((d * P + p) * T + k for k in range(T))
        if axis == "pp":
            return tuple((d * P + k) * T + t for k in range(P))
        return tuple((k * P + p) * T + t for k in range(D))

    coords = {r["rank"]: r["coords"] for r in doc["ranks"]}
    cost = _Costs(topo, model)
    plan: dict[int, list[dict]] = {}
    for r in doc["ranks"]:
        c = r["coords"]
        evs = []
        for ev in r["events"]:
            nbytes = ev["bytes"]
            if ev["axis"] == "dp":
                nbytes = max(4, int(round(nbytes * dp_scale / 4)) * 4)
            if ev["op"] in COLLECTIVES:
                members = group(c, ev["axis"])
                ns = cost.collective(ev["op"], members, nbytes)
            else:
                a, b = new_rank(c), new_rank(coords[ev["peer"]])
                ns = cost.p2p(a, b, nbytes)
                members = (a, b)
            evs.append({**ev, "ns": ns, "bytes": nbytes, "members": members})
        plan[r["rank"]] = evs
    ends = _schedule(plan, doc)
    slowest = max(ends, key=lambda r: (ends[r], -r))
    axis_ns: dict[str, float] = defaultdict(float)
    axis_ops: dict[str, int] = defaultdict(int)
    axis_bytes: dict[str, int] = defaultdict(int)
    for ev in plan[slowest]:
        axis_ns[ev["axis"]] += ev["ns"]
        axis_ops[ev["axis"]] += 1
        axis_bytes[ev["axis"]] += ev["bytes"]
    return Replay({"dp": D, "tp": T, "pp": P}, max(ends.values(), default=0.0),
                  dict(axis_ns), dict(axis_ops), dict(axis_bytes), slowest, ends)


def _schedule(plan: dict[int, list[dict]], doc: dict) -> dict[int, float]:
    """Event times honouring program order, collective rendezvous and send -> recv."""
    pos = {r: 0 for r in plan}
    clock = {r: 0.0 for r in plan}
    done: dict[tuple[int, int], float] = {}
    arrived: dict[tuple, dict[int, float]] = defaultdict(dict)
    nth: dict[tuple, int] = defaultdict(int)
    waiting_key: dict[int, tuple] = {}
    recorded_group = {r["rank"]: {i: tuple(ev["ranks"]) for i, ev in enumerate(r["events"])}
                      for r in doc["ranks"]}
    left = sum(len(v) for v in plan.values())
    while left:
        progressed = False
        for r, evs in plan.items():
            if pos[r] == len(evs):
                continue
            i = pos[r]
            ev = evs[i]
            if ev["op"] in COLLECTIVES:
                if r not in waiting_key:
                    g = recorded_group[r][i]
                    waiting_key[r] = (g, nth[(r, g)])
                    nth[(r, g)] += 1
                    arrived[waiting_key[r]][r] = clock[r]
                key = waiting_key[r]
                if len(arrived[key]) < len(key[0]):
                    continue
                end = max(arrived[key].values()) + ev["ns"]
                del waiting_key[r]
            elif ev["op"] == "recv":
                src = next((d for d in ev["deps"] if d[0] != r), None)
                if src is not None and tuple(src) not in done:
                    continue
                end = max(clock[r], done.get(tuple(src), 0.0) if src else 0.0)
            else:
                end = clock[r] + ev["ns"]
            done[(r, i)] = clock[r] = end
            pos[r] += 1
            left -= 1
            progressed = True
        if not progressed:
            stuck = {r: plan[r][pos[r]]["op"] for r in plan if pos[r] < len(plan[r])}
            raise ValueError(f"workload deadlocks: ranks wait at {stuck}")
    return clock


class _Costs:
    def __init__(self, topo: Topology, model: str):
        self.topo, self.model = topo, model

    def collective(self, op: str, members: tuple[int, ...], nbytes: int) -> float:
        if len(members) == 1:
            return 0.0
        return _best(self.topo, self.model, op, members, nbytes)

    def p2p(self, a: int, b: int, nbytes: int) -> float:
        t = self.topo
        da, db = t.ranks[a], t.ranks[b]
        if da == db:
            return 0.0
        route = t.route(da, db)
        lat = sum(t.links[lk].latency for lk in route)
        bw = min(t.bytes_per_ns(lk) for lk in route)
        return t.overhead_ns + lat + nbytes / bw


@lru_cache(maxsize=4096)
def _best(topo: Topology, model: str, op: str, members: tuple[int, ...], nbytes: int) -> float:
    from ringtree.schedules import algorithms
    from ringtree.sim import simulate

    sub = replace(topo, ranks=tuple(topo.ranks[m] for m in members))
    best = None
    for algo in algorithms(op):
        try:
            ns = simulate(op, algo, sub, nbytes, model=model).time_ns
        except (ValueError, RuntimeError, KeyError):
            continue
        best = ns if best is None else min(best, ns)
    if best is None:
        raise ValueError(f"no algorithm can run {op} on {len(members)} ranks of {topo.name}")
    return best


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def main(argv: list[str]) -> int:
    """``ringtree sim --workload FILE ...`` (see the module docstring)."""
    import argparse

    from ringtree.sim.machine import presets

    p = argparse.ArgumentParser(prog="ringtree sim --workload",
                                description="replay a recorded training step")
    p.add_argument("--workload", required=True, help="file from ringtree train --record-comm")
    p.add_argument("--topology", "-t", default="dgx_h100")
    p.add_argument("--nodes", "-N", type=int, default=None)
    p.add_argument("--dp", type=int)
    p.add_argument("--tp", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--model", "-m", default="fast", choices=["fast", "unaware", "aware"])
    args = p.parse_args(argv)
    try:
        doc = load(args.workload)
        topo = presets.get(args.topology, args.nodes)
        res = replay(doc, topo, args.dp, args.tp, args.pp, args.model)
    except (OSError, ValueError, KeyError) as e:
        print(f"ringtree sim: {e}", file=sys.stderr)
        return 2
    g0, g = doc["grid"], res.grid
    print(f"# workload {args.workload}: step {doc['step']} of a {doc['world']}-rank run, "
          f"grid dp={g0['dp']} tp={g0['tp']} pp={g0['pp']}, {doc['micro_batches']} "
          f"micro-batches, {doc['schedule']}, zero={doc['zero']}")
    print(f"# replayed on {topo.name}: {topo.nranks} GPUs, grid dp={g['dp']} tp={g['tp']} "
          f"pp={g['pp']}, model {args.model}")
    print("# axis      ops     bytes/rank   time (us)   share")
    total = sum(res.axis_ns.values()) or 1.0
    for axis in ("tp", "pp", "dp"):
        if axis in res.axis_ns:
            print(f"  {axis:<6} {res.axis_ops[axis]:6d}  {_fmt_bytes(res.axis_bytes[axis]):>13}"
                  f"  {res.axis_ns[axis] / 1e3:10.1f}   {res.axis_ns[axis] / total:5.1%}")
    print(f"# step communication time: {res.step_ns / 1e3:.1f} us (critical path, compute "
          f"excluded); op time on the slowest rank ({res.slowest_rank}): {total / 1e3:.1f} us")
    return 0
