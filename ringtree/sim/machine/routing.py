"""Fixed routes through a :class:`~ringtree.sim.machine.cluster.Topology` (see its docstring
for the three routing rules): up-down for hierarchical networks with rail (channel) and
uplink choices, dimension order for multi-dimensional networks, breadth-first otherwise.

Uplinks of network switches (``Topology.uplinks``):

- ``dmodk`` (the default, InfiniBand): destination-mod-k. InfiniBand switches forward by
  destination LID alone (linear forwarding tables), and OpenSM's fat-tree routing
  assigns the up-port at level l as ``floor(D / k^l) mod k`` for destination D
  (Zahavi, Johnson, Kerbyson & Lang, "Optimized InfiniBand fat-tree routing for shift
  all-to-all communication patterns", CCPE 2010; Gómez, Gilabert, Flich, López & Duato,
  "Deterministic versus adaptive routing in fat-trees", IPDPS 2007). Here D is the
  destination's host port (leaf ordinal × the leaf's host ports + the port), and a switch
  with k qualifying uplinks takes ``D mod k`` and passes ``D div k`` up (mixed radix).
  Every destination then has one path down from each top switch, so a shift or XOR
  permutation of hosts crosses every up and down link at most once, and the routes of
  node r + s (r ^ s) are those of node r under a relabeling of the links — the node
  symmetry :mod:`.symmetry` folds.
- ``hash``: ECMP, a hash of (source, destination, channel), what Ethernet / RoCE fabrics
  do; it breaks the node symmetry of the routes.

Node-local devices (an NVSwitch choosing a NIC) pick by channel: rail c, NCCL's PXN."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringtree.sim.machine.cluster import Topology


class Router:
    def __init__(self, t: Topology) -> None:
        """Routes of ``t``, memoised per (source, destination, channel)."""
        self.t = t
        self.link_of = {(lk.src, lk.dst): i for i, lk in enumerate(t.links)}
        self.out: list[list[int]] = [[] for _ in t.devices]
        for i, lk in enumerate(t.links):
            self.out[lk.src].append(i)
        lv = [d.level for d in t.devices]
        self.ups = [[i for i in o if lv[t.links[i].dst] > lv[t.links[i].src]] for o in self.out]
        self.memo: dict[int, frozenset[int]] = {}
        self.gpu_memo: dict[int, frozenset[int]] = {}
        self.downs: dict[tuple[int, int, int], tuple[list[int], int]] = {}
        self.cache: dict[tuple[int, int, int], tuple[int, ...]] = {}
        # the channel's residues the route being computed read: lcm of the moduli
        # (1: none, 0: the channel itself, in a hash); routes by (a, b): (period, {residue})
        self.mod = 1
        self.periodic: dict[tuple[int, int], tuple[int, dict[int, tuple[int, ...]]]] = {}
        self.port_mod: dict[tuple[int, int], int] = {}
        self.bfs: dict[int, list[int]] = {}
        if t.uplinks not in UPLINKS:
            raise ValueError(f"{t.name}: unknown uplinks {t.uplinks!r}; expected one of "
                             f"{', '.join(UPLINKS)}")
        self.dmodk = t.uplinks == "dmodk"
        self.ports: dict[tuple[int, int], int] = {}
        self.below: dict[int, list[int]] = {}
        self.rank_of: dict[int, int] | None = None
        self.into: list[int] | None = None       # links into each device
        if t.routing == "dor":
            self.index = {d.name: i for i, d in enumerate(t.devices)}
            self.npus = math.prod(size for _, size, _, _ in t.dims)

    def reach(self, d: int) -> frozenset[int]:
        got = self.memo.get(d) or self.gpu_memo.get(d)
        if got is None:
            acc: set[int] = set()
            for li in self.ups[d]:
                u = self.t.links[li].dst
                acc.add(u)
                acc |= self.reach(u)
            got = frozenset(acc)
            if self.t.devices[d].kind != "gpu":
                self.memo[d] = got
            else:                                # GPUs: many, so only the recent ones
                if len(self.gpu_memo) >= GPU_REACH_KEPT:
                    self.gpu_memo.clear()
                self.gpu_memo[d] = got
        return got

    def route(self, a: int, b: int, ch: int) -> tuple[int, ...]:
        """The route of (a, b) on channel ``ch``. A route none of whose choices read the
        channel (``self.mod`` stays 1: every device it left had one candidate, or chose by
        something else) is the route of every channel, so it is kept once per (a, b) under
        channel -1: the 16 channels of a tree share its routes inside a node. A route that
        read the channel only as residues ``ch mod m`` (a node-local pick among m, a port
        found through such picks) is the route of every channel with the same residues,
        since each choice of the walk is then the same: it is kept under ``ch mod P``, P
        the lcm of the moduli of the pair's first route (when this one's divides it), so
        on ``dgx_h100`` channels c and c + 8 share one route across nodes."""
        key = (a, b, ch)
        r = self.cache.get(key) or self.cache.get((a, b, -1))
        per = self.periodic.get((a, b)) if r is None and ch >= 0 else None
        if per is not None:
            r = per[1].get(ch % per[0])
        if r is None:
            self.mod = 1
            if a == b:
                r = ()
            elif self.t.routing == "updown":
                r = self._updown(a, b, ch)
            elif self.t.routing == "dor":
                r = self._dor(a, b)
            else:
                r = self._shortest(a, b)
            self._keep(a, b, ch, r)
        return r

    def _keep(self, a: int, b: int, ch: int, r: tuple[int, ...]) -> None:
        """Keep route ``r`` of (a, b, ch) for the channels it is the route of (:meth:`route`)."""
        m = self.mod
        if m == 1:
            self.cache[(a, b, -1)] = r
            return
        per = self.periodic.setdefault((a, b), (m, {})) if m > 1 and ch >= 0 else None
        if per is not None and per[0] % m == 0:
            per[1][ch % per[0]] = r
        else:
            self.cache[(a, b, ch)] = r

    def _read(self, m: int) -> None:
        """The route being computed read the channel modulo ``m`` (0: the channel)."""
        self.mod = 0 if m == 0 or self.mod == 0 else math.lcm(self.mod, m)

    def leaf_hop(self, d: int, ch: int = -1) -> tuple[int, int, int] | None:
        """(link d → p, link p → d, p) when every up-down, destination-mod-k route from
        ``d`` (and to ``d`` on channel ``ch``, if given) passes its one neighbour p
        (:meth:`split`), else None."""
        t, ups = self.t, self.ups[d]
        if t.routing != "updown" or not self.dmodk or len(ups) != 1 or \
                len(self.out[d]) != 1 or t.devices[d].node < 0:
            return None
        if self.into is None:
            self.into = [0] * len(t.devices)
            for lk in t.links:
                self.into[lk.dst] += 1
        p = t.links[ups[0]].dst
        back = self.link_of.get((p, d))
        if back is None or self.into[d] != 1 or t.devices[p].node < 0:
            return None                          # d is not a leaf hanging off p alone
        if ch >= 0 and self.port(d, ch) != self.port(p, ch):
            return None                          # no network switch above d
        return ups[0], back, p

    def split(self, a: int, b: int, ch: int) -> tuple[tuple[int, ...], int, int,
                                                        tuple[int, ...]]:
        """(head, a', b', tail) with ``route(a, b, ch) == head + route(a', b', ch) +
        tail``: an end with one node-local neighbour p and no other link (a GPU on its
        NVSwitch, :meth:`leaf_hop`) is replaced by p. Why it holds (up-down,
        destination-mod-k): from a the climb can only take a → p, a node-local pick that
        consumes none of the destination's digits, and goes on from p as a route from p
        would; towards b, reach(b) = {p} ∪ reach(p), port(b, ch) = port(p, ch) (the port
        walk passes p), so the climb stops at the same top, and the way down, the climb
        from b reversed, is the climb from p reversed followed by p → b."""
        head: tuple[int, ...] = ()
        tail: tuple[int, ...] = ()
        if a == b:
            return head, a, b, tail
        ha, hb = self.leaf_hop(a), self.leaf_hop(b, ch)
        if ha is not None:
            head, a = (ha[0],), ha[2]
        if hb is not None:
            tail, b = (hb[1],), hb[2]
        return head, a, b, tail

    def _pick(self, d: int, cands: list[int], a: int, b: int, ch: int, key: list[int]
              ) -> int:
        """The uplink of ``d`` among ``cands``; ``key`` holds what is left of the
        destination's D-mod-K digits (consumed here)."""
        if len(cands) > 1 and self.t.devices[d].node >= 0:
            self._read(len(cands))
        if self.t.devices[d].node >= 0:
            return cands[ch % len(cands)]
        if self.dmodk:
            k = len(cands)
            if k > 1:                           # the key comes from port(b, ch)
                self._read(self.port_mod[(b, ch)])
            x = key[0]
            key[0] = x // k
            return cands[x % k]
        if len(cands) > 1:
            self._read(0)
        h = (a * 2654435761 ^ b * 40503 ^ (ch + 1) * 97) & 0x7FFFFFFF
        return cands[h % len(cands)]

    def port(self, b: int, ch: int) -> int:
        """D of destination ``b`` on channel ``ch``: its first network switch's ordinal
        among the switches of that level × that switch's downlinks, plus the position
        among them of the device through which ``b`` hangs below it (rail ``ch``); a
        destination that is itself a switch has its device id."""
        got = self.ports.get((b, ch))
        if got is None:
            t, d, got, m = self.t, b, b, 1
            while t.devices[d].node >= 0 and self.ups[d]:
                ups = self.ups[d]
                m = math.lcm(m, len(ups))
                nxt = t.links[ups[ch % len(ups)]].dst
                if t.devices[nxt].node < 0:
                    downs = self._downs(nxt)
                    got = self._ordinal(nxt) * len(downs) + downs.index(d)
                    break
                d = nxt
            self.ports[(b, ch)], self.port_mod[(b, ch)] = got, m
        return got

    def _downs(self, s: int) -> list[int]:
        """Devices below switch ``s``, in device order."""
        got = self.below.get(s)
        if got is None:
            t, lv = self.t, self.t.devices[s].level
            got = self.below[s] = sorted(t.links[li].dst for li in self.out[s]
                                         if t.devices[t.links[li].dst].level < lv)
        return got

    def _ordinal(self, s: int) -> int:
        """Position of network switch ``s`` among the network switches of its level."""
        if self.rank_of is None:
            seen: dict[int, int] = {}
            self.rank_of = {}
            for i, dv in enumerate(self.t.devices):
                if dv.node < 0:
                    self.rank_of[i] = seen.get(dv.level, 0)
                    seen[dv.level] = self.rank_of[i] + 1
        return self.rank_of[s]

    def _climb(self, a: int, goal: int, a0: int, b0: int, ch: int, key: list[int]
               ) -> list[int]:
        """Links of an upward path from ``a`` to its ancestor ``goal``."""
        path, d = [], a
        while d != goal:
            cands = [li for li in self.ups[d] if self.t.links[li].dst == goal
                     or goal in self.reach(self.t.links[li].dst)]
            if not cands:
                raise ValueError(f"{self.t.name}: no upward path from {a} to {goal}")
            li = self._pick(d, cands, a0, b0, ch, key)
            path.append(li)
            d = self.t.links[li].dst
        return path

    def _updown(self, a: int, b: int, ch: int) -> tuple[int, ...]:
        links = self.t.links
        up, d = [], a
        rb = self.reach(b)
        key = [self.port(b, ch)] if self.dmodk else [0]
        while d != b and d not in rb:
            ups = self.ups[d]
            if not ups:
                return self._shortest(a, b)
            good = [li for li in ups if links[li].dst == b or links[li].dst in rb]
            li = self._pick(d, good or ups, a, b, ch, key)
            up.append(li)
            d = links[li].dst
        return tuple(up + self._down(a, b, d, ch)) if d != b else tuple(up)

    def _down(self, a: int, b: int, top: int, ch: int) -> list[int]:
        """Links down from ancestor ``top`` to ``b``: the reverse of the climb from
        ``b``, which with destination-mod-k uplinks depends on (b, top, channel) alone
        (the source enters only the ``hash`` choice), so is kept per those."""
        key = (b, top, ch)
        got = self.downs.get(key) if self.dmodk else None
        if got is None:
            links = self.t.links
            was, self.mod = self.mod, 1
            got = [self.link_of[(links[li].dst, links[li].src)] for li in
                   reversed(self._climb(b, top, a, b, ch,
                                        [self.port(b, ch)] if self.dmodk else [0]))]
            got = (got, self.mod)
            self.mod, sub = was, self.mod
            self._read(sub)
            if self.dmodk:
                if len(self.downs) >= GPU_REACH_KEPT:
                    self.downs.clear()
                self.downs[key] = got
        else:
            self._read(got[1])
        return got[0]

    def _switch_of(self, d: int) -> tuple[int, list[int]] | None:
        """(dimension, coordinates of its first member) of a ``dor`` switch device."""
        if d < self.npus:
            return None
        dim, _, group = self.t.devices[d].name[2:].partition(".")
        return int(dim), coords(int(group), self.t.dims)

    def _dor(self, a: int, b: int) -> tuple[int, ...]:
        """Dimension order between NPUs. A switch endpoint (a CollNet virtual rank) is
        reached from the member of its group that shares the other end's coordinate in
        the switch's dimension, so only the last (first) hop touches the switch."""
        sa, sb = self._switch_of(a), self._switch_of(b)
        if sa is None and sb is None:
            return self._dor_npus(a, b)
        if sa is not None and sb is not None:
            mid = index(sa[1], self.t.dims)
            return self._dor(a, mid) + self._dor(mid, b)
        dims = self.t.dims
        if sb is not None:
            dim, c = sb
            c[dim] = coords(a, dims)[dim]
            m = index(c, dims)
            return self._dor_npus(a, m) + (self.link_of[(m, b)],)
        assert sa is not None
        dim, c = sa
        c[dim] = coords(b, dims)[dim]
        m = index(c, dims)
        return (self.link_of[(a, m)],) + self._dor_npus(m, b)

    def _dor_npus(self, a: int, b: int) -> tuple[int, ...]:
        path: list[int] = []
        ca, cb = coords(a, self.t.dims), coords(b, self.t.dims)
        cur = list(ca)
        for dim, (kind, size, _, _) in enumerate(self.t.dims):
            if cur[dim] == cb[dim]:
                continue
            here = index(cur, self.t.dims)
            if kind == "switch":
                group = index([0 if i == dim else c for i, c in enumerate(cur)], self.t.dims)
                sw = self.index[f"sw{dim}.{group}"]
                cur[dim] = cb[dim]
                path += [self.link_of[(here, sw)], self.link_of[(sw, index(cur, self.t.dims))]]
                continue
            if kind == "fc":
                cur[dim] = cb[dim]
                path.append(self.link_of[(here, index(cur, self.t.dims))])
                continue
            fwd = (cb[dim] - cur[dim]) % size
            step = 1 if kind == "uring" or fwd <= size - fwd else -1
            while cur[dim] != cb[dim]:
                prev = index(cur, self.t.dims)
                cur[dim] = (cur[dim] + step) % size
                path.append(self.link_of[(prev, index(cur, self.t.dims))])
        return tuple(path)

    def _shortest(self, a: int, b: int) -> tuple[int, ...]:
        parent = self.bfs.get(a)
        if parent is None:
            parent = [-1] * len(self.t.devices)
            parent[a] = a
            q = deque([a])
            while q:
                u = q.popleft()
                for li in self.out[u]:
                    v = self.t.links[li].dst
                    if parent[v] == -1:
                        parent[v] = li
                        q.append(v)
            if len(self.bfs) > 256:
                self.bfs.clear()
            self.bfs[a] = parent
        if parent[b] == -1:
            raise ValueError(f"{self.t.name}: device {b} unreachable from {a}")
        path, d = [], b
        while d != a:
            li = parent[d]
            path.append(li)
            d = self.t.links[li].src
        return tuple(reversed(path))


UPLINKS = ("dmodk", "hash")
GPU_REACH_KEPT = 1 << 16    # GPUs' ancestor sets and down paths kept (the recent ones)


def coords(i: int, dims) -> list[int]:
    out = []
    for _, size, _, _ in dims:
        out.append(i % size)
        i //= size
    return out


def index(coords, dims) -> int:
    i, mul = 0, 1
    for c, (_, size, _, _) in zip(coords, dims):
        i += c * mul
        mul *= size
    return i
