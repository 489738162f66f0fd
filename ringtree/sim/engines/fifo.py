"""Links as FIFOs served over arrays: the engine's per-chunk sums, a link at a time.

Every congestion-aware engine serves a link's chunks in the reference heap's order,
(arrival, message, slice), with the recurrence ASTRA-sim's ``Link.cpp`` runs per chunk
(Won et al., ASTRA-sim 2.0, ISPASS 2023):

    start_k = max(arrival_k, free_{k−1}),  free_k = start_k + bytes_k / rate,
    out_k = free_k + latency            (floored under the integer rule)

:func:`serve` evaluates it over arrays — within a busy period one running sum
(``numpy.cumsum`` adds left to right, as the engine does), an idle gap starting the next
— and :func:`link_order` orders links so that each comes after every link before it on a
route. Read by :mod:`.rounds` and :mod:`.link_stages`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["serve", "successors", "link_order", "PERIOD_HEAD", "PERIOD_ROWS"]


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
