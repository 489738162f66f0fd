"""Spanning-tree packing at a topology's throughput bound (ForestColl).

After Zhao et al., "ForestColl: Throughput-Optimal Collective Communications on
Heterogeneous Network Fabrics" (2024/2025). A topology is a directed graph
(:class:`Graph`): ranks ``0 .. n−1``, switch vertices after them, and capacities in
GB/s on directed edges. An all-gather in which every rank broadcasts a block of ``b``
bytes takes at least ``b / x*`` where (ForestColl, Theorem 1)

    x* = min over cuts S (S holds a rank, not every rank) of B⁺(S) / |S ∩ ranks|,

B⁺(S) the capacity leaving S: every block of a rank in S must leave S. By the max-flow
min-cut theorem a rate x is within the bound iff a source joined to every rank by
capacity x sends n·x to every rank (:func:`bound` finds x* by Dinkelbach's iteration on
those minimum cuts, one max-flow per rank a round). Edmonds' branching theorem (1973)
makes the bound reachable by trees:

1. switches are removed by *edge splitting* (Lovász 1976; Bang-Jensen, Frank & Jackson
   1995; ForestColl §5): capacity γ of a pair ``u → w → v`` becomes a direct ``u → v``
   edge, γ as large as keeps every rank's max-flow at n·x* (:func:`split_switches`;
   ``allow`` keeps pairs the network would not route through w out);
2. the trees are built one by one, edge by edge, as in Lovász's constructive proof of
   Edmonds' theorem in ForestColl's weighted form: an edge joins the tree being grown
   when every rank still receives what is left to pack once the tree carries its weight;
   a finished tree takes the largest weight that leaves the rest packable, so every
   root's trees carry exactly x* (:func:`pack`, :func:`_arborescences`);
3. every root's block is cut into chunks shared among its trees by weight
   (:func:`rounded`, :func:`fewest_units`): the one approximation, reported by the
   caller.

Everything is polynomial: max-flows (networkx) times edges times trees.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

EPS = 1e-9


def _nx():
    try:
        import networkx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("schedule synthesis needs networkx (pip install ringtree[synth])"
                           ) from e
    return networkx


@dataclass
class Graph:
    """Ranks ``0 .. nranks−1`` and switches ``nranks ..``; ``caps[(u, v)]`` in GB/s."""

    nranks: int
    caps: dict[tuple[int, int], float] = field(default_factory=dict)

    def add(self, u: int, v: int, gbps: float) -> None:
        if u == v or gbps <= 0:
            raise ValueError(f"edge {u}->{v} of {gbps} GB/s: needs two vertices and a rate")
        self.caps[(u, v)] = self.caps.get((u, v), 0.0) + gbps

    def reversed(self) -> Graph:
        return Graph(self.nranks, {(v, u): c for (u, v), c in self.caps.items()})

    def vertices(self) -> set[int]:
        return set(range(self.nranks)) | {x for e in self.caps for x in e}


@dataclass(frozen=True)
class Packing:
    """``trees[i]`` = (root, parent of every rank (−1 at the root), weight in GB/s):
    every root's weights sum to ``ranks_bound``, x* of the rank graph left once the
    switches were split off; ``bound`` is x* of the topology (equal unless a pair was
    disallowed)."""

    nranks: int
    bound: float
    ranks_bound: float
    trees: tuple[tuple[int, tuple[int, ...], float], ...]


def _digraph(caps: dict, source: int | None = None, roots=(), x: float = 0.0):
    g = _nx().DiGraph()
    for (u, v), c in caps.items():
        if c > EPS:
            g.add_edge(u, v, capacity=c)
    if source is not None:
        for r in roots:
            g.add_edge(source, r, capacity=x)
    return g


def _flow(g, s, t) -> float:
    return _nx().maximum_flow_value(g, s, t)


def bound(graph: Graph, roots: list[int] | None = None) -> float:
    """x*: the largest rate every root can send to every rank at once (Dinkelbach on
    the min cuts). ``roots``: the ranks that broadcast (all for all-gather)."""
    n = graph.nranks
    roots = list(range(n)) if roots is None else roots
    if n < 2:
        return math.inf
    s = max(graph.vertices()) + 1
    x = min(sum(c for (u, v), c in graph.caps.items() if v == t) / len(set(roots) - {t})
            for t in range(n) if set(roots) - {t})
    for _ in range(64):
        if x <= EPS:
            return 0.0
        g = _digraph(graph.caps, s, roots, x)
        worst = None
        for t in range(n):
            if t not in g:
                return 0.0
            value, (side, _) = _nx().minimum_cut(g, s, t)
            if value < len(roots) * x * (1 - EPS) and (worst is None or value < worst[0]):
                worst = (value, side)
        if worst is None:
            return x
        side = worst[1] - {s}
        out = sum(c for (u, v), c in graph.caps.items() if u in side and v not in side)
        inside = sum(1 for r in roots if r in side)
        x = out / inside if inside else 0.0
    raise RuntimeError("the bound's iteration did not converge")


def _slack(caps: dict, n: int, s: int, roots: list[int], x: float, need: float,
           u: int, w: int, v: int, limit: float) -> float:
    """The most of ``u → w → v`` that can be split off keeping every rank's max-flow at
    ``need``: only cuts holding w but not u, v, or u and v but not w, lose capacity."""
    g = _digraph(caps, s, roots, x)
    sink = s + 1
    best = limit
    cases = [((u, v), (t, w)) for t in range(n) if t not in (u, v)]
    # a cut holding u and v holds a rank when one of them is a rank: one flow for all t
    cases += [((w,), (u, v))] if min(u, v) < n else [((w,), (t, u, v)) for t in range(n)]
    for srcs, sinks in cases:
        h = g.copy()
        for a in srcs:
            h.add_edge(s, a)
            h[s][a].pop("capacity", None)   # no capacity attribute: unbounded
        for b in sinks:
            h.add_edge(b, sink)
        best = min(best, _flow(h, s, sink) - need)
        if best <= EPS:
            return 0.0
    return best


def _ring_order(pair: tuple[int, int], n: int) -> tuple[int, int, int]:
    u, v = pair
    return ((v - u) % n if u < n and v < n else n, u, v)


def split_switches(graph: Graph, x: float,
                   allow: Callable[[int, int, int], bool] | None = None) -> Graph:
    """The rank graph left when every switch is split off at rate ``x`` (every rank
    keeps a max-flow of n·x from the source); capacity that cannot be split (a pair
    ``allow`` refuses) is dropped, so the result may hold less than ``x``."""
    n = graph.nranks
    caps = {e: c for e, c in graph.caps.items() if c > EPS}
    s = max(graph.vertices()) + 1
    roots = list(range(n))
    need = n * x * (1 - 1e-7)
    for w in sorted(graph.vertices() - set(range(n))):
        ins = sorted(u for (u, b) in caps if b == w)
        outs = sorted(v for (a, v) in caps if a == w)
        # neighbours in rank order round the switch: a symmetric switch becomes a ring
        for u, v in sorted(((u, v) for u in ins for v in outs), key=lambda p: _ring_order(p, n)):
            cu, cv = caps.get((u, w), 0.0), caps.get((w, v), 0.0)
            if u == v or cu <= EPS or cv <= EPS or (allow and not allow(u, w, v)):
                continue
            gamma = _slack(caps, n, s, roots, x, need, u, w, v, min(cu, cv))
            if gamma > EPS:
                caps[(u, w)] = cu - gamma
                caps[(w, v)] = cv - gamma
                caps[(u, v)] = caps.get((u, v), 0.0) + gamma
        caps = {e: c for e, c in caps.items() if w not in e and c > EPS}
    return Graph(n, caps)


def rank_graph(graph: Graph, allow: Callable[[int, int, int], bool] | None = None,
               roots: list[int] | None = None) -> tuple[float, Graph]:
    """(x* of the topology, the rank graph left once its switches are split off)."""
    n = graph.nranks
    roots = list(range(n)) if roots is None else roots
    x = bound(graph, roots)
    if n > 1 and x <= EPS:
        raise ValueError("the topology does not connect every rank to every other")
    if n == 1 or graph.vertices() == set(range(n)):
        return x, graph
    return x, split_switches(graph, x, allow)


def pack(graph: Graph, allow: Callable[[int, int, int], bool] | None = None,
         roots: list[int] | None = None, pieces: int = 0,
         split: tuple[float, Graph] | None = None) -> Packing:
    """Out-trees from every root (every rank by default) at the topology's bound: the
    switches split off (``split``: :func:`rank_graph`'s answer, computed before), then
    the trees packed with real weights summing to x* of the rank graph from every root
    (:func:`_arborescences`), each at most 1/``pieces`` of it (0: as much as fits)."""
    n = graph.nranks
    roots = list(range(n)) if roots is None else roots
    x, ranks = split or rank_graph(graph, allow, roots)
    if n == 1:
        return Packing(1, x, x, ((0, (-1,), 1.0),))
    xr = bound(ranks, roots)
    if xr <= EPS:
        raise ValueError("no rank graph is left once the switches are split off")
    cap = xr / pieces if pieces else math.inf
    return Packing(n, x, xr, tuple(_arborescences(ranks.caps, n, roots, xr * (1 - 1e-9),
                                                  cap)))


def rounded(packing: Packing, units: int) -> tuple[tuple[int, tuple[int, ...], int], ...]:
    """The trees with every root's block cut into ``units`` chunks shared by weight
    (Hamilton's largest remainders); a tree left without a chunk is dropped."""
    out = []
    for r in sorted({t[0] for t in packing.trees}):
        mine = [t for t in packing.trees if t[0] == r]
        for (_, p, _), c in zip(mine, _apportion([w for _, _, w in mine], units)):
            if c:
                out.append((r, p, c))
    return tuple(out)


def fewest_units(packing: Packing, within: float = 0.01, most: int = 64) -> int:
    """The fewest chunks per block, a power of two, that give every tree its weight
    within ``within`` of the block (``most`` if none below it does)."""
    for u in (1 << i for i in range(most.bit_length()) if 1 << i < most):
        for r in {t[0] for t in packing.trees}:
            ws = [w for root, _, w in packing.trees if root == r]
            if not _apportion(ws, u, within):
                break
        else:
            return u
    return most


def _apportion(weights: list[float], units: int, within: float = 1.0) -> list[int]:
    """``units`` shared in proportion to ``weights`` (Hamilton's largest remainders);
    [] if a share is off its weight by more than ``within`` of the units."""
    total = sum(weights)
    share = [w / total * units for w in weights]
    got = [int(q) for q in share]
    for i in sorted(range(len(share)), key=lambda i: got[i] - share[i])[:units - sum(got)]:
        got[i] += 1
    return got if all(abs(g - q) <= within * units for g, q in zip(got, share)) else []


def _arborescences(caps: dict[tuple[int, int], float], n: int, roots: list[int], x: float,
                   cap: float = math.inf) -> list[tuple[int, tuple[int, ...], float]]:
    """Weighted out-trees spanning the ranks, x from every root, within ``caps``
    (Edmonds 1973, Lovász's constructive proof, in ForestColl's weighted form): the
    source ``n`` has an edge of capacity x to every root; trees are grown one at a time
    (:func:`_grow`), each taking the largest weight, at most ``cap``, that leaves the
    rest packable (:func:`_weight`)."""
    s = n
    d = dict(caps)
    for r in roots:
        d[(s, r)] = x
    need = x * len(roots)
    tol = need * 1e-9
    trees = []
    while need > tol * len(roots) and len(trees) < 50 * n * n:
        # a tree that can carry a whole ``cap`` (each check made with it) if one is
        # found, else any tree at all, weighed afterwards
        grown = _grow(d, n, need, tol, cap) if cap < need else None
        w = cap
        if grown is None:
            grown = _grow(d, n, need, tol, need * 1e-6)
            if grown is None:
                raise RuntimeError("no edge keeps the packing (Edmonds' condition failed)")
            w = min(_weight(d, grown[1], n, need, tol), cap)
        parent, edges = grown
        for e in edges:
            d[e] -= w
        need -= w
        trees.append((parent.index(-1), tuple(parent), w))
    return trees


def _grow(d: dict, n: int, need: float, tol: float, step: float
          ) -> tuple[list[int], list[tuple[int, int]]] | None:
    """One tree from the source ``n``, breadth first (shallow trees pipeline): an edge
    u → v joins when, that edge lowered by ``step`` and the tree's vertices fed
    ``step``, v still receives ``need`` (only cuts holding v lose capacity, and each of
    them then holds a tree vertex). None when no edge passes."""
    nx = _nx()
    s, feed = n, n + 1
    g = _digraph(d)
    g.add_edge(s, feed, capacity=step)
    parent, depth, edges = [-1] * n, {s: -1}, []
    while len(depth) <= n:
        cands = sorted(((depth[u], -round(c / step, 6), u, v) for (u, v), c in d.items()
                        if c >= step * (1 - 1e-9) and u in depth and v not in depth
                        and (u != s or len(depth) == 1)))
        for _, _, u, v in cands:
            g[u][v]["capacity"] = d[(u, v)] - step
            g.add_edge(feed, v)
            if nx.maximum_flow_value(g, s, v) >= need - tol:
                break
            g.remove_edge(feed, v)
            g[u][v]["capacity"] = d[(u, v)]
        else:
            return None
        depth[v] = depth[u] + 1
        edges.append((u, v))
        if u != s:
            parent[v] = u
    return parent, edges


def _weight(d: dict, edges: list[tuple[int, int]], n: int, need: float, tol: float
            ) -> float:
    """The largest weight w the tree ``edges`` can take: every rank still receives
    ``need − w`` with w less on each tree edge. A cut X entered e ≥ 1 times by the tree
    allows w ≤ (ρ(X) − need)/(e − 1): Dinkelbach's iteration on the min cuts."""
    nx = _nx()
    s = n
    w = min(d[e] for e in edges)
    inside = set(edges)
    for _ in range(32):
        g = _digraph({e: c - w if e in inside else c for e, c in d.items()})
        g.add_node(s)
        worst = None
        for t in range(n):
            if t not in g:
                value, side = 0.0, {s}
            else:
                value, (side, _) = nx.minimum_cut(g, s, t)
            if value < need - w - tol and (worst is None or value < worst[0]):
                worst = (value, side)
        if worst is None:
            return w
        side = worst[1]
        rho = sum(c for (a, b), c in d.items() if a in side and b not in side)
        enter = sum(1 for a, b in edges if a in side and b not in side)
        w = max(0.0, (rho - need) / (enter - 1)) if enter > 1 else 0.0
    return w
