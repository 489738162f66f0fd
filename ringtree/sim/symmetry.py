"""Exact symmetry folding: simulate one representative per class of equivalent ranks.

If shifting every rank by g maps the run onto itself — every Program is the one g ranks
earlier with peers shifted and chunks renamed by a size-preserving bijection, every
connection's route is the same as the one g ranks earlier, devices compute at the same
speed — then rank r + g does at the same times what rank r does, and simulating ranks
0..g−1 (``compile_programs(fold=g)``) gives the exact answer. Every condition is checked;
when one fails the run is simulated whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from ringtree.core.ir import Buf, Program
from ringtree.core.plan import chunk_regions
from ringtree.sim import symbolic
from ringtree.sim.model import channel_shares, path
from ringtree.sim.topology import Topology


def _regions(blocks: int, count: int, chunks: int) -> list[int]:
    return [ln for _, ln in chunk_regions([count] * blocks, chunks)]


def _ref_ok(x, y, regs: dict, fwd: dict, bwd: dict, kp, kq) -> bool:
    if (x is None) != (y is None):
        return False
    if x is None:
        return True
    if x.buf != y.buf or x.count != y.count:
        return False
    rg = regs[x.buf]
    for j, k in zip(x.chunks(), y.chunks()):
        if rg[j] != rg[k]:
            return False
        a, b = kp(x.buf, j), kq(y.buf, k)
        if fwd.setdefault(a, b) != b or bwd.setdefault(b, a) != a:
            return False
    return True


def _step_ok(s, t, dr: int, n: int) -> bool:
    if s.reduce != t.reduce or len(s.recv_from) != len(t.recv_from) \
            or len(s.send_to) != len(t.send_to):
        return False
    return all((a - b - dr) % n == 0 for a, b in zip(s.recv_from + s.send_to,
                                                     t.recv_from + t.send_to))


def same_shape(p: Program, q: Program, dr: int, n: int, regs: dict, in_place: bool) -> bool:
    """Is Program p (rank r) Program q (rank r − dr) with peers shifted by dr and chunks
    renamed by a size-preserving bijection (so every dependency and size is the same)?"""
    if (len(p.channels) != len(q.channels) or p.chunks != q.chunks
            or p.scratch != q.scratch):
        return False
    kp, kq = p.storage_map(in_place), q.storage_map(in_place)
    fwd: dict = {}
    bwd: dict = {}
    for cp_, cq in zip(p.channels, q.channels):
        if len(cp_) != len(cq):
            return False
        for s, t in zip(cp_, cq):
            if not (_step_ok(s, t, dr, n) and _ref_ok(s.src, t.src, regs, fwd, bwd, kp, kq)
                    and _ref_ok(s.dst, t.dst, regs, fwd, bwd, kp, kq)):
                return False
    return True


def node_period(topo: Topology) -> int:
    """Ranks per node if nodes are consecutive, equal blocks of ranks, else 0."""
    n = topo.nranks
    nodes = topo.nodes()
    g0 = 1
    while g0 < n and nodes[g0] == nodes[0]:
        g0 += 1
    if n % g0 or any(nodes[r] != nodes[r - g0] + nodes[g0] - nodes[0] for r in range(g0, n)):
        return 0
    return g0


def _link_users_closed(paths: dict, g: int) -> bool:
    """Congestion-aware folding: no link carries connections of two blocks of g ranks, and
    a link shared inside a block is shared the same way in every block (checked by
    :func:`_isomorphic`)."""
    used: dict[int, int] = {}
    for (r, _, _), pth in paths.items():
        for li in pth.links:
            if used.setdefault(li, r // g) != r // g:
                return False
    return True


def _isomorphic(paths: dict, topo: Topology, g: int, n: int) -> bool:
    """Every block's routes are block 0's under one link bijection keeping every link's
    bandwidth and latency (so the FIFO links see the same contention)."""
    links = topo.links
    for base in range(g, n, g):
        fwd: dict[int, int] = {}
        bwd: dict[int, int] = {}
        for (r, q, c), pth in paths.items():
            if r >= g:
                continue
            img = paths.get((r + base, (q + base) % n, c))
            if img is None or len(img.links) != len(pth.links):
                return False
            for a, b in zip(pth.links, img.links):
                if fwd.setdefault(a, b) != b or bwd.setdefault(b, a) != a:
                    return False
                if (links[a].bandwidth, links[a].latency) != (links[b].bandwidth,
                                                              links[b].latency):
                    return False
    return True


class _Routes:
    """Routes of every connection of a run, computed once for all candidate periods."""

    def __init__(self, conns, topo: Topology, devices: list[int], aware: bool) -> None:
        self.topo, self.aware = topo, aware
        raw = {k: topo.route(devices[k[0]], devices[k[1]], k[2]) for k in conns}
        if aware:
            self.paths = {k: path(topo, v) for k, v in raw.items()}
        else:
            share = channel_shares((k[0], v) for k, v in raw.items())
            self.summary = {k: (p.latency, p.bottleneck, p.first) for k, p in
                            ((k, path(topo, v, share)) for k, v in raw.items())}

    def periodic(self, g: int, n: int) -> bool:
        if self.aware:
            return _link_users_closed(self.paths, g) and _isomorphic(self.paths, self.topo,
                                                                      g, n)
        summary = self.summary
        return all(summary.get((r - g, (q - g) % n, c)) == v
                   for (r, q, c), v in summary.items() if r >= g)


def candidates(topo: Topology, devices: list[int]) -> list[int]:
    """Shifts g worth trying: multiples of the ranks per node that divide the ranks, under
    which every rank's device reduces at the same speed as the one g earlier."""
    n = topo.nranks
    g0 = node_period(topo)
    if not g0 or n < 2:
        return []
    red = [topo.devices[devices[r]].reduce_gbps for r in range(n)]
    return [g for g in range(g0, n // 2 + 1, g0) if n % g == 0
            and all(red[r] == red[r - g] for r in range(g, n))]


def _peers_distinct(programs: Sequence[Program], g: int) -> bool:
    """Peers of one channel stay distinct modulo g (a folded connection is one peer)."""
    for a in range(g):
        for ch in programs[a].channels:
            cls: dict[int, int] = {}
            for s in ch:
                for q in s.send_to + s.recv_from:
                    if cls.setdefault(q % g, q) != q:
                        return False
    return True


def period(programs: Sequence[Program], topo: Topology, devices: list[int], count: int,
           aware: bool, in_place: bool = False) -> int:
    """The smallest shift g (a multiple of the ranks per node) under which the run is
    exactly symmetric, or 0. In the congestion-aware model no link may carry
    connections of two blocks of g ranks, and the blocks' routes must be isomorphic."""
    n = topo.nranks
    if len(programs) != n or n < 2:
        return 0
    regs = regions(programs[0], count)
    # cheap first: the Program g ranks on must be rank 0's, shifted
    gs = [g for g in candidates(topo, devices)
          if same_shape(programs[g], programs[0], g, n, regs, in_place)]
    if not gs:
        return 0
    conns = sorted({(r, q, c) for r, p in enumerate(programs)
                    for c, ch in enumerate(p.channels) for s in ch for q in s.send_to})
    routes = _Routes(conns, topo, devices, aware)
    g = next((g for g in gs if routes.periodic(g, n)), 0)
    if not g or not _peers_distinct(programs, g):
        return 0
    for r in range(g, n):
        if not same_shape(programs[r], programs[r - g], g, n, regs, in_place):
            return 0
    return g


def cannot_fold(programs: Sequence[Program], topo: Topology, devices: list[int],
                count: int, aware: bool, in_place: bool = False) -> bool:
    """True only when :func:`period` is sure to find nothing, read off rank 0's Program
    and rank g's for each candidate shift g (not all n): no candidate, rank g is not rank
    0 shifted, or (congestion-aware) a link carries connections of both (two blocks).
    False means :func:`period` has to look."""
    n = topo.nranks
    if len(programs) != n or n < 2:
        return True
    p0 = programs[0]
    regs = regions(p0, count)
    routes0: set[int] | None = None
    for g in candidates(topo, devices):
        pg = programs[g]
        if not same_shape(pg, p0, g, n, regs, in_place):
            continue
        if not aware:
            return False
        if routes0 is None:
            routes0 = _links_of(p0, topo, devices)
        if not routes0 & _links_of(pg, topo, devices):
            return False
    return True


def _links_of(p: Program, topo: Topology, devices: list[int]) -> set[int]:
    r = p.rank
    return {li for c, q in {(c, q) for c, ch in enumerate(p.channels) for s in ch
                            for q in s.send_to}
            for li in topo.route(devices[r], devices[q], c)}


def regions(p: Program, count: int) -> dict:
    """Element length of every chunk of every buffer of ``p``'s collective."""
    ib, ob = p.collective.blocks(p.nranks)
    return {Buf.INPUT: _regions(ib, count, p.chunks),
            Buf.OUTPUT: _regions(ob, count, p.chunks),
            Buf.SCRATCH: _regions(p.blocks(Buf.SCRATCH), count, p.chunks)}


def template_period(t: Program, topo: Topology, devices: list[int], count: int,
                    aware: bool, in_place: bool = False) -> int:
    """:func:`period` proved on a template (:mod:`.symbolic`) instead of n Programs:
    the Programs' symmetry from the template's expressions, the network's from the
    routes of every rank's connections (read off the template's peer offsets)."""
    n = t.nranks
    gs = candidates(topo, devices)
    if not gs or n != topo.nranks:
        return 0
    regs = regions(t, count)
    gs = symbolic.shift_periods(t, gs, regs, in_place)
    if not gs:
        return 0
    offs = tuple(tuple(sorted(os)) for os in symbolic.offsets(t))
    key = (id(topo), tuple(devices), offs, aware)
    got = _ROUTES.get(key)
    if got is None or got[0] is not topo:
        if len(_ROUTES) >= symbolic.KEEP:
            _ROUTES.clear()
        conns = [(r, (r + a) % n, c) for r in range(n) for c, os in enumerate(offs)
                 for a in os]
        got = _ROUTES[key] = (topo, _Routes(conns, topo, devices, aware), {})
    routes, seen = got[1], got[2]
    for g in gs:
        if g not in seen:
            seen[g] = routes.periodic(g, n)
        if seen[g]:
            return g
    return 0


# the routes of the last few templates' connections, and which shifts they keep (a sweep
# over sizes asks the same question at every size)
_ROUTES: dict[tuple, tuple[Topology, _Routes, dict[int, bool]]] = {}
