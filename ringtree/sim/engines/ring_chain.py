"""The ring all-reduce of one-element blocks (:mod:`ringtree.sim.compile.ring_chain`) in
the congestion-aware model: every block's chain evaluated hop by hop with the reference
engine's own additions, one vector per hop over the classes of blocks that see the same
connections.

What the reference engine (:mod:`.reference`) does to such a run, read off its rules:
every step is issued at time 0 (no memory dependencies; a channel's next step waits for
this one's *start*), so an empty step is done at 0 and a moving step of block b at hop k
is ready when its message arrives, ``A``, plus its γ (``A + ops·bytes/R`` when the step
computes). Its message is injected at ``I = max(ready, the connection's last injection)``
and crosses the route's links in turn, each a FIFO: ``st = max(t, free)``, ``t = (st +
bytes/B) + latency``, starting from ``I + o``; it is delivered at ``max(t, the
connection's last delivery)``. A step is done at ``max(ready, I + bytes/B_first)`` (the
last recv at its ready time); the run's time is the latest step done.

When no link is used by two connections and the message before this one on the same
connection (block b + 1 one hop earlier; after the empty blocks, block 0) was injected at
least the route's largest ``bytes/B`` plus the rounding of every addition on the way
earlier, every one of those maxima takes its first argument, so a chain's times are the
additions alone: ``I + o``, then ``+ bytes/B`` and ``+ latency`` per link, then ``+ γ``,
hop after hop. Both conditions are checked on the run (the engine declines otherwise,
and the plans before this one answer). Routes repeat with the topology's period P (the
smallest divisor of n under which every connection's links, rates and γ repeat; found,
not assumed), so blocks b and b + P add the same numbers in the same order and have the
same floats: min(P, count) chains are evaluated, 2n − 1 hops each.
"""

from __future__ import annotations

import numpy as np

from ringtree.sim.compile.ring_chain import RingChain
from ringtree.sim.engines.contract import Declined, Job, Outcome, aware_untraced
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Rules, compute_ns

__all__ = ["RingChainEngine", "evaluate"]


class RingChainEngine:
    """The chains of a ring all-reduce of one-element blocks (see the module)."""

    name = "ring_chain"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        if getattr(job.plan, "ring", None) is None:
            return "not a ring all-reduce of one-element blocks"
        if rules.integer_ns:
            return "the integer clock (truncations between the additions)"
        return aware_untraced(job, rules)

    def run(self, job: Job) -> Outcome | Declined:
        plan = job.plan
        got = evaluate(plan.ring, job.topo, job.devices, job.rules)
        if isinstance(got, str):
            if plan.fallback is not None:
                job.plan = plan.fallback()         # the plan the run had without chains
            return Declined(got)
        return Outcome(got, plan.ring.messages)


# the last graph's routes r → r + 1: (its devices, link ends, routing, ranks' devices,
# routes). A route is a function of the graph alone (:mod:`ringtree.sim.machine.routing`
# reads no rate or latency), so the topologies NCCL's protocols price
# (:func:`ringtree.sim.machine.protocols.priced`: the same devices and links, other
# rates) share it
_LAST: list[tuple] = []


def _graph(topo: Topology, devices: list[int]) -> tuple:
    return (tuple((lk.src, lk.dst) for lk in topo.links), topo.routing, topo.uplinks,
            tuple((kind, size) for kind, size, _, _ in topo.dims), tuple(devices))


def _route_ids(topo: Topology, devices: list[int]) -> list[tuple[int, ...]]:
    """The links of every connection r → r + 1 of channel 0."""
    graph = _graph(topo, devices)
    if _LAST and _LAST[0][0] is topo.devices and _LAST[0][1] == graph:
        return _LAST[0][2]
    n = len(devices)
    got = [topo.route(devices[r], devices[(r + 1) % n], 0) for r in range(n)]
    _LAST[:] = [(topo.devices, graph, got)]
    return got


def _routes(spec: RingChain, topo: Topology, devices: list[int]
            ) -> list[tuple] | str:
    """Every connection r → r + 1's links as ((rate, latency), …), or why the chains do
    not apply (a link two connections use)."""
    n = spec.n
    seen: set[int] = set()
    rows = []
    for r, links in enumerate(_route_ids(topo, devices)):
        if not links:
            return f"ranks {r} and {(r + 1) % n} share a device"
        for li in links:
            if li in seen:
                return f"link {li} is used by more than one connection"
            seen.add(li)
        rows.append(tuple((topo.bytes_per_ns(li), topo.links[li].latency) for li in links))
    return rows


def period(rows: list, n: int) -> int:
    """The smallest divisor d of n with ``rows[r] == rows[r mod d]`` for every r."""
    for d in range(1, n + 1):
        if n % d == 0 and rows[d:] == rows[:-d]:
            return d
    return n


def evaluate(spec: RingChain, topo: Topology, devices: list[int], rules: Rules
             ) -> float | str:
    """The run's time (the latest step done, without the launch cost), or why the chains
    do not give the reference engine's floats here."""
    n, nb = spec.n, spec.nbytes
    got = _routes(spec, topo, devices)
    if isinstance(got, str):
        return got
    red = rules.reduce_rates(topo, devices)
    rows = [(links, red[(r + 1) % n]) for r, links in enumerate(got)]
    p = period(rows, n)
    q = min(p, spec.count)
    hops = max(len(links) for links, _ in rows[:p])
    idx = np.arange(p + q) % p                    # a slice [s, s + q) is (s + c) mod p

    def column(f) -> np.ndarray:
        return np.array([f(r) for r in range(p)], dtype=np.float64)[idx]

    ser = [column(lambda r, h=h: nb / rows[r][0][h][0] if h < len(rows[r][0]) else 0.0)
           for h in range(hops)]
    lat = [column(lambda r, h=h: rows[r][0][h][1] if h < len(rows[r][0]) else 0.0)
           for h in range(hops)]
    first = column(lambda r: nb / rows[r][0][0][0])
    widest = column(lambda r: max(nb / rate for rate, _ in rows[r][0]))
    comp = {o: column(lambda r, o=o: compute_ns(nb, o, rows[r][1]))
            for o in set(spec.ops) if o}
    return _chains(spec, p, q, rules.overhead_ns, ser, lat, first, widest, comp)


def _chains(spec: RingChain, p: int, q: int, over: float, ser: list, lat: list,
            first: np.ndarray, widest: np.ndarray, comp: dict) -> float | str:
    """Hop by hop, the q chains' ready times (a vector), the latest done and the least
    spare time between consecutive messages of a connection."""
    n, count = spec.n, spec.count
    last = 2 * n - 2
    o = spec.ops[0]
    t = np.zeros(q) + comp[o][:q] if o else np.zeros(q)   # step 0: rank c + 1, receiver of c
    prev = t
    done = np.zeros(q)
    spare = np.full(max(q - 1, 0), np.inf)     # class c after class c + 1, a hop earlier
    buf = np.empty(max(q - 1, 0))
    lead = np.empty(last + 1)                    # block 0's ready time per hop
    tail = np.empty(last + 1)                    # block count − 1's
    end_ = np.empty(last + 1)                    # class q − 1's
    for k in range(last + 1):
        lead[k], tail[k], end_[k] = t[0], t[(count - 1) % p], t[q - 1]
        if k == last:
            np.maximum(done, t, out=done)
            break
        s = (k + 1) % p                          # connection of class 0 at this hop
        if k and q > 1:
            np.subtract(t[:-1], prev[1:], out=buf)
            buf -= widest[s:s + q - 1]
            np.minimum(spare, buf, out=spare)
        np.maximum(done, t + first[s:s + q], out=done)   # ≥ t: the send is the later
        prev = t
        x = t + over
        for h in range(len(ser)):
            x = x + ser[h][s:s + q]
            x = x + lat[h][s:s + q]
        o = spec.ops[spec.kind(k + 1)]
        t = x + comp[o][s:s + q] if o else x
    end = float(done.max())
    least = float(spare.min()) if spare.size else np.inf
    ks = np.arange(1, last)
    if count > p:                                # class p − 1 after class 0 a hop earlier
        gap = end_[1:last] - lead[:last - 1] - widest[(q + ks) % p]
        least = min(least, float(gap.min(initial=np.inf)))
    lag = n - count + 1                          # block count − 1 after block 0, lag hops
    if lag <= last - 1:
        ks = np.arange(lag, last)
        gap = tail[lag:last] - lead[:last - lag] - widest[(count + ks) % p]
        least = min(least, float(gap.min()))
    margin = (2 * len(ser) + 4) * float(np.spacing(end))
    if not least >= margin:
        return (f"consecutive messages of a connection {least:.3g} ns apart beyond the "
                f"widest link's time: the FIFOs may hold one back")
    return end
