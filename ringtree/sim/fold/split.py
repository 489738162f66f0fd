"""The network's half of a fold on many ranks, proved on routes between NVSwitches.

:class:`.orbits.Routes` routes every connection of a run and maps each route, link by
link, under every generator of the fold's group: at 16,384 ranks of recursive doubling
that is 1.8 M routes and 20 M link pairs per generator. Under up-down, destination-mod-k
routing a GPU hangs off its NVSwitch alone, and every route from or to it is that hop
followed (preceded) by the route from (to) the NVSwitch
(:meth:`~ringtree.sim.machine.cluster.Topology.split_route`, proved in its docstring and
tested against every route of the presets). A connection (r, q, c) then crosses
``up[r] + mid(p[r], p[q], c) + down[q]``, and the condition of
:func:`.orbits.orbits` — each generator h maps every connection's route onto its
image's through one bijection of the links that keeps bandwidth and latency — is the
same condition on the pairs it records: r's hops onto h(r)'s, and each distinct
NVSwitch route (p[r], p[q], c) onto (σ p[r], σ p[q], c), where σ takes the NVSwitch of
r to that of h(r) (checked to be a function). Those are 8× fewer routes on a DGX
(one per pair of nodes and channel), and the hops are one pair per rank and generator.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ringtree.sim.fold.orbits import Fold, generators, quotient
from ringtree.sim.machine.cluster import Topology

# from this many connections on, :func:`.symmetry.find` proves route folds here
SPLIT_FROM = 1 << 17


class SplitRoutes:
    """Every connection's route as (its source's hop, an NVSwitch route, its
    destination's hop), for :meth:`fold` (congestion-aware model only), as arrays."""

    def __init__(self, topo: Topology, hops: list[tuple[int, int, int]], conns: np.ndarray
                 ) -> None:
        self.topo = topo
        self.nlinks, self.ndev = len(topo.links), len(topo.devices)
        self.up = np.array([h[0] for h in hops], dtype=np.int64)
        self.down = np.array([h[1] for h in hops], dtype=np.int64)
        self.par = np.array([h[2] for h in hops], dtype=np.int64)
        r, q, c = conns[:, 0], conns[:, 1], conns[:, 2]
        self.nch = 1 + int(c.max(initial=0))
        keys = np.unique(self._key(self.par[r], self.par[q], c))   # sorted, as mids
        ends = np.stack([keys // self.nch // self.ndev, keys // self.nch % self.ndev,
                         keys % self.nch], axis=1)
        routes = [topo.route(*m) for m in ends.tolist()]
        width = max(map(len, routes), default=0)
        self.links = np.full((len(routes), max(width, 1)), -1, dtype=np.int64)
        for i, lk in enumerate(routes):
            self.links[i, :len(lk)] = lk
        self.lens = (self.links >= 0).sum(axis=1)
        self.ends, self.keys = ends, keys
        self.srcs, self.dsts = np.unique(r), np.unique(q)
        self.bw = np.array([lk.bandwidth for lk in topo.links])
        self.lat = np.array([lk.latency for lk in topo.links])

    def _key(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        return (a * self.ndev + b) * self.nch + c

    @staticmethod
    def make(conns: set | np.ndarray, topo: Topology, devices: list[int]
             ) -> SplitRoutes | None:
        """The split routes of ``conns`` ((rank, peer, channel) tuples, or their rows),
        or None where some rank's end does not split (then :class:`.orbits.Routes`
        routes them whole). Whether a destination splits on a channel depends only on
        its NVSwitch (the port walk from the GPU passes it), so one GPU per NVSwitch is
        asked per channel."""
        if not isinstance(conns, np.ndarray):
            conns = np.fromiter(chain.from_iterable(conns), dtype=np.int64,
                                count=3 * len(conns)).reshape(-1, 3)
        if len(set(devices)) != len(devices) or (conns[:, 0] == conns[:, 1]).any():
            return None                          # a route of no links does not split
        hops: list[tuple[int, int, int]] = []
        for d in devices:
            h = topo.leaf_hop(d)
            if h is None:
                return None
            hops.append(h)
        one = {h[2]: d for d, h in zip(devices, hops)}
        channels = np.unique(conns[:, 2]).tolist()
        if any(topo.leaf_hop(d, c) is None for d in one.values() for c in channels):
            return None
        return SplitRoutes(topo, hops, conns)

    def link_map(self, h: int, g: int, n: int, xor: bool) -> dict[int, int] | None:
        """π_h of :func:`.orbits.link_map`, recorded on the hops and NVSwitch routes."""
        r = np.arange(n, dtype=np.int64)
        img = ((r // g) ^ h) * g + r % g if xor else (r + h * g) % n
        sig = np.full(self.ndev, -1, dtype=np.int64)
        sig[self.par] = self.par[img]
        if not np.array_equal(sig[self.par], self.par[img]):
            return None                          # a node's ranks go to two nodes
        ends = self.ends
        want = self._key(sig[ends[:, 0]], sig[ends[:, 1]], ends[:, 2])
        at = np.minimum(np.searchsorted(self.keys, want), len(self.keys) - 1)
        if len(want) and (not np.array_equal(self.keys[at], want)
                          or not np.array_equal(self.lens[at], self.lens)):
            return None                          # an image's route missing or longer
        used = self.links >= 0
        a = np.concatenate([self.up[self.srcs], self.down[self.dsts], self.links[used]])
        x = np.concatenate([self.up[img[self.srcs]], self.down[img[self.dsts]],
                            self.links[at][used]])
        pairs = np.unique(a * self.nlinks + x)
        a, x = pairs // self.nlinks, pairs % self.nlinks
        if len(np.unique(a)) != len(a) or len(np.unique(x)) != len(x):
            return None                          # not one bijection
        if not (np.array_equal(self.bw[a], self.bw[x])
                and np.array_equal(self.lat[a], self.lat[x])):
            return None
        return dict(zip(a.tolist(), x.tolist()))
    def fold(self, g: int, n: int, xor: bool = False) -> Fold | None:
        """The fold of g ranks whose group maps every route onto its image's (the links'
        quotient, :func:`.orbits.quotient`), or None."""
        perms = []
        for h in generators(g, n, xor):
            fwd = self.link_map(h, g, n, xor)
            if fwd is None:
                return None
            perms.append(fwd)
        rep = quotient(perms, n // g)
        return None if rep is None else Fold(g, xor, rep)
