"""Exact symmetry folding: simulate one representative per class of equivalent ranks.

If a group of rank permutations — shifts by multiples of g ranks, or XOR of aligned
blocks of g ranks — maps the run onto itself (every Program is its parent's with peers
moved and chunks renamed by a size-preserving bijection, positionally, by a XOR mask
per buffer or by sets, :mod:`.moved`; the network's routes are kept, :mod:`.orbits`;
devices compute at the same speed), then every rank does at the same times what its representative r mod g does,
and simulating ranks 0..g−1 (``compile_programs(fold=g)``) gives the exact answer. Every
condition is checked; when one fails the run is simulated whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ringtree.ir.program import Program
from ringtree.sim.compile import symbolic, xor_symbolic
from ringtree.sim.compile.compiled import image
from ringtree.sim.compile.recent import Recent
from ringtree.sim.fold import split
from ringtree.sim.fold.moved import (
    _labels,
    _peers_ok,
    _renamed,
    _xor_keeps_lengths,
    _xor_masks,
    regions,
    same_shape,
)
from ringtree.sim.fold.orbits import Fold, Routes, generators
from ringtree.sim.machine.cluster import Topology


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


def kinds(g: int, n: int) -> tuple[bool, ...]:
    """Folds of g ranks to try: shifts, and XOR when the blocks are a power of two."""
    b = n // g
    return (False, True) if b > 2 and b & (b - 1) == 0 else (False,)


def _blocks(g: int, n: int, xor: bool) -> list[tuple[int, int, int]]:
    """(block, parent block, element) for every block but 0, each parent the block
    visited just before it: a spanning path of the blocks under the generators (shifts:
    b − 1; XOR: the Gray code order, whose neighbours differ in one bit)."""
    if not xor:
        return [(b, b - 1, 1) for b in range(1, n // g)]
    gray = [i ^ (i >> 1) for i in range(n // g)]
    return [(gray[i], gray[i - 1], gray[i] ^ gray[i - 1]) for i in range(1, n // g)]


def find(programs: Sequence[Program], topo: Topology, devices: list[int], count: int,
         aware: bool, in_place: bool = False, key: tuple | None = None) -> Fold | None:
    """The fold of fewest ranks (g a multiple of the ranks per node, shifts tried before
    XOR) under which the run is exactly symmetric, or None: every Program is its parent's
    (:func:`_blocks`) moved by a generator, and the routes are as :meth:`Routes.fold`
    says. ``key`` names what generated ``programs`` (its first four fields the Programs,
    as the registry's cache does): what does not depend on the count is then kept for
    the next call (a sweep over sizes): the routes' folds per topology; the ranks' scan,
    connections and (per chunk-length pattern) renamings for any topology, so the
    topologies NCCL's protocols price (other rates only) prove them once."""
    n = topo.nranks
    if len(programs) != n or n < 2:
        return None
    regs = regions(programs[0], count)
    # cheap first: the Program of each generator's image of rank 0 must be rank 0's, moved
    tries = [(g, x) for g in candidates(topo, devices) for x in kinds(g, n)
             if _images_moved(programs, g, x, n, regs, in_place, key)]
    if not tries:
        return None
    kept = _kept(("routes", key, id(topo), tuple(devices), aware), topo, key)
    routes = None
    scans: dict = {}                         # the ranks' pass, where the routes needed it
    for g, x in tries:
        proof = _template_masks(programs, g, x, in_place, key)
        if (g, x) not in kept:
            if routes is None:
                if proof is not None:        # every rank's connections off the template
                    routes = _routes(xor_symbolic.connections(proof[0]), topo, devices,
                                     aware)
                else:
                    conns: set = set()       # read by the ranks' pass when it runs
                    got = scans[(g, x)] = _scanned(programs, g, x, n, in_place, topo, key,
                                                   conns)
                    if got is False:
                        continue
                    conns = conns or _kept(("conns", key and key[:4]), topo, key).get(0) \
                        or _conns(programs)
                    routes = _routes(conns, topo, devices, aware)
            kept[(g, x)] = routes.fold(g, n, x)
        f = kept[(g, x)]
        if f is None:
            continue
        if proof is not None and _lengths_kept(proof[1], regs):
            return f                         # every rank proved on the template
        # the chunks' renamings (the costly part) only where the routes keep the fold
        if _renamings(programs, g, x, n, regs, in_place, topo, key, scans.get((g, x))):
            return f
    return None


def _images_moved(programs: Sequence[Program], g: int, x: bool, n: int, regs: dict,
                  in_place: bool, key: tuple | None) -> bool:
    """Is rank g (a shift) or every generator's image of rank 0 (a XOR: ranks g·2^k) rank
    0's Program moved? Necessary for the fold; a XOR template that proves the fold with
    the lengths kept answers for the other generators."""
    p0 = programs[0]
    if not same_shape(programs[g], p0, 1 if x else g, n, regs, in_place, g if x else 0):
        return False
    if not x:
        return True
    proof = _template_masks(programs, g, x, in_place, key)
    return (proof is not None and _lengths_kept(proof[1], regs)) or all(
        same_shape(programs[h * g], p0, h, n, regs, in_place, g)
        for h in generators(g, n, x)[1:])


def _lengths_kept(masks: list[dict], regs: dict) -> bool:
    return all(_xor_keeps_lengths(regs[b], m) for ms in masks for b, m in ms.items() if m)


def _template_masks(programs: Sequence[Program], g: int, x: bool, in_place: bool,
                    key: tuple | None) -> tuple[Program, list[dict]] | None:
    """The XOR template of the Programs ``key`` names and its generators' chunk masks
    (:func:`.xor_symbolic.xor_masks`: what the ranks' scan and renamings prove, for
    every rank at once), when it proves the XOR fold of g ranks; else None."""
    if not x or key is None:
        return None
    t = xor_symbolic.xor_template(*key[:4])
    if t is None or not xor_symbolic.proved(t, programs):
        return None
    masks = xor_symbolic.xor_masks(t, g, in_place)
    return None if masks is None else (t, masks)


def _renamings(programs: Sequence[Program], g: int, x: bool, n: int, regs: dict,
               in_place: bool, topo: Topology, key: tuple | None, got=None) -> bool:
    """:func:`_all_ranks`, kept per chunk-length pattern for the Programs ``key`` names
    (the renamings read the lengths only through which are equal, :func:`pattern`)."""
    if key is None:
        return _all_ranks(programs, g, x, n, regs, in_place, topo, key, got)
    kept = _RENAMED.lookup((key[:4], in_place, g, x, _labels(regs)), dict)
    if 0 not in kept:
        kept[0] = _all_ranks(programs, g, x, n, regs, in_place, topo, key, got)
    return kept[0]


def _conns(programs: Sequence[Program], first: int = 0, into: set | None = None) -> set:
    """(rank, peer, channel) of every send of ``programs`` (rank ``first`` on)."""
    out = set() if into is None else into
    out.update((r, q, c) for r, p in enumerate(programs, first)
               for c, ch in enumerate(p.channels) for s in ch for q in s.send_to)
    return out


def _routes(conns: set | np.ndarray, topo: Topology, devices: list[int], aware: bool
            ) -> Routes | split.SplitRoutes:
    """The routes of ``conns`` (tuples, or rows that may repeat): split at the GPUs'
    hops when there are many (:mod:`.split`), else whole."""
    got = split.SplitRoutes.make(conns, topo, devices) \
        if aware and len(conns) >= split.SPLIT_FROM else None
    if got is None and isinstance(conns, np.ndarray):
        conns = set(map(tuple, conns.tolist()))
    return got or Routes(sorted(conns), topo, devices, aware)


def _kept(k: tuple, topo: Topology, key: tuple | None) -> dict:
    """The dict kept under ``k`` (a fresh one when ``key`` is None), held with ``topo``
    for the routes, for every topology for what reads the Programs alone."""
    if key is None:
        return {}
    return _FIND.lookup(k, dict, topo) if k[0] == "routes" else _FIND.lookup(k, dict)


def _scanned(programs: Sequence[Program], g: int, x: bool, n: int, in_place: bool,
             topo: Topology, key: tuple | None, conns: set | None = None):
    """What :func:`_all_ranks` reads that does not depend on the count, kept under
    ``key``: that every rank's peers move (else False), every rank's XOR masks (None
    where it has none, or in place) and their union. ``conns`` collects every rank's
    connections when the Programs are read (each generated once)."""
    kept = _kept(("ranks", key and key[:4], in_place), topo, key)
    got = kept.get((g, x))
    if got is None:
        per_rank = _scan(programs, g, x, n, in_place, conns)
        got = False if per_rank is None else (
            per_rank, frozenset().union(*(m for _, _, m in per_rank if m is not None)),
            all(m is not None for _, _, m in per_rank))
        kept[(g, x)] = got
        if conns and len(conns) <= KEEP_CONNS:  # the next topology's routes read them
            _kept(("conns", key and key[:4]), topo, key)[0] = frozenset(conns)
    return got


KEEP_CONNS = 1 << 18      # connections kept with the ranks' scan (for other topologies)


def _all_ranks(programs: Sequence[Program], g: int, x: bool, n: int, regs: dict,
               in_place: bool, topo: Topology, key: tuple | None, got=None) -> bool:
    """Every rank outside block 0 is its parent moved (:func:`same_shape`, parents as
    :func:`_blocks` says): the peers and masks of :func:`_scanned` (``got``, when the
    caller has it), so that another count needs only the masks' lengths, and the chunk
    renamings of the ranks whose masks do not keep them (:func:`_renamed`, the part of
    :func:`same_shape` not kept)."""
    if got is None:
        got = _scanned(programs, g, x, n, in_place, topo, key)
    if got is False:
        return False
    per_rank, union, every = got
    if every and all(_xor_keeps_lengths(regs[b], m) for b, m in union if m):
        return True
    return all(_renamed(programs[r], programs[a], regs, in_place, masks)
               for r, a, masks in per_rank)


def _scan(programs: Sequence[Program], g: int, x: bool, n: int, in_place: bool,
          conns: set | None) -> list[tuple[int, int, frozenset | None]] | None:
    """(rank, parent, XOR masks) of every rank outside block 0 whose peers are its
    parent's moved, block by block in :func:`_blocks`'s order (so each Program is
    generated once and its parent is at hand); None at the first that is not."""
    prev = [programs[r] for r in range(g)]
    if conns is not None:
        _conns(prev, 0, conns)
    out: list[tuple[int, int, frozenset | None]] = []
    for b, pb, h in _blocks(g, n, x):
        cur = [programs[r] for r in range(b * g, b * g + g)]
        if conns is not None:
            _conns(cur, b * g, conns)
        for o, (p, q) in enumerate(zip(cur, prev)):
            if not _peers_ok(p, q, h if x else g, n, g if x else 0):
                if conns is not None:
                    conns.clear()                # incomplete: read again if needed
                return None
            out.append((b * g + o, pb * g + o, None if in_place else _xor_masks(p, q)))
        prev = cur
    return out


# what find() keeps for a sweep: the routes' folds and the ranks' peers and XOR masks
_FIND = Recent("folds tried", 4 * symbolic.KEEP)
_RENAMED = Recent("renamings proved", 4 * symbolic.KEEP)   # per Programs and pattern


def period(programs: Sequence[Program], topo: Topology, devices: list[int], count: int,
           aware: bool, in_place: bool = False) -> int:
    """The ranks :func:`find`'s fold simulates, or 0."""
    f = find(programs, topo, devices, count, aware, in_place)
    return f.g if f else 0


def fold_bound(programs: Sequence[Program], topo: Topology, devices: list[int],
               count: int, aware: bool, in_place: bool = False) -> int:
    """The fewest ranks a fold could simulate, read off rank 0's Program and rank g's for
    each candidate g (not all n), or 0 when :func:`find` is sure to find nothing: rank g
    is not rank 0 moved, or (congestion-aware) a route of rank 0 and its image under the
    move differ in length, bandwidth or latency, or cross links that no one bijection
    maps (then no block's routes are another's)."""
    n = topo.nranks
    if len(programs) != n or n < 2:
        return 0
    p0 = programs[0]
    regs = regions(p0, count)
    links = topo.links
    for g in candidates(topo, devices):
        pg = programs[g]
        for x in kinds(g, n):
            if not same_shape(pg, p0, 1 if x else g, n, regs, in_place, g if x else 0):
                continue
            if not aware:
                return g
            fwd: dict[int, int] = {}
            bwd: dict[int, int] = {}
            ok = True
            for c, q in {(c, q) for c, ch in enumerate(p0.channels) for s in ch
                         for q in s.send_to}:
                a = topo.route(devices[0], devices[q], c)
                b = topo.route(devices[g], devices[image(q, 1, g, n, x)], c)
                if len(a) != len(b):
                    ok = False
                    break
                for u, v in zip(a, b):
                    if fwd.setdefault(u, v) != v or bwd.setdefault(v, u) != u or \
                            (links[u].bandwidth, links[u].latency) != (links[v].bandwidth,
                                                                       links[v].latency):
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                return g
    return 0


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
    def make() -> tuple[Routes, dict[int, bool]]:
        conns = [(r, (r + a) % n, c) for r in range(n) for c, os in enumerate(offs)
                 for a in os]
        return Routes(conns, topo, devices, aware), {}

    routes, seen = _ROUTES.lookup(key, make, topo)
    for g in gs:
        if g not in seen:
            f = routes.fold(g, n)
            seen[g] = f is not None and f.links is None  # the batch runs links as they are
        if seen[g]:
            return g
    return 0


# the routes of the last few templates' connections, and which shifts they keep (a sweep
# over sizes asks the same question at every size)
_ROUTES = Recent("template routes", symbolic.KEEP)
