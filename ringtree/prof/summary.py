"""``ringtree trace --summary``: the ranks' profiler files as a text table.

Per collective, algorithm and size: issue-to-completion and active time, the split of the
active time into waiting for peers, transfer and reduction, and the slowest rank of every
step (the spans are read as :mod:`ringtree.prof.trace` reads them).
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict

from ringtree.prof.recorder import PRIMS
from ringtree.prof.trace import Overlap, Span, chan_name, load


def active_starts(colls: list[Span]) -> dict[int, int]:
    """When each call could start working: ``max(issue, completion of every call issued
    before it that completed before it)`` — calls queue behind each other on a rank as
    kernels do on a CUDA stream, so issue-to-completion counts the queue too. Keyed by
    ``id(span)``; the active intervals of one rank never overlap."""
    out: dict[int, int] = {}
    done: list[int] = []  # completion times of earlier-issued calls, sorted
    for sp in sorted(colls, key=lambda c: (c.start, c.end)):
        i = bisect.bisect_right(done, sp.end)
        out[id(sp)] = max(sp.start, done[i - 1]) if i else sp.start
        bisect.insort(done, sp.end)
    return out


def summary(directory: str) -> str:
    """Per collective/algorithm/size: issue-to-completion and active time, the wait /
    transfer / reduce split of the active time, and the slowest rank of every step."""
    comms = load(directory)
    lines: list[str] = []
    for prefix in sorted(comms, key=lambda p: (len(p), p)):
        rcs = comms[prefix]
        n = rcs[0].meta["size"]
        groups: dict[tuple, dict] = {}
        for rc in rcs:
            calls = rc.meta["calls"]
            wait = Overlap([sp for sp in rc.spans if sp.kind == "idle"])
            red = Overlap(_disjoint([sp for sp in rc.spans if sp.kind == "reduce"]))
            steps: dict[tuple, list[Span]] = defaultdict(list)
            for sp in rc.spans:
                if sp.kind == "step":
                    steps[(sp.chan >= 64, sp.seq)].append(sp)
            colls = [sp for sp in rc.spans if sp.kind == "coll" and not sp.unfinished
                     and 0 <= sp.aux < len(calls)]
            begin = active_starts(colls)
            for sp in colls:
                c = calls[sp.aux]
                key = (c["name"], _algo(c), c["bytes"], c["dtype"])
                g = groups.setdefault(key, {"calls": set(), "dur": [], "act": [], "wait": 0,
                                            "red": 0, "total": 0, "steps": defaultdict(
                                                lambda: defaultdict(list))})
                a = begin[id(sp)]
                active = sp.end - a
                w = min(wait.within(a, sp.end), active)
                r = min(red.within(a, sp.end), active - w)
                g["calls"].add(sp.seq)
                g["dur"].append(sp.end - sp.start)
                g["act"].append(active)
                g["total"] += active
                g["wait"] += w
                g["red"] += r
                for st in steps.get((sp.chan >= 64, sp.seq), ()):
                    name = PRIMS[st.prim] if 0 <= st.prim < len(PRIMS) else "?"
                    took = max(0, min(st.end, sp.end) - max(st.start, a))  # inside the call
                    g["steps"][(st.chan, st.gid, name)][rc.rank].append(took)
        if not groups:
            continue
        lines.append(f"communicator {prefix} ({n} ranks, {len(rcs)} profiled)")
        aw = max(10, *(len(k[1]) + 2 for k in groups))
        lines.append(f"  {'collective':<16}{'algo':<{aw}}{'bytes':>11}{'calls':>7}"
                     f"{'issue→done':>12}{'active':>10}{'wait':>8}{'transfer':>10}"
                     f"{'reduce':>8}")
        for key in sorted(groups, key=lambda k: (k[0], k[1], k[2])):
            g = groups[key]
            tot = max(g["total"], 1)
            mean = statistics.fmean(g["dur"]) / 1000
            act = statistics.fmean(g["act"]) / 1000
            w, r = g["wait"] / tot * 100, g["red"] / tot * 100
            lines.append(f"  {key[0]:<16}{key[1]:<{aw}}{key[2]:>11}{len(g['calls']):>7}"
                         f"{mean:>12.1f}{act:>10.1f}{w:>7.1f}%{max(0.0, 100 - w - r):>9.1f}%"
                         f"{r:>7.1f}%")
        lines.append("  slowest rank per step (mean time inside its call's active time; "
                     "median over ranks):")
        for key in sorted(groups, key=lambda k: (k[0], k[1], k[2])):
            g = groups[key]
            lines.append(f"    {key[0]} {key[1]} {key[2]} B:")
            for (chan, gid, name), per_rank in sorted(g["steps"].items()):
                means = {r: statistics.fmean(v) for r, v in per_rank.items()}
                slow = max(means, key=lambda r: means[r])
                med = statistics.median(means.values())
                lines.append(f"      {chan_name(chan):<6} step {gid:<3} {name:<20} slowest "
                             f"rank {slow:<3} {means[slow] / 1000:>10.1f} us   (median "
                             f"{med / 1000:.1f} us)")
        lines.append("  times in us, means per call. issue→done: from the call to its "
                     "completion, including time queued behind earlier calls (non-blocking "
                     "issue, as perf's default); active: from when the calls before it "
                     "completed (or its issue, if later) to its completion — what perf's "
                     "time column measures. wait / transfer / reduce split the active time: "
                     "wait = asleep in the transports with nothing able to move (waiting "
                     "for peers); reduce = reduction kernels; transfer = the rest (moving "
                     "bytes, copies, scheduling)")
    return "\n".join(lines)


def _disjoint(spans: list[Span]) -> list[Span]:
    """Merge overlapping spans (reductions of several channels at once count once)."""
    out: list[Span] = []
    for sp in sorted(spans, key=lambda x: x.start):
        if out and sp.start <= out[-1].end:
            if sp.end > out[-1].end:
                last = out[-1]
                out[-1] = Span(last.kind, last.start, sp.end, last.chan, last.peer, last.seq,
                               last.gid, last.prim, last.size, last.aux)
        else:
            out.append(sp)
    return out


def _algo(call: dict) -> str:
    """The algorithm, and the protocol when it is not Simple (``direct/LL``)."""
    proto = call.get("proto", "Simple")
    return call["algo"] if proto == "Simple" else f"{call['algo']}/{proto}"
