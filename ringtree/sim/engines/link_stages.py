"""The congestion-aware network of a whole run carried at once, link *stage* by link
stage, for :mod:`.fixed_point`'s fixed point.

A link's stage is one more than that of any link before it on a route, so the links of
one stage feed none of each other: their chunks are sorted by arrival, link by link (in
(message, slice) order on ties: the heap's order), and served together — each link a
FIFO with the engine's own sums (:func:`.rounds.serve`), several idle links as one
array (:func:`serve_links`) when a stage has few chunks, link by link when it has many.
"""

from __future__ import annotations

import numpy as np

from ringtree.sim.engines import fifo

__all__ = ["Network", "link_stages", "serve_links", "ranges", "by_link", "SORT_PER_LINK"]

SORT_PER_LINK = 1 << 17   # chunks of a link stage from which its links go one by one


def link_stages(eng, conn: np.ndarray, first: np.ndarray) -> tuple | None:
    """The chunks of every link stage (:class:`Network`) as indices into the run's
    chunks (``conn``: every message's connection, ``first``: where its chunks start),
    link after link, with their rate (one, or every chunk's), the links' bounds,
    latencies and heads; every connection's chunks; the heap events. None when the
    routes cycle."""
    cp = eng.cp
    routes = eng.conn_links
    key = ("link stages", id(routes), id(eng.shared))
    got = cp.memo.get(key)
    if got is None:
        got = cp.memo[key] = users(routes, eng.shared, len(eng.rate))
    if got is None:
        return None
    by_stage, nshared = got
    nconn = len(routes)
    per = np.bincount(conn, weights=np.diff(first), minlength=nconn)
    per = per.astype(np.int64)
    lo = np.concatenate(([0], np.cumsum(per)))      # chunks of connection c
    stages = []
    for links in by_stage:
        cs = np.concatenate([c for _, c in links])
        ln = per[cs]
        idx = ranges(lo[cs], ln)
        lens = np.add.reduceat(ln, np.cumsum([0] + [c.size for _, c in links[:-1]]))
        cut = np.concatenate(([0], np.cumsum(lens)))
        bounds = [(a, b, eng.llat[li], eng.rate[li]) for (li, _), a, b in
                  zip(links, cut[:-1].tolist(), cut[1:].tolist())]
        # the links' rate, one for the stage when they share it, else every chunk's
        rates = np.asarray([eng.rate[li] for li, _ in links], np.float64)
        rate = float(rates[0]) if bool((rates == rates[0]).all()) else \
            np.repeat(rates, lens)
        seg = lat = heads = None
        if int(cut[-1]) < SORT_PER_LINK:            # else served link by link
            seg = np.repeat(np.arange(lens.size), lens)
            lat = np.repeat([eng.llat[li] for li, _ in links], lens)
            heads = np.zeros(seg.size, bool)
            heads[cut[:-1]] = True
            if lens.size and int(lens.min()) == int(lens.max()) > 0:
                seg = int(lens[0])              # every link as many chunks: a row each
        stages.append((idx, rate, lat, seg, heads, bounds))
    return stages, int(np.dot(per, nshared)), np.repeat(np.arange(nconn), per)


class Network:
    """The chunks of a whole run on their links, by *stage*: a link's stage is one more
    than that of any link before it on a route, so the links of one stage feed none of
    each other and are carried together — every link's chunks sorted by arrival (in
    (message, slice) order on ties) and served by :func:`serve_links`."""

    def __init__(self, got: tuple | None, sizes: np.ndarray) -> None:
        """``got``: :func:`link_stages` of the run, ``sizes``: every chunk's bytes."""
        self.ok = got is not None
        self.events = 0
        self.stages: list[tuple] = []
        self.sizes = sizes
        if got is None:
            return
        stages, self.events, self.conn_of = got
        # chunks of one size (``direct`` from 16 MiB on: 4 M chunks of 1 MiB) on links of
        # one rate serve in one time: that one division, written out, not gathered
        one = bool(sizes.size) and float(sizes.min()) == float(sizes.max())
        for idx, rate, lat, seg, heads, bounds in stages:
            const = one and not isinstance(rate, np.ndarray)
            if const:
                # every chunk's the same time: as long as the longest link (link by link)
                # or the stage (sorted together), and read from the start, not gathered
                n = idx.size if seg is not None else max((b - a for a, b, _, _ in bounds),
                                                         default=0)
                ser = np.full(n, np.divide(sizes[:1], rate)[0])
            else:
                ser = self.sizes[idx]
                np.divide(ser, rate, out=ser)
            self.stages.append((idx, ser, const, lat, seg, heads, bounds))

    def carry(self, inject: np.ndarray, integer: bool) -> np.ndarray | None:
        """Arrival of every chunk injected (reaching its first link) at ``inject``, or
        None when a connection would deliver out of order (its chunks keep their order
        on every FIFO link, so this is a check)."""
        t = inject.copy()
        for idx, ser, const, lat, seg, heads, links in self.stages:
            x = t[idx]
            # per link by time; ties keep (message, slice): one sort and one service of
            # every link for a few chunks, link by link for many
            if seg is not None:
                o = by_link(x, seg)
                t[idx[o]] = serve_links(x[o], ser if const else ser[o], lat, heads, integer)
                continue
            for a, b, lt, _ in links:
                xs = x[a:b]
                if bool((xs[1:] >= xs[:-1]).all()):    # in order already (a first link)
                    s = ser[:b - a] if const else ser[a:b]
                    t[idx[a:b]] = fifo.serve(xs, s, lt, integer)[0]
                    continue
                o = np.argsort(xs, kind="stable") + a
                s = ser[:b - a] if const else ser[o]
                t[idx[o]] = fifo.serve(x[o], s, lt, integer)[0]
        back = (t[1:] < t[:-1]) & (self.conn_of[1:] == self.conn_of[:-1])
        return None if back.any() else t


def by_link(x: np.ndarray, seg: np.ndarray | int) -> np.ndarray:
    """The order of chunks ``x`` laid out link after link (``seg``: every chunk's link,
    nondecreasing) by link, then time, ties in place: ``np.lexsort((x, seg))``. When
    every link has as many chunks (``seg`` that count), the links are the rows of a
    matrix sorted row by row, stably: the same permutation, one sort of short rows
    instead of two of the whole stage (64 links of 896 chunks: 0.6-0.9 ms -> 0.4-0.6
    ms)."""
    if isinstance(seg, int):
        rows = x.reshape(-1, seg).argsort(axis=1, kind="stable")
        rows += (np.arange(rows.shape[0], dtype=rows.dtype) * seg)[:, None]
        return rows.reshape(-1)
    return np.lexsort((x, seg))


def users(routes: list[list[int]], shared: list[bool], nlinks: int
           ) -> tuple[list[list[tuple[int, np.ndarray]]], np.ndarray] | None:
    """The links of every stage with the connections crossing each, and every
    connection's shared links (its chunks' heap events); None when the routes cycle."""
    stage = link_stage(routes, nlinks)
    if stage is None:
        return None
    users: dict[int, list[int]] = {}
    for c, rt in enumerate(routes):
        for li in rt:
            users.setdefault(li, []).append(c)
    by: dict[int, list[int]] = {}
    for li in sorted(users):
        by.setdefault(stage[li], []).append(li)
    nshared = np.asarray([sum(shared[li] for li in rt) for rt in routes], np.int64)
    return ([[(li, np.asarray(users[li], np.int64)) for li in by[k]] for k in sorted(by)],
            nshared)


def ranges(lo: np.ndarray, ln: np.ndarray) -> np.ndarray:
    """lo[0], lo[0]+1, …, lo[0]+ln[0]−1, lo[1], …: the ranges one after another."""
    idx = np.repeat(lo - np.cumsum(ln) + ln, ln)
    idx += np.arange(idx.size)
    return idx


def link_stage(routes: list[list[int]], nlinks: int) -> list[int] | None:
    """Every link's stage (0 for a route's first link, one more than any link before it
    on a route), or None when the routes make a cycle."""
    order = fifo.link_order(routes, nlinks)
    if order is None:
        return None
    succ = fifo.successors(routes, nlinks)
    stage = [0] * nlinks
    for li in order:
        for b in succ[li]:
            if stage[b] <= stage[li]:
                stage[b] = stage[li] + 1
    return stage


def serve_links(arrive: np.ndarray, ser: np.ndarray, lat: np.ndarray, heads: np.ndarray,
                integer: bool, last: bool = False):
    """:func:`.rounds.serve` of several idle links at once: the chunks of each link
    in its order, one link after another, each link's first chunk marked in ``heads``
    (every link starts a busy period there), ``lat`` each chunk's link latency. With
    ``last``: also when each link is free again (after its last chunk)."""
    n = arrive.size
    if not n:
        return (np.empty(0), np.empty(0)) if last else np.empty(0)
    if n >= SORT_PER_LINK:                       # many chunks: link by link
        return _one_by_one(arrive, ser, lat, heads, integer, last)
    # the guess of :func:`.rounds.serve`, link by link: prefix sums restarted at
    # every link, each link's leads lifted above the last one's (a guess, checked below)
    pre = np.cumsum(ser)
    seg = np.cumsum(heads) - 1
    base = (pre - ser)[heads]
    lead = arrive - (pre - ser - base[seg])
    lift = 4.0 * (float(np.abs(lead).max()) + 1.0)
    lead += seg * lift
    starts = np.empty(n, bool)
    starts[0] = True
    starts[1:] = lead[1:] > np.maximum.accumulate(lead)[:-1]
    starts |= heads
    inner = ~heads[1:]
    for _ in range(4):
        free = fifo._periods(arrive, ser, starts, 0.0)
        late = arrive[1:] > free[:-1]            # chunk k finds the link idle
        wrong = ((starts[1:] & (arrive[1:] < free[:-1])) | (~starts[1:] & late)) & inner
        if not wrong.any():
            out = free + lat
            out = np.floor(out) if integer else out
            if last:
                return out, free[np.append(np.flatnonzero(heads[1:]), n - 1)]
            return out
        starts[1:] = late | heads[1:]
    return _one_by_one(arrive, ser, lat, heads, integer, last)


def _one_by_one(arrive: np.ndarray, ser: np.ndarray, lat: np.ndarray, heads: np.ndarray,
                integer: bool, last: bool = False):
    """:func:`serve_links` link by link."""
    n = arrive.size
    out = np.empty(n)
    ends = []
    cut = np.flatnonzero(heads).tolist() + [n]
    for a, b in zip(cut, cut[1:]):
        out[a:b], f = fifo.serve(arrive[a:b], ser[a:b], float(lat[a]), integer)
        ends.append(f)
    return (out, np.asarray(ends)) if last else out
