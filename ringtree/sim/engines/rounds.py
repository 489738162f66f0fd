"""The congestion-aware network carried in rounds, a link stage at a time, not chunk by chunk.

The event engine (:mod:`.reference`) serves every link's chunks in its heap's order,
(arrival, message, slice): pushes never go back in time, so each link, shared or not,
sees its chunks sorted by that key. So when the chunks still to move are known, a link's
service is a pure function of their arrival times, and a link's arrivals are all known
once the links before it on every route are served. A *round* is what the engine can
inject before anything more arrives: hold those injections, visit the links stage by
stage (a link's stage is one more than that of any link before it on a route, so the
links of one stage feed none of each other and are sorted and served together,
:func:`.link_stages.serve_links`), serve each link with the engine's own sums (:func:`serve`),

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

from ringtree.sim.compile.compiled import Compiled
from ringtree.sim.engines import fifo, link_stages, native
from ringtree.sim.engines.contract import Declined, Job, Outcome, many_at_once
from ringtree.sim.engines.reference import engine_for
from ringtree.sim.machine.model import Rules

__all__ = ["RoundsEngine", "Rounds", "carry", "slices_at_once", "inject_all", "AT_ONCE"]

AT_ONCE = 8        # a step sending this many slices more injects them as arrays


class RoundsEngine:
    """The aware model's network carried in rounds (:func:`carry`); declines an unaware
    model, a trace, runs whose ranks send few messages at once (a tree's rounds are too
    small to pay), routes that cycle, and a round that would leave the heap's order."""

    name = "rounds"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        why = many_at_once(job, rules)
        if why is not None:
            return why
        if native.enabled() and job.remembered("fixed_point"):
            # collnet_direct at 1 GiB on 128 nodes: rounds 2.1 s, then out of order
            return "the fixed point did not settle here: the compiled heap is faster"
        return job.remembered(self.name)

    def run(self, job: Job) -> Outcome | Declined:
        eng = engine_for(job)
        done = carry(eng, job.progress)
        if done is None:
            return Declined("the routes cycle (no link order)")
        if not done:
            return Declined("a round would leave the heap's order on a link", remember=True)
        res = eng.result()
        return Outcome(res.time_ns, res.events, res)


def carry(eng, progress=None) -> bool | None:
    """Carry ``eng``'s network (an :class:`~.reference._Engine`, fresh) a round at a time
    (:class:`Rounds`): hold every injection back until nothing else can happen without an
    arrival, carry the held chunks link by link, deliver them, repeat. A run whose sends
    wait on no arrival (one-shot ``direct``) is one round. True: done; None: not tried
    (the routes cycle); False: a round would be served out of the heap's order."""
    cp = eng.cp
    net = Rounds(cp, eng.conn_links, eng.shared, eng.rate, eng.llat, eng.integer)
    if net.order is None:
        return None
    arr, narr, rstep = eng.arr, eng.narr, cp.msg_rstep
    eng.send_at_once = (AT_ONCE, slices_at_once)
    while True:
        eng.cut = ([], [], [])
        eng.drain()
        (cm, ci, ct), eng.cut = eng.cut, None
        if not cm:
            return True
        got = net.carry(cm, ci, ct)
        if got is None:
            return False
        m, t, events = got
        eng.events += events
        cuts = [0, *(np.flatnonzero(m[1:] != m[:-1]) + 1).tolist(), m.size]
        times, ms = t.tolist(), m.tolist()
        for a, b in zip(cuts, cuts[1:]):
            x = ms[a]
            if arr[x] is None:
                arr[x] = times[a:b]
            else:
                arr[x].extend(times[a:b])
            narr[x] += b - a
        eng.work.extend({rstep[ms[a]] for a in cuts[:-1]})
        if progress is not None:
            progress(eng.events)


class Rounds:
    """The network of one run, carried a round at a time: the chunks injected since the
    last round, link *stage* by link stage (:func:`.link_stages.link_stage`: the links of one
    stage feed none of each other, so they are sorted and served together by
    :func:`.link_stages.serve_links`), each link continuing from where the last round left it.

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
        # messages numbered connection by connection (:func:`.compiled.pair`): sorting on
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
        pl = self.rl[link_stages.ranges(self.rp[busy], ln)]
        o = np.lexsort((pc, pl, self.stage[pl]))
        pl, pc = pl[o], pc[o]
        cnt = count[pc]
        idx = link_stages.ranges(bounds[pc], cnt)
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
        out, free = link_stages.serve_links(x, sizes[idx] / self.rate[lk], self.llat[lk], heads,
                                       self.integer, last=True)
        self.free[li] = free
        t[idx] = out
        return True


def _round_links(routes: list[list[int]], shared: list[bool], nlinks: int) -> tuple:
    """What a run's rounds read of its routes: the link order (None when the routes
    cycle), every link's stage, every connection's shared links, and the routes as one
    array with each connection's start and length."""
    order = fifo.link_order(routes, nlinks)
    stage = np.asarray(link_stages.link_stage(routes, nlinks) or [0] * nlinks, np.int64)
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
