"""Hang diagnosis: from what every rank was doing, one report that names the culprit.

Input: one status per rank of a communicator (:func:`ringtree.prof.flight.status`), or
None for a rank that did not answer. Online, a rank that times out gathers them through
the rendezvous store (:mod:`ringtree.prof.watch`); offline, ``ringtree doctor DIR`` reads
the flight recorders the ranks dumped.

The reasoning is the wait-for graph. A rank blocked in a collective waits on specific
peers (the step's receive from ``prev``, a send that ``next`` does not drain). Following
those edges from every blocked rank ends at ranks that wait on nobody: a rank that never
called the operation (it is behind, still computing or sleeping — its main thread's
location is shown), one that is in a different operation, one that closed its
communicator or failed, or one that did not answer at all (dead or stopped). Those are the
culprits. If the edges close into a cycle with no such rank, the ranks are deadlocked on
each other and the report says so.

``ringtree doctor DIR`` prints the report for every communicator found in DIR's
``fr_rank*.json`` files and exits 1 if something is stuck, 0 if not, 2 without files.
``ringtree doctor --net``, run as a job, prints which hosts reach which advertised
addresses (:mod:`ringtree.bootstrap.netmatrix`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field


@dataclass
class Report:
    comm: str
    size: int
    stuck: dict | None                    # the operation the job is stuck in
    culprits: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    behind: list[int] = field(default_factory=list)
    unreachable: list[int] = field(default_factory=list)
    cycle: list[int] = field(default_factory=list)
    lost: list[tuple[int, int, int, str]] = field(default_factory=list)  # waiter, peer, seq, op
    # waits that ended on the waiter's own deadline before the peer got there: waiter,
    # peer, seq, op, how much later the peer completed (s)
    gave_up: list[tuple[int, int, int, str, float]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.stuck is None and not self.culprits and not self.unreachable \
            and not self.lost

    def text(self) -> str:
        return "\n".join(self.lines)


def _op(c: dict) -> str:
    if c.get("is_p2p"):
        return f"{c['name']} (p2p, peer {c.get('peer')}, tag {c.get('root')}) seq " \
               f"{c['p2p_seq_id']}"
    return f"{c['name']} seq {c['collective_seq_id']}"


def _op_long(c: dict) -> str:
    extra = f"{c['algo']}, {c['count']} x {c['dtype']}"
    if c.get("op") not in (None, "-"):
        extra += f", {c['op']}"
    return f"{_op(c)} ({extra})"


def _seconds(s: dict, c: dict) -> str:
    t0 = c.get("time_discovered_started_ns") or c.get("time_created_ns") or 0
    if not t0:
        return ""
    return f" for {max(0.0, (s['time_ns'] - t0) / 1e9):.1f} s"


def _tag(s: dict, cur: dict | None) -> str:
    bits = []
    if cur is not None and cur.get("state") == "failed" and cur.get("error"):
        bits.append(cur["error"].split(":")[0])
    if s.get("state") == "closed":
        bits.append("closed")
    return f" [{', '.join(bits)}]" if bits else ""


def _describe(r: int, s: dict | None, stuck_seq: int | None, missing: str) -> str:
    if s is None:
        return f"rank {r}: {missing}"
    if s.get("after_abort"):
        return f"rank {r}: exited after the abort (not stuck): {s['after_abort']}"
    cur = s.get("current")
    if cur is None:
        tail = "" if stuck_seq is None else f"NOT in seq {stuck_seq} — "
        if s.get("state") == "closed":
            return f"rank {r}: {tail}closed its communicator after seq {s['last_completed']}"
        err = f"; failed: {s['error']}" if s.get("error") else ""
        return (f"rank {r}: {tail}not in any operation (last completed seq "
                f"{s['last_completed']}); main thread at {s['where']}{err}")
    w = s.get("waiting") or []
    if not w:
        return (f"rank {r}: in {_op(cur)}{_seconds(s, cur)}, not blocked on a transfer; "
                f"main thread at {s['where']}{_tag(s, cur)}")
    parts, seen = [], set()
    for x in w:
        if (x["op"], x["peer"]) in seen:
            continue
        seen.add((x["op"], x["peer"]))
        verb = "to receive from" if x["op"] == "recv" else "to send to"
        how = "connection lost" if x.get("error") else f"{x['bytes_done']}/{x['bytes']} B"
        parts.append(f"{verb} rank {x['peer']} ({how})")
    x = w[0]
    return (f"rank {r}: in {_op(cur)}{_seconds(s, cur)}, step {x['step'] + 1}/{x['nsteps']} "
            f"{x['prim']} on channel {x['channel']}, waiting " + " and ".join(parts)
            + _tag(s, cur))


def _same(a: dict, b: dict) -> bool:
    return (a["is_p2p"], a["collective_seq_id"], a["p2p_seq_id"], a["name"]) == \
        (b["is_p2p"], b["collective_seq_id"], b["p2p_seq_id"], b["name"])


def _why(r: int, s: dict | None, stuck: dict | None, missing: str) -> tuple[str, bool]:
    """(reason, strong): strong reasons are ranks outside the stuck operation."""
    name = _op(stuck) if stuck else "the operation"
    if s is None:
        return missing, True
    if s.get("after_abort"):  # it left because of another rank's failure: not a cause
        return f"exited after the abort: {s['after_abort']}", False
    if s.get("failing"):  # it saw the failure too and is reporting it
        return "is failing too (handling the same error)", False
    cur = s.get("current")
    if cur is None:
        if s.get("state") == "closed":
            return f"closed its communicator after seq {s['last_completed']} without " \
                   f"calling {name}", True
        err = f"; its communicator failed: {s['error']}" if s.get("error") else ""
        return (f"has not called {name} (last completed seq {s['last_completed']}); its "
                f"main thread is at {s['where']}{err}"), True
    if stuck is not None and not _same(cur, stuck):
        return f"is in {_op(cur)} instead of {name}", True
    if cur.get("state") == "failed":
        return f"failed in {name}: {cur.get('error')}", True
    return f"is in {name} but not blocked on any transfer (busy in {s['where']}?)", False


ONLINE_MISSING = "did not answer through the store (dead, stopped, or stuck outside Python)"
OFFLINE_MISSING = "left no flight recorder (dead, stopped, or never dumped)"


def _stuck(current: list[dict]) -> dict | None:
    """The operation the job is stuck in: the oldest collective any rank is inside (the
    oldest point-to-point operation if no rank is in a collective)."""
    if not current:
        return None
    pool = [c for c in current if not c["is_p2p"]] or current
    return min(pool, key=lambda c: (c["collective_seq_id"], c["p2p_seq_id"]))


def _terminals(edges: dict[int, list[int]], blocked: list[int]) -> set[int]:
    """The ranks at the end of the wait-for chains from ``blocked``: they wait on nobody."""
    terminals: set[int] = set()
    seen: set[int] = set()
    todo = list(blocked)
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        if edges.get(r):
            todo.extend(edges[r])
        else:
            terminals.add(r)
    return terminals


def analyze(statuses: list[dict | None], comm: str = "?",
            missing: str = ONLINE_MISSING) -> Report:
    """The report for one communicator: ``statuses[r]`` is rank r's status or None."""
    size = len(statuses)
    st = {r: s for r, s in enumerate(statuses) if s is not None}
    unreachable = [r for r in range(size) if statuses[r] is None]
    stuck = _stuck([s["current"] for s in st.values() if s.get("current")])
    stuck_seq = stuck["collective_seq_id"] if stuck and not stuck["is_p2p"] else None
    top = max((s.get("last_enqueued") or 0 for s in st.values()), default=0)
    mark = stuck_seq if stuck_seq is not None else top
    behind = sorted(r for r, s in st.items() if (s.get("last_enqueued") or 0) < mark)

    edges = {r: sorted({w["peer"] for w in s.get("waiting") or []}) for r, s in st.items()}
    blocked = [r for r in st if edges[r]]
    terminals = _terminals(edges, blocked)
    lost, gave_up = _lost(statuses)
    rep = Report(comm, size, stuck, behind=behind, unreachable=unreachable, lost=lost,
                 gave_up=gave_up)
    if rep.lost or rep.gave_up:
        pass  # nobody is late: a message went missing, or a waiter's deadline came first
    elif blocked or stuck is not None:
        # without wait-for edges: every rank that is not inside the stuck operation
        cands = terminals if blocked else {
            r for r in range(size) if statuses[r] is None or not statuses[r].get("current")
            or (stuck is not None and not _same(statuses[r]["current"], stuck))}
        reasons = {r: _why(r, statuses[r], stuck, missing) if r < size else
                   (f"virtual rank {r}: the in-network aggregation switch did not answer",
                    True) for r in sorted(cands)}
        strong = [r for r, (_, ok) in reasons.items() if ok]
        if not strong and unreachable:  # the only candidates are reporting the failure
            reasons.update({r: (missing, True) for r in unreachable})
            strong = list(unreachable)
        rep.culprits = strong or sorted(reasons)
        rep.reasons = {r: reasons[r][0] for r in rep.culprits}
        if blocked and not terminals:
            rep.cycle = _cycle(edges, blocked[0])

    # ---- the text ----
    head = f"ringtree doctor: communicator '{comm}' ({size} ranks)"
    if stuck is not None:
        head += f": stuck in {_op_long(stuck)}"
    elif not unreachable:
        head += ": no rank is inside an operation"
    lines = [head]
    lines += ["  " + _describe(r, statuses[r], stuck_seq, missing) for r in range(size)]
    if behind:
        lines.append(f"behind: rank{'s' if len(behind) > 1 else ''} "
                     f"{', '.join(map(str, behind))} (last enqueued seq < {mark})")
    if rep.cycle:
        lines.append("deadlock: ranks " + " -> ".join(map(str, rep.cycle))
                     + " wait on each other and nobody else")
    for r, p, seq, op in rep.lost:
        verb = "send to" if op == "send" else "receive from"
        lines.append(f"inconsistent: rank {r} waits in seq {seq} to {verb} rank {p}, which "
                     f"has already completed seq {seq}")
    if rep.lost:
        lines.append("culprit: no rank is late — a message or its completion was lost between "
                     + ", ".join(sorted({f"ranks {r} and {p}" for r, p, _, _ in rep.lost}))
                     + " (a transport or schedule bug: please report it with these dumps)")
    for r, p, seq, op, later in rep.gave_up:
        verb = "send to" if op == "send" else "receive from"
        lines.append(f"timed out: rank {r} stopped waiting to {verb} rank {p} in seq {seq} "
                     f"when its deadline ran out, and rank {p} completed seq {seq} "
                     f"{later * 1e3:,.1f} ms later: nothing was lost, the timeout is shorter "
                     "than the operation takes")
    for r in rep.culprits:
        waiters = sorted(q for q in blocked if r in _reach(edges, q))
        tail = f"; rank{'s' if len(waiters) > 1 else ''} {', '.join(map(str, waiters))} " \
               f"wait{'' if len(waiters) > 1 else 's'} on it" if waiters else ""
        lines.append(f"culprit: rank {r} — {rep.reasons[r]}{tail}")
    if stuck is not None and not rep.culprits and not rep.cycle and not rep.lost \
            and not rep.gave_up:
        lines.append("culprit: unknown (no rank is blocked on a transfer yet)")
    rep.lines = lines
    return rep


def _lost(statuses: list[dict | None]
          ) -> tuple[list[tuple[int, int, int, str]], list[tuple[int, int, int, str, float]]]:
    """Waits that cannot end: the peer has already completed that collective. A wait
    whose peer completed it only after the waiter's status was taken (the waiter gave up
    on its own deadline first, e.g. a timeout shorter than the operation) is not lost: it
    goes in the second list, with how much later the peer completed."""
    out: list[tuple[int, int, int, str]] = []
    gave_up: list[tuple[int, int, int, str, float]] = []
    for r, s in enumerate(statuses):
        cur = s.get("current") if s else None
        if not cur or cur["is_p2p"]:
            continue
        for w in s.get("waiting") or []:
            p, seq = w["peer"], w.get("seq", cur["collective_seq_id"])
            ps = statuses[p] if 0 <= p < len(statuses) else None
            if ps is None or ps.get("state") == "closed":
                continue
            pc = ps.get("current")
            past = (ps.get("last_completed") or 0) >= seq or (
                pc is not None and not pc["is_p2p"] and pc["collective_seq_id"] > seq)
            if not past or any(x[:4] == (r, p, seq, w["op"]) for x in out + gave_up):
                continue
            done = next((e.get("time_discovered_completed_ns") for e in ps.get("entries") or []
                         if not e.get("is_p2p") and e.get("collective_seq_id") == seq), None)
            if done and s.get("time_ns") and done > s["time_ns"]:
                gave_up.append((r, p, seq, w["op"], (done - s["time_ns"]) / 1e9))
            else:
                out.append((r, p, seq, w["op"]))
    return out, gave_up


def _reach(edges: dict[int, list[int]], start: int) -> set[int]:
    out, todo = set(), list(edges.get(start, []))
    while todo:
        r = todo.pop()
        if r in out:
            continue
        out.add(r)
        todo.extend(edges.get(r, []))
    return out


def _cycle(edges: dict[int, list[int]], start: int) -> list[int]:
    path, r = [], start
    while r not in path and edges.get(r):
        path.append(r)
        r = edges[r][0]
    return path[path.index(r):] + [r] if r in path else path


# ---- offline -----------------------------------------------------------------------------

def load_dir(directory: str) -> dict[str, list[dict | None]]:
    """``{communicator: statuses by rank}`` from ``fr_rank*.json`` files."""
    by_comm: dict[str, dict[int, dict]] = {}
    sizes: dict[str, int] = {}
    for path in sorted(glob.glob(os.path.join(directory, "fr_rank*.json"))):
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"ringtree doctor: skipping {path}: {e}", file=sys.stderr)
            continue
        for s in doc.get("comms", []):
            by_comm.setdefault(s["comm"], {})[s["rank"]] = s
            sizes[s["comm"]] = s["size"]
    return {c: [ranks.get(r) for r in range(sizes[c])] for c, ranks in by_comm.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--net" in argv:  # reachability of every host's addresses (run it as a job)
        from ringtree.bootstrap.netmatrix import main as net_main

        return net_main([a for a in argv if a != "--net"])
    ap = argparse.ArgumentParser(prog="ringtree doctor",
                                 description="Diagnose a hung job from its dumped flight "
                                             "recorders (fr_rank*.json).")
    ap.add_argument("dirs", nargs="*", metavar="DIR",
                    help="directories with fr_rank<R>.json files, one job each (default: "
                         "the newest ringtree-fr-* dump in the temp directory)")
    ap.add_argument("--json", action="store_true", help="print the analysis as JSON")
    args = ap.parse_args(argv)
    dirs = args.dirs or newest_dumps()[:1]
    if not dirs:
        print(f"ringtree doctor: no ringtree-fr-* dumps in {tempfile.gettempdir()}; give "
              "the dump directory (RINGTREE_FR_DUMP_DIR) as DIR", file=sys.stderr)
        return 2
    results, worst = [], 0
    for d in dirs:
        comms = load_dir(d)
        if not comms:
            hint = "" if os.path.isdir(d) else " (no such directory)"
            found = ", ".join(newest_dumps()[:3])
            print(f"ringtree doctor: no fr_rank*.json in {d}{hint}; dump with SIGUSR1, "
                  "ringtree.prof.dump_flight_recorder(), or set RINGTREE_FR_DUMP_DIR"
                  + (f"; newest dumps: {found}" if found else ""), file=sys.stderr)
            worst = max(worst, 2)
            continue
        reports = [analyze(statuses, comm, OFFLINE_MISSING) for comm, statuses in
                   sorted(comms.items(), key=lambda kv: (len(kv[0]), kv[0]))]
        results.append((d, reports))
        worst = max(worst, 0 if all(r.ok for r in reports) else 1)
    if args.json:
        print(json.dumps([{"dir": d, "comm": r.comm, "size": r.size, "stuck": r.stuck,
                           "culprits": r.culprits, "reasons": r.reasons, "behind": r.behind,
                           "unreachable": r.unreachable, "cycle": r.cycle}
                          for d, reports in results for r in reports], indent=1))
    else:
        blocks = []
        for d, reports in results:
            head = f"== {d}\n" if len(dirs) > 1 else ""
            blocks.append(head + "\n\n".join(r.text() for r in reports))
        print("\n\n".join(blocks))
    return worst


def newest_dumps() -> list[str]:
    """``ringtree-fr-*`` dump directories in the temp directory, newest first."""
    found = glob.glob(os.path.join(tempfile.gettempdir(), "ringtree-fr-*"))
    return sorted((d for d in found if os.path.isdir(d)), key=os.path.getmtime, reverse=True)


if __name__ == "__main__":
    sys.exit(main())
