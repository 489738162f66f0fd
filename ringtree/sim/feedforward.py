"""The congestion-aware network carried in rounds, a link stage at a time, not chunk by chunk.

The event engine (:mod:`.engine`) serves every link's chunks in its heap's order,
(arrival, message, slice): pushes never go back in time, so each link, shared or not,
sees its chunks sorted by that key. So when the chunks still to move are known, a link's
service is a pure function of their arrival times, and a link's arrivals are all known
once the links before it on every route are served. A *round* is what the engine can
inject before anything more arrives: hold those injections, visit the links stage by
stage (a link's stage is one more than that of any link before it on a route, so the
links of one stage feed none of each other and are sorted and served together,
:func:`.stages.serve_links`), serve each link with the engine's own sums (:func:`serve`),

    start_k = max(arrival_k, free_{k−1}),  free_k = start_k + bytes_k / rate,
    out_k = free_k + latency            (floored for the integer model)

— the recurrence ASTRA-sim's ``Link.cpp`` runs per chunk, here over arrays: within a
busy period it is one running sum (``numpy.cumsum`` adds left to right, as the engine
does); an idle gap starts the next sum — then deliver the round and let the receivers run
until the next round is held. Nothing is approximated: a round must reach every link
after the chunks of the rounds before it (in the heap's order), which is checked on every
link; when it does not, or the routes cycle, the run goes to the event heap. One-shot
``direct`` collectives (no send waits on a receive) are one round; two-shot and
halving-doubling ones at small sizes a few.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ringtree.sim import stages
from ringtree.sim.compile import Compiled

__all__ = ["serve", "successors", "link_order", "Rounds", "slices_at_once", "inject_all"]


def successors(routes: list[list[int]], nlinks: int) -> list[set[int]]:
    """For every link, the links that follow it directly on some route."""
    succ: list[set[int]] = [set() for _ in range(nlinks)]
    for rt in routes:
        for a, b in zip(rt, rt[1:]):
            succ[a].add(b)
    return succ


def link_order(routes: list[list[int]], nlinks: int) -> list[int] | None:
    """The links in an order where each comes after every link before it on a route
    (Kahn), or None when the routes make a cycle."""
    succ = successors(routes, nlinks)
    indeg = [0] * nlinks
    for s in succ:
        for b in s:
            indeg[b] += 1
    todo = [li for li in range(nlinks) if not indeg[li]]
    out: list[int] = []
    while todo:
        li = todo.pop()
        out.append(li)
        for b in succ[li]:
            indeg[b] -= 1
            if not indeg[b]:
                todo.append(b)
    return out if len(out) == nlinks else None


def serve(arrive: np.ndarray, ser: np.ndarray, lat: float, integer: bool,
          free0: float = 0.0) -> tuple[np.ndarray, float]:
    """Departure (+ latency) of chunks served in order by one FIFO link free from
    ``free0`` on, and when it is free again: the engine's ``max`` and left-to-right sums,
    one running sum per busy period.

    The periods are guessed from prefix sums (``free_k = max_j (a_j + s_j + … + s_k)``,
    rounded differently), summed exactly, and the guess is then *checked* on the exact
    sums: a period starts where a chunk arrives no earlier than the one before it
    leaves, and nowhere else. A wrong guess is corrected from the exact sums up to where
    it was wrong (a few rounds), else the chunks are served window by window."""
    n = arrive.size
    if not n:
        return np.empty(0), free0
    pre = np.cumsum(ser[:-1])
    lead = np.empty(n)
    lead[0] = arrive[0]
    np.subtract(arrive[1:], pre, out=lead[1:])
    starts = np.zeros(n, bool)
    starts[0] = True
    if n > 1 and float(lead[1:].max()) > lead[0]:   # else the guess is one period
        np.greater(lead[1:], np.maximum.accumulate(lead[:-1]), out=starts[1:])
    for _ in range(4):
        free = _periods(arrive, ser, starts, free0)
        late = arrive[1:] > free[:-1]            # chunk k finds the link idle
        wrong = (starts[1:] & (arrive[1:] < free[:-1])) | (~starts[1:] & late)
        if not wrong.any():
            return _out(free, lat, integer)
        starts[1:] = late
    return _windows(arrive, ser, lat, integer, free0)


def _out(free: np.ndarray, lat: float, integer: bool) -> tuple[np.ndarray, float]:
    out = free + lat
    return (np.floor(out) if integer else out), float(free[-1])


# a busy period's first chunks are summed across all periods at once, this many steps
PERIOD_HEAD = 4
# periods longer than that, up to this many, are summed one by one (else as rows)
PERIOD_ROWS = 64


def _periods(arrive: np.ndarray, ser: np.ndarray, starts: np.ndarray,
             free0: float) -> np.ndarray:
    """``free`` when busy periods begin exactly at ``starts``: per period the sum
    start + s_k + s_k+1 + … left to right. The first :data:`PERIOD_HEAD` sums of every
    period are one vector step each (most periods of a lightly loaded link end there);
    what is left of the longer periods goes on from its last sum, each period one
    cumulative sum when there are few, else periods of similar length side by side as
    rows of one cumulative sum."""
    n = arrive.size
    first = np.flatnonzero(starts)
    length = np.diff(np.append(first, n))
    free = np.empty(n)
    cur = arrive[first]
    cur[0] = max(cur[0], free0)
    for j in range(PERIOD_HEAD):
        at = first + j
        cur = cur + ser[at]
        free[at] = cur
        more = length > j + 1
        if not more.all():
            first, length, cur = first[more], length[more], cur[more]
            if not first.size:
                return free
    # row r: the period's last sum so far, then the chunks still to add
    first = first + PERIOD_HEAD - 1
    length = length - PERIOD_HEAD + 1
    if first.size <= PERIOD_ROWS:
        for f, ln, c in zip(first.tolist(), length.tolist(), cur.tolist()):
            acc = free[f:f + ln]
            acc[1:] = ser[f + 1:f + ln]
            acc[0] = c
            np.cumsum(acc, out=acc)
        return free
    width = 1 << np.ceil(np.log2(length)).astype(np.int64)
    for w in np.unique(width).tolist():
        sel = width == w
        f, ln = first[sel], length[sel]
        k = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)   # place in row
        at = np.repeat(f, ln) + k
        flat = np.repeat(np.arange(f.size) * w, ln) + k
        acc = np.zeros((f.size, w))
        row = acc.reshape(-1)
        row[flat] = ser[at]
        acc[:, 0] = cur[sel]
        np.cumsum(acc, axis=1, out=acc)
        free[at] = row[flat]
    return free


def _windows(arrive: np.ndarray, ser: np.ndarray, lat: float, integer: bool,
             free0: float = 0.0) -> tuple[np.ndarray, float]:
    """:func:`serve` read in windows that double while a busy period lasts."""
    n = arrive.size
    free = np.empty(n)
    k, w, prev = 0, 64, free0
    while k < n:
        e = min(n, k + w)
        acc = np.empty(e - k + 1)
        acc[0] = arrive[k] if arrive[k] > prev else prev
        acc[1:] = ser[k:e]
        np.cumsum(acc, out=acc)
        # the period lasts while each chunk arrives by the time the one before it leaves
        gap = np.nonzero(arrive[k + 1:e] > acc[1:e - k])[0]
        end = e if not gap.size else k + 1 + int(gap[0])
        free[k:end] = acc[1:end - k + 1]
        prev = float(free[end - 1])
        w = 64 if gap.size else 2 * w
        k = end
    return _out(free, lat, integer)


class Rounds:
    """The network of one run, carried a round at a time: the chunks injected since the
    last round, link *stage* by link stage (:func:`.stages.link_stage`: the links of one
    stage feed none of each other, so they are sorted and served together by
    :func:`.stages.serve_links`), each link continuing from where the last round left it.

    A round is exact only if every link serves its chunks after the ones of earlier
    rounds in the heap's order; :meth:`carry` checks that on every link (the first
    chunk of the round against the last one served) and returns None when it fails."""

    def __init__(self, cp: Compiled, routes: list[list[int]], shared: list[bool],
                 rate: list[float], llat: list[float], integer: bool) -> None:
        self.cp, self.routes = cp, routes
        self.integer = integer
        key = ("round links", id(routes), id(shared))    # kept for a sweep's sizes
        got = cp.memo.get(key)
        if got is None:
            got = cp.memo[key] = _round_links(routes, shared, len(rate)) + (routes, shared)
        self.order, self.stage, self.nshared, self.rl, self.rp, self.rlen = got[:6]
        self.rate = np.asarray(rate, np.float64)
        self.llat = np.asarray(llat, np.float64)
        per = [cp.step_slices[s] for s in cp.msg_sstep]      # slice bytes per message
        self.first = np.cumsum([0] + [len(x) for x in per])
        self.sizes = np.fromiter(chain.from_iterable(per), np.float64, int(self.first[-1]))
        self.msg_conn = np.asarray(cp.msg_conn, np.int64)
        # messages numbered connection by connection (:func:`.compile.pair`): sorting on
        # (connection, message, slice) is sorting on the chunk's (message, slice)
        self.by_conn = bool(np.all(self.msg_conn[1:] >= self.msg_conn[:-1]))
        nl = len(rate)
        self.free = np.zeros(nl)
        # the last chunk each link served, (arrival, message, slice)
        self.last_t, self.last_m = np.full(nl, -np.inf), np.full(nl, -1, np.int64)
        self.last_i = np.full(nl, -1, np.int64)
        self.conn_arr = np.zeros(len(routes))

    def carry(self, cm: list[int], ci: list[int], ct: list[float]
              ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """Delivery times of chunks (message ``cm``, slice ``ci``) injected at hop 0 at
        ``ct``, sorted by (connection, message, slice), with their messages and the heap
        events the engine would have processed; None if the round is out of order."""
        assert self.order is not None
        m = np.asarray(cm, np.int64)
        i = np.asarray(ci, np.int64)
        g = self.first[m] + i                   # the chunk's place in (message, slice)
        srt = np.argsort(g, kind="stable") if self.by_conn else np.lexsort(
            (i, m, self.msg_conn[m]))
        m, i = m[srt], i[srt]
        conn = self.msg_conn[m]
        t = np.asarray(ct, np.float64)[srt]
        sizes = self.sizes[self.first[m] + i]
        bounds = np.searchsorted(conn, np.arange(len(self.routes) + 1))
        count = np.diff(bounds)
        events = int(np.dot(count, self.nshared))
        busy = np.flatnonzero(count)
        # every (link, connection) of the round by (stage, link, connection), then every
        # chunk crossing each: a link's chunks in (connection, message, slice) order
        ln = self.rlen[busy]
        pc = np.repeat(busy, ln)
        pl = self.rl[stages.ranges(self.rp[busy], ln)]
        o = np.lexsort((pc, pl, self.stage[pl]))
        pl, pc = pl[o], pc[o]
        cnt = count[pc]
        idx = stages.ranges(bounds[pc], cnt)
        lk = np.repeat(pl, cnt)
        st = self.stage[lk]
        cut = np.flatnonzero(st[1:] != st[:-1]) + 1
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), idx.size]):
            if a < b and not self._stage(idx[a:b], lk[a:b], t, m, i, sizes):
                return None
        fa = bounds[busy]                         # a connection delivers in order
        t[fa] = np.maximum(t[fa], self.conn_arr[busy])
        back = np.flatnonzero((t[1:] < t[:-1]) & (conn[1:] == conn[:-1]))
        for c in np.unique(conn[back]).tolist():
            a, b = bounds[c], bounds[c + 1]
            np.maximum.accumulate(t[a:b], out=t[a:b])
        self.conn_arr[busy] = t[bounds[busy + 1] - 1]
        return m, t, events

    def _stage(self, idx: np.ndarray, lk: np.ndarray, t: np.ndarray, m: np.ndarray,
               i: np.ndarray, sizes: np.ndarray) -> bool:
        """Serve the chunks ``idx`` on their links ``lk`` (one stage, grouped by link):
        each link's in the heap's order (arrival, message, slice), from where the link's
        last round left it; False if a link's first chunk is not after its last one."""
        x = t[idx]
        o = np.lexsort((x, lk)) if self.by_conn else np.lexsort((i[idx], m[idx], x, lk))
        idx, lk, x = idx[o], lk[o], x[o]
        heads = np.empty(idx.size, bool)
        heads[0] = True
        heads[1:] = lk[1:] != lk[:-1]
        h = np.flatnonzero(heads)
        tails = np.append(h[1:] - 1, idx.size - 1)
        li = lk[h]
        hm, hi = m[idx[h]], i[idx[h]]
        lt, lm, lx = self.last_t[li], self.last_m[li], self.last_i[li]
        ht = x[h]
        if ((ht < lt) | ((ht == lt) & ((hm < lm) | ((hm == lm) & (hi <= lx))))).any():
            return False
        tk = idx[tails]
        self.last_t[li], self.last_m[li], self.last_i[li] = x[tails], m[tk], i[tk]
        # a link busy until free0 serves its first chunk from max(arrival, free0) on
        x[h] = np.maximum(x[h], self.free[li])
        out, free = stages.serve_links(x, sizes[idx] / self.rate[lk], self.llat[lk], heads,
                                       self.integer, last=True)
        self.free[li] = free
        t[idx] = out
        return True


def _round_links(routes: list[list[int]], shared: list[bool], nlinks: int) -> tuple:
    """What a run's rounds read of its routes: the link order (None when the routes
    cycle), every link's stage, every connection's shared links, and the routes as one
    array with each connection's start and length."""
    order = link_order(routes, nlinks)
    stage = np.asarray(stages.link_stage(routes, nlinks) or [0] * nlinks, np.int64)
    nshared = np.asarray([sum(shared[li] for li in rt) for rt in routes], np.int64)
    rlen = np.asarray([len(rt) for rt in routes], np.int64)
    rp = np.concatenate(([0], np.cumsum(rlen)[:-1])).astype(np.int64)
    rl = np.fromiter(chain.from_iterable(routes), np.int64, int(rlen.sum()))
    return order, stage, nshared, rl, rp, rlen


# -- the engine's side of a round: a step's slices sent at once ----------------------

def slices_at_once(eng, s: int, nsl: int) -> None:
    """The engine's ``slices`` of step ``s`` (with sends), which :func:`inject_all` injects;
    a step sending many slices (one-shot ``direct`` at large sizes) pays no Python per
    slice sent."""
    i0 = eng.nxt[s]
    rv, cs = eng.cp.step_recv[s], eng.comp[s]
    if not rv and cs is None:                # every slice is ready when the step is
        k, t = nsl, np.full(nsl - i0, eng.last[s])
    else:
        k = min([eng.narr[m] for m in rv], default=nsl)
        arr, ts, tk = eng.arr, [], eng.last[s]
        for i in range(i0, k):
            for m in rv:
                a = arr[m][i]
                if a > tk:
                    tk = a
            if cs is not None:
                tk += cs[i]
            ts.append(tk)
        if not ts:
            return
        t = np.array(ts)
    eng.last[s] = float(t[-1])
    eng.nxt[s] = k
    for m in eng.cp.step_send[s]:
        inject_all(eng, m, i0, t)


def inject_all(eng, m: int, i0: int, t: np.ndarray) -> None:
    """The engine's ``inject`` of slices i0, i0+1, … of message m, ready at ``t``, as
    arrays: the same running max and sums, slice by slice (rounds only)."""
    cp = eng.cp
    c = cp.msg_conn[m]
    if eng.conn_cur[c] != m:
        for k, tk in enumerate(t.tolist()):
            eng.ready(m, i0 + k, tk)
        return
    s, t = cp.msg_sstep[m], t.copy()
    if t[0] < eng.conn_inj[c]:
        t[0] = eng.conn_inj[c]
    np.maximum.accumulate(t, out=t)
    eng.conn_inj[c] = float(t[-1])
    sl, k = cp.step_slices[s], t.size
    b = eng.arrays.get(id(sl))
    if b is None:
        b = eng.arrays[id(sl)] = np.asarray(sl, np.float64)
    # a slice is never empty, and b / inf is 0: inject's t + (b / first or 0)
    fin = float((t + b[i0:i0 + k] / eng.conn_first[c]).max())
    if fin > eng.sdone[s]:
        eng.sdone[s] = fin
    eng.unsent[s] -= k
    if eng.unsent[s] == 0 and eng.nxt[s] == len(cp.step_slices[s]):
        eng.work.append(s)
    assert eng.cut is not None
    eng.cut[0].extend([m] * k)
    eng.cut[1].extend(range(i0, i0 + k))
    eng.cut[2].extend((t + eng.over).tolist())
    eng.injected(m, k)
