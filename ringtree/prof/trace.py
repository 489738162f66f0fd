"""Merge the ranks' profiler files into one Chrome/Perfetto trace (the text summary of the
same files: :mod:`ringtree.prof.summary`).

Layout (what you see in https://ui.perfetto.dev or chrome://tracing):

- one process per rank (``pid`` = world rank), named ``rank R (host)``;
- per communicator, a thread ``collectives`` (one slice per call: name, seq, algorithm,
  bytes, algbw/busbw), a thread ``idle`` (the rank slept in the transports' wait: nothing
  could move, it was waiting for peers) and one thread per channel with the steps
  (``send``, ``recvReduceSend`` …) and, nested in each, its ``recv wait`` / ``reduce`` /
  ``send drain`` slices. Steps of one channel can overlap (a send still draining while
  the next step receives); overlapping steps go to extra threads ``ch 0 (2)`` …, as NPKit
  does with its "fibers", so every thread's slices nest properly;
- a flow arrow from every message's send to the matching receive. Messages match by
  ``(sender, receiver, channel, seq, index)`` — the IR's rule that messages of one
  (sender, receiver, channel) match in order, with the index counted within the call;
- timestamps in µs, each rank's clock shifted by its estimated offset to rank 0.

Begin/end events are emitted as ``B``/``E`` pairs that nest per thread; a collective that
never finished (a hang) is closed at the rank's last event with ``"unfinished": true``.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ringtree.prof.recorder import PRIMS, Ev

_BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


@dataclass
class Span:
    kind: str                 # coll | step | recv | reduce | sendwait | idle
    start: int                # ns, aligned
    end: int
    chan: int
    peer: int
    seq: int
    gid: int
    prim: int
    size: int
    aux: int
    unfinished: bool = False
    tid: int = 0
    depth: int = 0
    name: str = ""
    args: dict = field(default_factory=dict)


@dataclass
class RankComm:
    """One rank's events on one communicator."""

    rank: int                 # rank in the communicator
    world_rank: int
    meta: dict
    spans: list[Span]
    sends: list[tuple]        # (ts, chan, peer, seq, gid, size, index)


_SPANS = {Ev.STEP: "step", Ev.RECV_WAIT: "recv", Ev.REDUCE: "reduce",
          Ev.SEND_WAIT: "sendwait", Ev.IDLE: "idle"}


def _pair(events: np.ndarray, offset: int) -> tuple[list[Span], list[tuple]]:
    """Spans (collectives paired ENTRY/EXIT; the rest carry their duration) and sends."""
    spans: list[Span] = []
    sends: list[tuple] = []
    open_: dict[tuple, list] = defaultdict(list)
    last = 0
    for ts, dur, size, aux, chan, peer, seq, gid, typ, prim in events.tolist():
        ts -= offset
        last = max(last, ts + dur)
        if typ == Ev.SEND:
            sends.append((ts, chan, peer, seq, gid, size, aux))
        elif typ in _SPANS:
            spans.append(Span(_SPANS[typ], ts, ts + dur, chan, peer, seq, gid, prim, size,
                              aux))
        elif typ == Ev.COLL_ENTRY:
            open_[(chan, seq)].append(Span("coll", ts, ts, chan, peer, seq, gid, prim, size,
                                           aux))
        elif typ == Ev.COLL_EXIT:
            stack = open_.get((chan, seq))
            if stack:  # an exit whose entry fell off the ring is dropped
                sp = stack.pop()
                sp.end = ts
                spans.append(sp)
    for stack in open_.values():
        for sp in stack:
            sp.end, sp.unfinished = max(last, sp.start), True
            spans.append(sp)
    return spans, sends


class Overlap:
    """Total time of a set of disjoint spans that falls inside [a, b] (bisect + prefix
    sums). A rank runs one call at a time per communicator, so the idle and reduce time
    inside a collective's interval is that collective's."""

    def __init__(self, spans: list[Span]):
        spans = sorted(spans, key=lambda sp: sp.start)
        self.starts = [sp.start for sp in spans]
        self.ends = [sp.end for sp in spans]
        self.prefix = [0]
        for sp in spans:
            self.prefix.append(self.prefix[-1] + sp.end - sp.start)

    def within(self, a: int, b: int) -> int:
        i = bisect.bisect_right(self.ends, a)      # first span ending after a
        j = bisect.bisect_left(self.starts, b)     # spans starting before b
        if j <= i:
            return 0
        total = self.prefix[j] - self.prefix[i]
        total -= max(0, a - self.starts[i])          # clip the first
        total -= max(0, self.ends[j - 1] - b)        # and the last
        return max(0, total)


def load(directory: str) -> dict[str, list[RankComm]]:
    """``{communicator prefix: [RankComm per rank that wrote a file]}``."""
    out: dict[str, list[RankComm]] = defaultdict(list)
    paths = sorted(glob.glob(os.path.join(directory, "rank*.npz")))
    if not paths:
        raise FileNotFoundError(f"no rank*.npz profiler files in {directory}")
    for path in paths:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            for k, cm in enumerate(meta["comms"]):
                spans, sends = _pair(z[f"events{k}"], int(cm["clock"]["offset_ns"]))
                out[cm["prefix"]].append(RankComm(cm["rank"], cm["world_rank"], cm, spans,
                                                  sends))
    for lst in out.values():
        lst.sort(key=lambda rc: rc.rank)
    return dict(out)


def _gbps(nbytes: int, ns: int) -> float:
    return round(nbytes / max(ns, 1), 4)  # bytes/ns == GB/s


def chan_name(ch: int) -> str:
    return f"p2p tag {ch - 64}" if ch >= 64 else f"ch {ch}"


def build(directory: str) -> dict:
    """The merged trace as a dict (``{"traceEvents": [...], ...}``)."""
    return _Builder(load(directory)).build()


class _Builder:
    """Turns every communicator's spans into Chrome trace events: per rank a process,
    per channel fibers of steps with their waits nested, and flows from each send to the
    receive it matched."""

    def __init__(self, comms: dict):
        self.comms = comms
        self.order = sorted(comms, key=lambda p: (len(p), p))
        t0 = min((sp.start for rcs in comms.values() for rc in rcs for sp in rc.spans),
                 default=0)
        self.t0 = min([t0] + [s[0] for rcs in comms.values() for rc in rcs for s in rc.sends])
        self.events: list[dict] = []
        self.named_pids: set[int] = set()
        self.stats = {"flows": 0, "unmatched_sends": 0, "unmatched_recvs": 0, "dropped": 0,
                      "unfinished": 0}
        self.clocks: dict[str, dict] = {}

    def us(self, ns: int) -> float:
        return round((ns - self.t0) / 1000.0, 3)

    def build(self) -> dict:
        multi = len(self.order) > 1
        for ci, prefix in enumerate(self.order):
            recv_at: dict[tuple, tuple[int, int, int]] = {}    # flow key -> (pid, tid, ts)
            send_at: list[tuple[tuple, int, int, int, int]] = []
            for rc in self.comms[prefix]:
                self._rank(prefix, rc, ci * 100000, f"{prefix} " if multi else "", recv_at,
                           send_at)
            self._flows(send_at, recv_at)
        return {"traceEvents": self.events, "displayTimeUnit": "ns",
                "otherData": {"generator": "ringtree trace", "clock": self.clocks,
                              **self.stats}}

    def _rank(self, prefix: str, rc, base: int, label: str, recv_at: dict,
              send_at: list) -> None:
        pid, events = rc.world_rank, self.events
        self.stats["dropped"] += rc.meta.get("dropped", 0)
        self.clocks[f"{prefix}:{rc.rank}"] = rc.meta["clock"]
        if pid not in self.named_pids:
            self.named_pids.add(pid)
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"rank {pid} ({rc.meta.get('host', '?')})"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                           "args": {"sort_index": pid}})
        tids = {base + 1: f"{label}collectives", base + 2: f"{label}idle"}
        by_id = _fibers(rc, base, label, tids)
        wait = Overlap([sp for sp in rc.spans if sp.kind == "idle"])
        red = Overlap([sp for sp in rc.spans if sp.kind == "reduce"])
        for sp in rc.spans:
            if sp.unfinished:
                self.stats["unfinished"] += 1
                sp.args["unfinished"] = True
            if sp.kind == "coll":
                _coll_span(sp, rc, base + 1, wait, red)
            elif sp.kind == "idle":
                sp.tid, sp.name = base + 2, "idle"
                sp.args = {"seq": sp.seq, **sp.args}
            elif sp.kind in ("recv", "reduce", "sendwait"):
                _inner_span(sp, _owner(by_id, sp), rc, recv_at)
        for ts, chan, peer, seq, gid, size, idx in rc.sends:
            st = next((c for c in by_id.get((chan, seq, gid), [])
                       if c.start <= ts <= c.end), None)
            if st is None:
                continue
            key = (pid, rc.meta["world_ranks"][peer], chan, seq, idx)
            send_at.append((key, pid, st.tid, ts, size))
        events.extend(_nest(pid, [sp for sp in rc.spans if sp.tid], self.us))
        for tid, name in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid,
                           "tid": tid, "args": {"sort_index": tid}})

    def _flows(self, send_at: list, recv_at: dict) -> None:
        """One flow per send whose receive was recorded (matched by connection, call
        and message index)."""
        matched, stats, us = set(), self.stats, self.us
        for key, pid, tid, ts, size in send_at:
            dst = recv_at.get(key)
            if dst is None:
                stats["unmatched_sends"] += 1
                continue
            matched.add(key)
            fid = stats["flows"] = stats["flows"] + 1
            args = {"bytes": size, "channel": key[2], "seq": key[3], "index": key[4],
                    "bw (GB/s)": _gbps(size, dst[2] - ts)}
            self.events.append({"ph": "s", "id": fid, "pid": pid, "tid": tid, "ts": us(ts),
                                "name": "transfer", "cat": "transfer", "args": args})
            self.events.append({"ph": "f", "bp": "e", "id": fid, "pid": dst[0],
                                "tid": dst[1], "ts": us(dst[2]), "name": "transfer",
                                "cat": "transfer"})
        stats["unmatched_recvs"] += len(set(recv_at) - matched)


def _fibers(rc, base: int, label: str, tids: dict) -> dict[tuple, list[Span]]:
    """Lay the steps of each channel on fibers (a new one when a step overlaps every
    fiber's last); name the threads in ``tids``; the steps by (chan, seq, step id)."""
    calls = rc.meta["calls"]
    coll_names = {(sp.chan >= 64, sp.seq): calls[sp.aux]["name"] for sp in rc.spans
                  if sp.kind == "coll" and 0 <= sp.aux < len(calls)}
    steps = sorted((sp for sp in rc.spans if sp.kind == "step"),
                   key=lambda sp: (sp.start, sp.end))
    chans = sorted({sp.chan for sp in steps} | {sp.chan for sp in rc.spans
                                                if sp.kind in ("recv", "reduce", "sendwait")})
    cidx = {ch: i for i, ch in enumerate(chans)}
    fibers: dict[int, list[int]] = defaultdict(list)   # chan -> end of each fiber
    by_id: dict[tuple, list[Span]] = defaultdict(list)
    for sp in steps:
        ends = fibers[sp.chan]
        f = next((i for i, e in enumerate(ends) if e <= sp.start), len(ends))
        if f == len(ends):
            ends.append(sp.end)
        else:
            ends[f] = sp.end
        f = min(f, 99)
        sp.tid = base + 100 * (cidx[sp.chan] + 1) + f
        tids[sp.tid] = f"{label}{chan_name(sp.chan)}" + (f" ({f + 1})" if f else "")
        by_id[(sp.chan, sp.seq, sp.gid)].append(sp)
        prim = PRIMS[sp.prim] if 0 <= sp.prim < len(PRIMS) else f"prim{sp.prim}"
        sp.name = prim or "step"
        sp.args = {"seq": sp.seq, "step": sp.gid,
                   "collective": coll_names.get((sp.chan >= 64, sp.seq), "?"),
                   "recv_from": sp.peer, "send_to": sp.aux, "bytes": sp.size,
                   "bw (GB/s)": _gbps(sp.size, sp.end - sp.start)}
    return by_id


def _owner(by_id: dict, sp: Span) -> Span | None:
    """The step a wait or reduce span belongs to."""
    cands = by_id.get((sp.chan, sp.seq, sp.gid))
    if not cands:
        return None
    for c in cands:
        if c.start <= sp.start <= c.end:
            return c
    return cands[0]


def _coll_span(sp: Span, rc, tid: int, wait: Overlap, red: Overlap) -> None:
    calls, n = rc.meta["calls"], rc.meta["size"]
    sp.tid = tid
    c = calls[sp.aux] if 0 <= sp.aux < len(calls) else {}
    sp.name = c.get("name", "collective")
    dur = sp.end - sp.start
    nbytes = c.get("bytes", sp.size)
    sp.args = {"seq": sp.seq, "algo": c.get("algo"), "proto": c.get("proto"), "bytes": nbytes,
               "count": c.get("count"), "dtype": c.get("dtype"),
               "op": c.get("op"), "algbw (GB/s)": _gbps(nbytes, dur),
               "wait (us)": round(wait.within(sp.start, sp.end) / 1000, 3),
               "reduce (us)": round(red.within(sp.start, sp.end) / 1000, 3),
               **sp.args}
    factor = _BUSBW.get(sp.name)
    if factor is not None and n > 1:
        sp.args["busbw (GB/s)"] = round(_gbps(nbytes, dur) * factor(n), 4)


def _inner_span(sp: Span, st: Span | None, rc, recv_at: dict) -> None:
    """A receive wait, reduce or send drain, nested in its step ``st`` (clamped to it)."""
    if st is None:
        return
    sp.tid, sp.depth = st.tid, 1
    sp.start = min(max(sp.start, st.start), st.end)
    sp.end = min(max(sp.end, sp.start), st.end)
    if sp.kind == "recv":
        sp.name = f"recv wait ← {sp.peer}"
        sp.args = {"from": sp.peer, "bytes": sp.size, "index": sp.aux,
                   "bw (GB/s)": _gbps(sp.size, sp.end - sp.start), **sp.args}
        pid = rc.world_rank
        key = (rc.meta["world_ranks"][sp.peer], pid, sp.chan, sp.seq, sp.aux)
        recv_at[key] = (pid, sp.tid, max(sp.start, sp.end - 1))
    elif sp.kind == "reduce":
        sp.name = "reduce"
        sp.args = {"bytes": sp.size, "GB/s": _gbps(sp.size, sp.end - sp.start), **sp.args}
    else:
        sp.name = "send drain"
        sp.args = {"to": sp.peer, **sp.args}


def _nest(pid: int, spans: list[Span], us) -> list[dict]:
    """B/E events per thread, properly nested (parents before children)."""
    out: list[dict] = []
    by_tid: dict[int, list[Span]] = defaultdict(list)
    for sp in spans:
        by_tid[sp.tid].append(sp)
    for tid, lst in by_tid.items():
        lst.sort(key=lambda sp: (sp.start, -sp.end, sp.depth))
        stack: list[Span] = []
        for sp in lst:
            while stack and not (stack[-1].start <= sp.start and sp.end <= stack[-1].end):
                top = stack.pop()
                out.append({"ph": "E", "pid": pid, "tid": tid, "ts": us(top.end),
                            "name": top.name})
            if stack and sp.depth <= stack[-1].depth:  # siblings never nest: close first
                top = stack.pop()
                out.append({"ph": "E", "pid": pid, "tid": tid, "ts": us(top.end),
                            "name": top.name})
            out.append({"ph": "B", "pid": pid, "tid": tid, "ts": us(sp.start),
                        "name": sp.name, "cat": sp.kind, "args": sp.args})
            stack.append(sp)
        while stack:
            top = stack.pop()
            out.append({"ph": "E", "pid": pid, "tid": tid, "ts": us(top.end),
                        "name": top.name})
    return out


def write(directory: str, path: str) -> dict:
    trace = build(directory)
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return trace
