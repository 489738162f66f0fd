"""Fixed routes through a :class:`~ringtree.sim.topology.Topology` (see its docstring
for the three routing rules): up-down for hierarchical networks with rail (channel) and
ECMP choices, dimension order for multi-dimensional networks, breadth-first otherwise."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringtree.sim.topology import Topology


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
        self.cache: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self.bfs: dict[int, list[int]] = {}
        if t.routing == "dor":
            self.index = {d.name: i for i, d in enumerate(t.devices)}
            self.npus = math.prod(size for _, size, _, _ in t.dims)

    def reach(self, d: int) -> frozenset[int]:
        got = self.memo.get(d)
        if got is None:
            acc: set[int] = set()
            for li in self.ups[d]:
                u = self.t.links[li].dst
                acc.add(u)
                acc |= self.reach(u)
            got = frozenset(acc)
            if self.t.devices[d].kind != "gpu":
                self.memo[d] = got
        return got

    def route(self, a: int, b: int, ch: int) -> tuple[int, ...]:
        key = (a, b, ch)
        r = self.cache.get(key)
        if r is None:
            if a == b:
                r = ()
            elif self.t.routing == "updown":
                r = self._updown(a, b, ch)
            elif self.t.routing == "dor":
                r = self._dor(a, b)
            else:
                r = self._shortest(a, b)
            self.cache[key] = r
        return r

    def _pick(self, d: int, cands: list[int], a: int, b: int, ch: int) -> int:
        if self.t.devices[d].node >= 0:
            return cands[ch % len(cands)]
        h = (a * 2654435761 ^ b * 40503 ^ (ch + 1) * 97) & 0x7FFFFFFF
        return cands[h % len(cands)]

    def _climb(self, a: int, goal: int, a0: int, b0: int, ch: int) -> list[int]:
        """Links of an upward path from ``a`` to its ancestor ``goal``."""
        path, d = [], a
        while d != goal:
            cands = [li for li in self.ups[d] if self.t.links[li].dst == goal
                     or goal in self.reach(self.t.links[li].dst)]
            if not cands:
                raise ValueError(f"{self.t.name}: no upward path from {a} to {goal}")
            li = self._pick(d, cands, a0, b0, ch)
            path.append(li)
            d = self.t.links[li].dst
        return path

    def _updown(self, a: int, b: int, ch: int) -> tuple[int, ...]:
        links = self.t.links
        up, d = [], a
        rb = self.reach(b)
        while d != b and d not in rb:
            ups = self.ups[d]
            if not ups:
                return self._shortest(a, b)
            good = [li for li in ups if links[li].dst == b or links[li].dst in rb]
            li = self._pick(d, good or ups, a, b, ch)
            up.append(li)
            d = links[li].dst
        down = [self.link_of[(links[li].dst, links[li].src)]
                for li in reversed(self._climb(b, d, a, b, ch))] if d != b else []
        return tuple(up + down)

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
