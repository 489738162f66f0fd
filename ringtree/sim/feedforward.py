"""Runs whose sends wait on no receive: the network as one batch, link by link.

When no step that sends can be held up by an arrival (its channel's earlier steps and
the steps it waits on in memory receive nothing, and it receives nothing itself —
one-shot ``direct`` collectives, the first round of many others taken alone), every
chunk's injection time is known before any chunk moves. The congestion-aware network is
then a pure function of those times: each link is a FIFO that serves its chunks in the
engine's heap order, (arrival, message, slice), and a link's arrivals are all known once
the links before it on every route are served. Visiting the links in a topological order
of the routes (every route's links in route order) gives every chunk's delivery time
with the engine's own sums (:func:`serve`):

    start_k = max(arrival_k, free_{k−1}),  free_k = start_k + bytes_k / rate,
    out_k = free_k + latency            (floored for the integer model)

— the recurrence ASTRA-sim's ``Link.cpp`` runs per chunk, here over arrays: within a
busy period it is one running sum (``numpy.cumsum`` adds left to right, as the engine
does); an idle gap starts the next sum. Nothing is approximated, and when the routes
cycle (a link after another on one route and before it on another) the event engine runs
as usual. The receiving steps then run on the engine's dataflow with every arrival known.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ringtree.sim.compile import Compiled

__all__ = ["feed_forward", "serve", "link_order", "deliveries"]


def feed_forward(cp: Compiled) -> bool:
    """Can every sending step inject all its slices before anything arrives?

    A step needs an arrival to start if its channel's previous step does or a step it
    waits on in memory cannot finish without one; it needs one to finish if it also
    receives a message. Steps of a rank only name earlier steps of that rank."""
    starts = [False] * cp.nsteps            # start waits on an arrival
    ends = [False] * cp.nsteps              # done waits on an arrival
    prev, deps, recv, send = cp.step_prev, cp.step_deps, cp.step_recv, cp.step_send
    for s in range(cp.nsteps):
        p = prev[s]
        w = (p >= 0 and starts[p]) or any(ends[d] for d in deps[s])
        starts[s] = w
        ends[s] = w or bool(recv[s])
        if send[s] and ends[s]:
            return False
    return True


def link_order(routes: list[list[int]], nlinks: int) -> list[int] | None:
    """The links in an order where each comes after every link before it on a route
    (Kahn), or None when the routes make a cycle."""
    succ: list[set[int]] = [set() for _ in range(nlinks)]
    for rt in routes:
        for a, b in zip(rt, rt[1:]):
            succ[a].add(b)
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


def serve(arrive: np.ndarray, ser: np.ndarray, lat: float, integer: bool) -> np.ndarray:
    """Departure (+ latency) of chunks served in order by one FIFO link that starts idle:
    the engine's ``max`` and left-to-right sums, one running sum per busy period.

    The periods are guessed from prefix sums (``free_k = max_j (a_j + s_j + … + s_k)``,
    rounded differently), summed exactly, and the guess is then *checked* on the exact
    sums: a period starts where a chunk arrives no earlier than the one before it
    leaves, and nowhere else. A wrong guess is corrected from the exact sums up to where
    it was wrong (a few rounds), else the chunks are served window by window."""
    n = arrive.size
    if not n:
        return np.empty(0)
    pre = np.cumsum(ser)
    lead = arrive.copy()
    lead[1:] -= pre[:-1]
    starts = np.empty(n, bool)
    starts[0] = True
    starts[1:] = lead[1:] > np.maximum.accumulate(lead)[:-1]
    for _ in range(4):
        free = _periods(arrive, ser, starts)
        late = arrive[1:] > free[:-1]            # chunk k finds the link idle
        wrong = (starts[1:] & (arrive[1:] < free[:-1])) | (~starts[1:] & late)
        if not wrong.any():
            out = free + lat
            return np.floor(out) if integer else out
        starts[1:] = late
    return _windows(arrive, ser, lat, integer)


def _periods(arrive: np.ndarray, ser: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``free`` when busy periods begin exactly at ``starts``: per period the sum
    arrival + s_k + s_k+1 + … left to right, periods of similar length side by side as
    rows of one cumulative sum."""
    n = arrive.size
    first = np.flatnonzero(starts)
    length = np.diff(np.append(first, n))
    seg = np.cumsum(starts) - 1
    pos = np.arange(n) - first[seg]
    free = np.empty(n)
    width = np.maximum(1, 1 << np.ceil(np.log2(np.maximum(length, 1))).astype(np.int64))
    for w in np.unique(width).tolist():
        segs = np.flatnonzero(width == w)
        row = np.full(first.size, -1, np.int64)
        row[segs] = np.arange(segs.size)
        acc = np.zeros((segs.size, w + 1))
        acc[:, 0] = np.maximum(arrive[first[segs]], 0.0)
        mine = np.flatnonzero(row[seg] >= 0)
        acc[row[seg[mine]], pos[mine] + 1] = ser[mine]
        np.cumsum(acc, axis=1, out=acc)
        free[mine] = acc[row[seg[mine]], pos[mine] + 1]
    return free


def _windows(arrive: np.ndarray, ser: np.ndarray, lat: float, integer: bool) -> np.ndarray:
    """:func:`serve` read in windows that double while a busy period lasts."""
    n = arrive.size
    free = np.empty(n)
    k, w, prev = 0, 64, 0.0
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
    out = free + lat
    return np.floor(out) if integer else out


def deliveries(cp: Compiled, routes: list[list[int]], shared: list[bool], rate: list[float],
               llat: list[float], integer: bool, cm: list[int], ci: list[int],
               ct: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """Delivery time of every injected chunk (message ``cm``, slice ``ci``, at hop 0 at
    ``ct``), sorted by (connection, message, slice), with those keys and the heap events
    the engine would have processed; None when the routes cycle."""
    order = link_order(routes, len(rate))
    if order is None:
        return None
    m = np.asarray(cm, np.int64)
    i = np.asarray(ci, np.int64)
    conn = np.asarray(cp.msg_conn, np.int64)[m]
    srt = np.lexsort((i, m, conn))
    m, i, conn = m[srt], i[srt], conn[srt]
    t = np.asarray(ct, np.float64)[srt]
    per = [cp.step_slices[s] for s in cp.msg_sstep]          # slice bytes per message
    first = np.cumsum([0] + [len(x) for x in per])
    sizes = np.fromiter(chain.from_iterable(per), np.float64, int(first[-1]))[first[m] + i]
    bounds = np.searchsorted(conn, np.arange(len(routes) + 1))
    users: list[list[int]] = [[] for _ in rate]
    events = 0
    for c, rt in enumerate(routes):
        for li in rt:
            users[li].append(c)
        events += sum(shared[li] for li in rt) * int(bounds[c + 1] - bounds[c])
    for li in order:
        if not users[li]:
            continue
        idx = np.concatenate([np.arange(bounds[c], bounds[c + 1]) for c in users[li]])
        if not idx.size:
            continue
        by = np.lexsort((i[idx], m[idx], t[idx]))
        idx = idx[by]
        t[idx] = serve(t[idx], sizes[idx] / rate[li], llat[li], integer)
    for c in range(len(routes)):                  # a connection delivers in order
        a, b = bounds[c], bounds[c + 1]
        if b - a > 1:
            np.maximum.accumulate(t[a:b], out=t[a:b])
    return m, i, t, events
