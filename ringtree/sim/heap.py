"""The congestion-aware event heap of :mod:`.engine` as one loop over local names.

:meth:`.engine._Engine.loop` pops chunks from the heap in (arrival, message, slice) order
and carries each to its next shared link, and the step side (``drain``, ``slices``,
``ready``, ``inject``, ``deliver``, ``finish``) runs between pops. Each of those is a
method reading a dozen attributes of the engine per call, about ten calls per chunk: at
1,024 ranks the heap ran at about 200,000 events per second, nearly all of it that
Python. :func:`loop` is the same loop with the same state (the engine's own lists, which
:meth:`~.engine._Engine.result` then reads), the per-message lookups made once per run
(a message's slices, route, first link shared or not), the step side's functions bound
as closures over local names, and the carry and the delivery written into the pop loop.

It performs every operation of the engine in the same order — every comparison, every
``max`` as the same ``if a > t``, every sum with the same operands left to right, the
same pushes and pops of the same heap and the same work stack — so it reaches the same
floats: it is the engine, not an approximation of it. Its heap items are (arrival,
message, slice, hop), without the injection time the engine keeps for its trace: two
queued items never share (message, slice), so no comparison reaches the fields after it
and the pops come in the same order. ``tests/test_sim_heap.py`` compares the two bit for bit (every step's start and done, every rank's finish, events, messages,
bytes) on trees, CollNet and the other schedules, both aware models.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

__all__ = ["loop", "check"]


def check(eng) -> None:
    """What this loop (and :mod:`.native`'s, the same loop compiled) runs: an aware engine
    with no trace, no rounds held and no chunk queued."""
    if not eng.aware or eng.transfers is not None or eng.cut is not None or eng.heap:
        raise ValueError("the fused heap runs an aware engine without a trace, rounds "
                         "held or chunks queued")


def loop(eng, progress: Callable[[int], None] | None = None) -> None:
    """Run ``eng`` (an aware :class:`.engine._Engine`, fresh or after rounds that kept
    the heap's order, no trace) to the end, as :meth:`~.engine._Engine.loop` does."""
    check(eng)
    cp = eng.cp
    step_slices, step_recv, step_send = cp.step_slices, cp.step_recv, cp.step_send
    msg_conn, msg_rstep, nmsgs = cp.msg_conn, cp.msg_rstep, cp.nmsgs
    conn_links, conn_first, shared = eng.conn_links, eng.conn_first, eng.shared
    # per message: its slices, its route, and whether its first link is shared
    m_sl = [step_slices[s] for s in cp.msg_sstep]
    m_links = [conn_links[c] for c in msg_conn]
    m_head = [bool(rt) and shared[rt[0]] for rt in m_links]
    m_step = cp.msg_sstep
    comp = eng.comp
    nxt_in_chan, dependents = eng.nxt_in_chan, eng.dependents
    free, rate, llat, integer, over = eng.free, eng.rate, eng.llat, eng.integer, eng.over
    conn_inj, conn_arr, conn_cur = eng.conn_inj, eng.conn_arr, eng.conn_cur
    arr, narr, ninj, waiting, heap = eng.arr, eng.narr, eng.ninj, eng.waiting, eng.heap
    pend, start, done, maxin = eng.pend, eng.start, eng.done, eng.maxin
    nxt, last, unsent, sdone, work = eng.nxt, eng.last, eng.unsent, eng.sdone, eng.work
    heappush, heappop, heappushpop = heapq.heappush, heapq.heappop, heapq.heappushpop
    inf = math.inf

    def carry(m: int, i: int, t: float, hop: int):
        """:meth:`~.engine._Engine.network`, delivering at the end (``deliver``)."""
        b = m_sl[m][i]
        links = m_links[m]
        for h in range(hop, len(links)):
            li = links[h]
            if shared[li] and h != hop:
                return (t, m, i, h)
            st = free[li]
            if t > st:
                st = t
            ser = b / rate[li]
            free[li] = st + ser
            t = st + ser + llat[li]
            if integer:
                t = float(int(t))
        c = msg_conn[m]
        if t < conn_arr[c]:
            t = conn_arr[c]
        conn_arr[c] = t
        a = arr[m]
        if a is None:
            a = arr[m] = []
        a.append(t)
        narr[m] += 1
        r = msg_rstep[m]
        if start[r] >= 0.0 and nxt[r] == i:
            work.append(r)
        return None

    def inject(m: int, i: int, t: float) -> None:
        """:meth:`~.engine._Engine.inject` (aware, no rounds) and ``injected``."""
        c = msg_conn[m]
        if t < conn_inj[c]:
            t = conn_inj[c]
        s = m_step[m]
        sl = m_sl[m]
        b = sl[i]
        first = conn_first[c]
        conn_inj[c] = t
        fin = t + (b / first if b and first != inf else 0.0)
        if fin > sdone[s]:
            sdone[s] = fin
        unsent[s] -= 1
        if unsent[s] == 0 and nxt[s] == len(sl):
            work.append(s)
        if m_head[m]:
            heappush(heap, (t + over, m, i, 0))
        else:
            wait = carry(m, i, t + over, 0)
            if wait is not None:
                heappush(heap, wait)
        ninj[m] += 1
        if ninj[m] == len(sl):
            nm = m + 1
            if nm < nmsgs and msg_conn[nm] == c:
                conn_cur[c] = nm
                for j, tj in waiting.pop(nm, ()):
                    inject(nm, j, tj)

    events = eng.events
    while True:
        # the engine's ``drain`` (``begin``, ``slices``, ``ready``, ``finish``)
        while work:
            s = work.pop()
            if done[s] >= 0.0:
                continue
            if start[s] < 0.0:
                if pend[s]:
                    continue
                t = maxin[s]
                start[s] = t
                last[s] = t
                ns_ = nxt_in_chan[s]
                if ns_ >= 0:
                    if t > maxin[ns_]:
                        maxin[ns_] = t
                    pend[ns_] -= 1
                    if pend[ns_] == 0:
                        work.append(ns_)
            sl = step_slices[s]
            nsl = len(sl)
            rv, cs, sends = step_recv[s], comp[s], step_send[s]
            i = nxt[s]
            while i < nsl:
                t = last[s]
                for m in rv:
                    if narr[m] <= i:
                        break
                    a = arr[m][i]
                    if a > t:
                        t = a
                else:
                    if cs is not None:
                        t += cs[i]
                    last[s] = t
                    nxt[s] = i + 1
                    for m in sends:
                        if conn_cur[msg_conn[m]] == m:
                            inject(m, i, t)
                        else:
                            waiting.setdefault(m, []).append((i, t))
                    i = nxt[s]
                    continue
                break
            # finish
            if nxt[s] != nsl or unsent[s] or done[s] >= 0.0:
                continue
            t = last[s] if nsl else start[s]
            if sdone[s] > t:
                t = sdone[s]
            done[s] = t
            for d in dependents[s]:
                if t > maxin[d]:
                    maxin[d] = t
                pend[d] -= 1
                if pend[d] == 0:
                    work.append(d)
        if not heap:
            eng.events = events
            return
        t, m, i, h = heappop(heap)
        while True:
            events += 1
            if progress is not None and not events & 0xFFFF:
                progress(events)
            # ``carry`` from the shared link at hop h, written out
            b = m_sl[m][i]
            links = m_links[m]
            n = len(links)
            li = links[h]
            while True:
                st = free[li]
                if t > st:
                    st = t
                ser = b / rate[li]
                free[li] = st + ser
                t = st + ser + llat[li]
                if integer:
                    t = float(int(t))
                h += 1
                if h == n:
                    break
                li = links[h]
                if shared[li]:
                    break
            if h < n:                            # waits at its next shared link
                t, m, i, h = heappushpop(heap, (t, m, i, h))
                continue
            # the delivery at the end of ``carry``, written out again: one shared closure
            # called here cost 3-10 % of the loop (tree all-reduce on dgx_h100_sharp x64,
            # 64 MiB: 0.334-0.344 s of loop inline, 0.347-0.377 s through the call)
            c = msg_conn[m]
            if t < conn_arr[c]:
                t = conn_arr[c]
            conn_arr[c] = t
            a = arr[m]
            if a is None:
                a = arr[m] = []
            a.append(t)
            narr[m] += 1
            r = msg_rstep[m]
            if start[r] >= 0.0 and nxt[r] == i:
                work.append(r)
            break
