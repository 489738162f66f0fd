"""The network's half of a fold (:mod:`.symmetry` proves the Programs' half): do the
routes of a run stay the same under the fold's group of rank permutations?

- Closed blocks: no link carries connections of two blocks of g ranks, and every block's
  routes are block 0's under one link bijection keeping bandwidth and latency
  (:func:`links_closed`, :func:`isomorphic`); block 0 is then simulated on its own links.
- Shared links: each generator of the group (the shift by one block, or the XOR of one
  bit of the block index) maps every route onto its image's route through one link
  permutation, and the group acts freely on the links used; block 0 is then simulated
  with every link replaced by its orbit's representative (:func:`orbits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringtree.sim.compile.compiled import image
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import channel_shares, path


def links_closed(paths: dict, g: int) -> bool:
    """Congestion-aware folding: no link carries connections of two blocks of g ranks, and
    a link shared inside a block is shared the same way in every block (checked by
    :func:`isomorphic`)."""
    used: dict[int, int] = {}
    for (r, _, _), pth in paths.items():
        for li in pth.links:
            if used.setdefault(li, r // g) != r // g:
                return False
    return True


def link_map(paths: dict, topo: Topology, b: int, g: int, n: int, xor: bool,
             block0: bool = False) -> dict[int, int] | None:
    """The link bijection that block element ``b`` induces on the routes of ``paths``
    (only block 0's connections if ``block0``): each route mapped link by link onto the
    route of the connection's image, one link to one link, keeping bandwidth and latency;
    None where there is no such bijection."""
    links = topo.links
    fwd: dict[int, int] = {}
    bwd: dict[int, int] = {}
    for (r, q, c), pth in paths.items():
        if block0 and r >= g:
            continue
        img = paths.get((image(r, b, g, n, xor), image(q, b, g, n, xor), c))
        if img is None or len(img.links) != len(pth.links):
            return None
        for a, x in zip(pth.links, img.links):
            if fwd.setdefault(a, x) != x or bwd.setdefault(x, a) != a:
                return None
    if any((links[a].bandwidth, links[a].latency) != (links[x].bandwidth, links[x].latency)
           for a, x in fwd.items()):
        return None
    return fwd


def isomorphic(paths: dict, topo: Topology, g: int, n: int, xor: bool) -> bool:
    """Every block's routes are block 0's under one link bijection keeping every link's
    bandwidth and latency (so the FIFO links see the same contention)."""
    return all(link_map(paths, topo, b, g, n, xor, block0=True) is not None
               for b in range(1, n // g))


def generators(g: int, n: int, xor: bool) -> list[int]:
    """Block elements generating the group of a fold: the shift by one block, or the XOR
    of each bit of the block index."""
    if not xor:
        return [1]
    return [1 << k for k in range((n // g).bit_length() - 1)]


def orbits(paths: dict, topo: Topology, g: int, n: int, xor: bool) -> dict[int, int] | None:
    """The quotient of the links by the fold's group, or None if there is none.

    Each generator h must map every connection's route onto the route of the connection's
    image, link by link, through one bijection π_h of the links used that keeps bandwidth
    and latency; then the π's are the group acting on the links (π_h∘π_h' of a route is
    the route of the image under h·h', so π respects the group's relations on every link
    used) and the whole run is invariant. If moreover the group acts freely (every
    link's orbit has |G| = n/g links), the FIFO of a link carries, at the same times, the
    images of exactly the block-0 messages that cross any link of its orbit, one element
    per such link: simulating block 0 with every link replaced by its orbit's
    representative (the smallest id) is exact. Returns link → representative."""
    perms: list[dict[int, int]] = []
    for h in generators(g, n, xor):
        fwd = link_map(paths, topo, h, g, n, xor)
        if fwd is None:
            return None
        perms.append(fwd)
    return quotient(perms, n // g)


def quotient(perms: list[dict[int, int]], size: int) -> dict[int, int] | None:
    """Link → smallest link of its orbit under the group the link permutations
    ``perms`` generate, or None unless every orbit has ``size`` links (a free action)."""
    rep: dict[int, int] = {}
    for li in perms[0] if perms else ():
        if li in rep:
            continue
        orbit, todo = {li}, [li]
        while todo:
            x = todo.pop()
            for pm in perms:
                y = pm[x]
                if y not in orbit:
                    orbit.add(y)
                    todo.append(y)
        if len(orbit) != size:
            return None                       # not free: a link is its own image
        m = min(orbit)
        for x in orbit:
            rep[x] = m
    return rep


class Routes:
    """Routes of every connection of a run, computed once for all candidate folds."""

    def __init__(self, conns, topo: Topology, devices: list[int], aware: bool) -> None:
        self.topo, self.aware = topo, aware
        raw = {k: topo.route(devices[k[0]], devices[k[1]], k[2]) for k in conns}
        if aware:
            self.paths = {k: path(topo, v) for k, v in raw.items()}
        else:
            share = channel_shares((k[0], v) for k, v in raw.items())
            self.summary = {k: (p.latency, p.bottleneck, p.first) for k, p in
                            ((k, path(topo, v, share)) for k, v in raw.items())}

    def fold(self, g: int, n: int, xor: bool = False) -> Fold | None:
        """The fold of g ranks (shifts or XOR) the network keeps, or None. Aware: no link
        carries two blocks' connections and the blocks' routes are isomorphic (links as
        they are), else the links' quotient (:func:`orbits`)."""
        if self.aware:
            if links_closed(self.paths, g) and isomorphic(self.paths, self.topo,
                                                                  g, n, xor):
                return Fold(g, xor)
            rep = orbits(self.paths, self.topo, g, n, xor)
            return None if rep is None else Fold(g, xor, rep)
        summary = self.summary
        for h in generators(g, n, xor):
            if not all(summary.get((image(r, h, g, n, xor), image(q, h, g, n, xor), c)) == v
                       for (r, q, c), v in summary.items()):
                return None
        return Fold(g, xor)


@dataclass(frozen=True)
class Fold:
    """What :func:`find` proved: simulate ranks 0..g−1 of a run symmetric under shifts of
    g ranks or (``xor``) XOR of aligned blocks of g ranks; ``links``: each used link's
    orbit representative, when blocks share links (None: the links as they are)."""

    g: int
    xor: bool = False
    links: dict[int, int] | None = field(default=None, compare=False)
