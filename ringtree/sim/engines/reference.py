"""The reference engine: runs every rank's Program on a modeled network, event by event.

It is the specification of the simulator: every other engine (:mod:`.dispatch`)
reproduces its floats bit for bit where it accepts a run (``tests/test_sim_conformance.py``),
and its aware heap loop (:meth:`_Engine.loop`) is the twin of the compiled one
(:mod:`.native`, ``_heapc.c``), operation for operation.

It mirrors the executor (``ringtree/runtime/executor.py``) rule for rule, so a simulated Program
and a real one take the same steps (:mod:`.compiled` uses the executor's compiler):

1. in-order issue — within a channel step i+1 starts no earlier than step i, and a step
   starts only when the earlier steps it conflicts with in memory
   (``Program.memory_deps``) are done;
2. sends never block; a step is done when its last slice is processed and its sends have
   left the device;
3. slicing — a step's data is cut into ``ceil(bytes/slice_bytes)`` near-equal slices
   that flow recv → reduce → send one after another, so chains and trees pipeline;
   zero-length steps do nothing;
4. messages of one (sender, receiver, channel) connection are injected and delivered in
   program order (a NCCL connection / TCP stream is a FIFO);
5. a link serves simultaneous arrivals in the order their senders issued them: chunks
   that reach a link at one instant go by message id, then slice, and message ids
   number senders by rank and one sender's connections in the order its Program first
   sends on them (:func:`ringtree.sim.compile.pairing.issue_order`), so any renaming of
   ranks that maps Programs onto Programs (the folds) keeps the order.

Times are nanoseconds. The engine is a dataflow over (step, slice) times plus, for the
congestion-aware model, an event heap ordering the chunks that meet on *shared* links.
A link used by a single connection sees that connection's chunks in injection order, so
it is resolved eagerly without events (exact, and the reason a ring on a fat-tree costs
few events) — the ASTRA-sim link FIFO (``Link.cpp``) evaluated only where chunks meet.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from functools import cached_property
from itertools import compress
from operator import mul, not_

import numpy as np

from ringtree.sim.compile.compiled import Compiled, connection_routes
from ringtree.sim.compile.routes import summaries
from ringtree.sim.engines.contract import Declined, Job, Outcome, Result
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Rules, compute_ns

__all__ = ["Result", "Reference", "engine_for"]


class _Network:
    """Links and connections: injection, the per-hop FIFO links, delivery."""

    def __init__(self, cp: Compiled, topo: Topology, devices: list[int],
                 rules: Rules, trace: bool, fresh: bool = True) -> None:
        self.aware = aware = rules.aware
        self.integer = rules.integer_ns
        self.over = rules.overhead_ns
        key = ("network", id(topo), tuple(devices), aware)     # kept for a sweep's sizes
        got = cp.memo.get(key)
        if got is None:
            got = cp.memo[key] = _connections(cp, topo, devices, aware)
        self.conn_lat, self.conn_bott, self.conn_first, self.conn_links, self.shared = got
        self.rate = [topo.bytes_per_ns(i) for i in range(len(topo.links))]
        self.llat = [lk.latency for lk in topo.links]
        self.cp, self.trace = cp, trace
        if fresh:
            self.fresh_network()

    def fresh_network(self) -> None:
        """Idle links and connections, nothing sent (what a run starts from)."""
        cp = self.cp
        self.free = [0.0] * len(self.rate)
        nconn, nm = len(cp.conns), cp.nmsgs
        self.conn_inj = [0.0] * nconn
        self.conn_arr = [0.0] * nconn
        self.conn_cur = [-1] * nconn     # message allowed to inject on the connection
        for m in range(nm - 1, -1, -1):
            self.conn_cur[cp.msg_conn[m]] = m
        self.arr: list = [None] * nm        # arrival times per slice, once one arrived
        self.narr = [0] * nm
        self.ninj = [0] * nm
        self.waiting: dict[int, list[tuple[int, float]]] = {}
        # chunks waiting at shared links, served in (arrival, message, slice) order: a
        # canonical FIFO tie-break that does not depend on the order of evaluation
        self.heap: list[tuple[float, int, int, int, float]] = []
        self.events = 0
        self.transfers: list | None = [] if self.trace else None
        # injections held back (message, slice, time), in rounds (:mod:`.rounds`), and
        # how a step sending many slices then injects them: (from how many, the function)
        self.cut: tuple[list[int], list[int], list[float]] | None = None
        self.send_at_once: tuple[int, Callable] = (0, None)


def _connections(cp: Compiled, topo: Topology, devices: list[int], aware: bool) -> tuple:
    """Latency, bottleneck, first-link rate and links of every connection, and which links
    more than one connection uses."""
    if aware and cp.link_rep is None:
        return summaries(cp, topo, devices)
    paths = connection_routes(cp, topo, devices, share=not aware)
    shared = [False] * len(topo.links)
    if aware:
        users: dict[int, set[int]] = {}
        for cid, p in enumerate(paths):
            for li in p.links:
                users.setdefault(li, set()).add(cid)
        for li, u in users.items():
            shared[li] = len(u) > 1
    return ([p.latency for p in paths], [p.bottleneck for p in paths],
            [p.first for p in paths], [p.links for p in paths], shared)


class _Engine(_Network):
    """The dataflow over (step, slice) times, driving :class:`_Network`."""

    def __init__(self, cp: Compiled, topo: Topology, devices: list[int],
                 rules: Rules, trace: bool, fresh: bool = True) -> None:
        """``fresh``: also set up the state of a run (else call :meth:`fresh_network` and
        :meth:`fresh_steps` before running; :mod:`.fixed_point` needs neither)."""
        super().__init__(cp, topo, devices, rules, trace, fresh)
        got = cp.memo.get("steps")                 # kept for a sweep's sizes
        if got is None:
            got = cp.memo["steps"] = _dependents(cp)
        self.nxt_in_chan, self.dependents, self.pend = got
        self.red = rules.reduce_rates(topo, devices)
        self.arrays: dict[int, np.ndarray] = {}     # id of a step's slices: their bytes
        self.pend0 = self.pend
        if fresh:
            self.fresh_steps()

    @cached_property
    def comp(self) -> list[list[float] | None]:
        """γ of every slice of every step that computes (None: it does not)."""
        cp = self.cp
        ops, sl, rk, red = cp.step_ops, cp.step_slices, cp.step_rank, self.red
        memo: dict[tuple[int, int, float], list[float]] = {}   # slices are shared tuples
        comp: list[list[float] | None] = [None] * cp.nsteps
        for s in compress(range(cp.nsteps), ops):
            k = (id(sl[s]), ops[s], red[rk[s]])
            got = memo.get(k)
            comp[s] = got if got is not None else memo.setdefault(
                k, [compute_ns(b, ops[s], k[2]) for b in sl[s]])
        return comp

    def fresh_steps(self) -> None:
        """No step issued yet."""
        cp, ns = self.cp, self.cp.nsteps
        sl = cp.step_slices
        self.pend = list(self.pend0)
        self.start = [-1.0] * ns
        self.done = [-1.0] * ns
        self.maxin = [0.0] * ns
        self.nxt = [0] * ns
        self.last = [0.0] * ns
        self.unsent = list(map(mul, map(len, sl), map(len, cp.step_send)))
        self.sdone = [0.0] * ns          # latest send completion of the step
        self.work = list(compress(range(ns), map(not_, self.pend)))   # pend == 0

    # -- network side ---------------------------------------------------------------

    def deliver(self, m: int, i: int, t: float, t0: float) -> None:
        cp = self.cp
        c = cp.msg_conn[m]
        if t < self.conn_arr[c]:
            t = self.conn_arr[c]
        self.conn_arr[c] = t
        a = self.arr[m]
        if a is None:
            a = self.arr[m] = []
        a.append(t)
        self.narr[m] += 1
        if self.transfers is not None:
            self.transfers.append((m, i, t0, t, cp.step_slices[cp.msg_sstep[m]][i]))
        r = cp.msg_rstep[m]
        if self.start[r] >= 0.0 and self.nxt[r] == i:
            self.work.append(r)

    def network(self, m: int, i: int, t: float, hop: int, t0: float
                ) -> tuple[float, int, int, int, float] | None:
        """Carry slice i of message m from hop ``hop`` of its route, arriving there at t,
        up to its next shared link (returned as the heap item that waits there) or to
        its receiver (None)."""
        cp = self.cp
        b = cp.step_slices[cp.msg_sstep[m]][i]
        links = self.conn_links[cp.msg_conn[m]]
        shared, free, rate, llat, integer = (self.shared, self.free, self.rate, self.llat,
                                             self.integer)
        for h in range(hop, len(links)):
            li = links[h]
            if shared[li] and h != hop:
                return (t, m, i, h, t0)
            st = free[li]
            if t > st:
                st = t
            ser = b / rate[li]
            free[li] = st + ser
            t = st + ser + llat[li]
            if integer:
                t = float(int(t))
        self.deliver(m, i, t, t0)
        return None

    def inject(self, m: int, i: int, t: float) -> None:
        cp = self.cp
        c = cp.msg_conn[m]
        if t < self.conn_inj[c]:
            t = self.conn_inj[c]
        s = cp.msg_sstep[m]
        b = cp.step_slices[s][i]
        bott, first = self.conn_bott[c], self.conn_first[c]
        # The α-β pipe of a connection carries one slice at a time (links do it when aware).
        self.conn_inj[c] = t if self.aware or not b else t + b / bott
        fin = t + (b / first if b and first != math.inf else 0.0)
        if fin > self.sdone[s]:
            self.sdone[s] = fin
        self.unsent[s] -= 1
        if self.unsent[s] == 0 and self.nxt[s] == len(cp.step_slices[s]):
            self.work.append(s)
        if self.cut is not None:
            self.cut[0].append(m)
            self.cut[1].append(i)
            self.cut[2].append(t + self.over)
        elif self.aware:
            links = self.conn_links[c]
            if links and self.shared[links[0]]:
                heapq.heappush(self.heap, (t + self.over, m, i, 0, t))
            else:
                wait = self.network(m, i, t + self.over, 0, t)
                if wait is not None:
                    heapq.heappush(self.heap, wait)
        else:
            d = self.over + self.conn_lat[c] + (b / bott if b else 0.0)
            self.deliver(m, i, t + (float(int(d)) if self.integer else d), t)
        self.injected(m, 1)

    def injected(self, m: int, k: int) -> None:
        """k more slices of message m have left; once all have, the next may go."""
        cp = self.cp
        self.ninj[m] += k
        if self.ninj[m] == len(cp.step_slices[cp.msg_sstep[m]]):
            c, nm = cp.msg_conn[m], m + 1
            if nm < cp.nmsgs and cp.msg_conn[nm] == c:
                self.conn_cur[c] = nm
                for j, tj in self.waiting.pop(nm, ()):
                    self.inject(nm, j, tj)

    def ready(self, m: int, i: int, t: float) -> None:
        if self.conn_cur[self.cp.msg_conn[m]] == m:
            self.inject(m, i, t)
        else:
            self.waiting.setdefault(m, []).append((i, t))

    # -- step side ------------------------------------------------------------------

    def begin(self, s: int, t: float) -> None:
        """Issue step s at t; the next step of its channel may now be issued too."""
        self.start[s] = t
        self.last[s] = t
        ns_ = self.nxt_in_chan[s]
        if ns_ >= 0:
            if t > self.maxin[ns_]:
                self.maxin[ns_] = t
            self.pend[ns_] -= 1
            if self.pend[ns_] == 0:
                self.work.append(ns_)

    def slices(self, s: int) -> None:
        """Process every slice of step s whose inputs have all arrived."""
        sl = self.cp.step_slices[s]
        nsl = len(sl)
        if self.cut is not None and self.cp.step_send[s]:
            least, at_once = self.send_at_once
            if nsl - self.nxt[s] >= least:
                at_once(self, s, nsl)
                return
        rv = self.cp.step_recv[s]
        cs = self.comp[s]
        nxt, narr, arr, last = self.nxt, self.narr, self.arr, self.last
        sends = self.cp.step_send[s]
        while nxt[s] < nsl:
            i = nxt[s]
            t = last[s]
            for m in rv:
                if narr[m] <= i:
                    return
                a = arr[m][i]
                if a > t:
                    t = a
            if cs is not None:
                t += cs[i]
            last[s] = t
            nxt[s] = i + 1
            for m in sends:
                self.ready(m, i, t)

    def finish(self, s: int) -> None:
        """Step s is done if its slices are processed and its sends have left."""
        nsl = len(self.cp.step_slices[s])
        if self.nxt[s] != nsl or self.unsent[s] or self.done[s] >= 0.0:
            return
        t = self.last[s] if nsl else self.start[s]
        if self.sdone[s] > t:
            t = self.sdone[s]
        self.done[s] = t
        maxin, pend = self.maxin, self.pend
        for d in self.dependents[s]:
            if t > maxin[d]:
                maxin[d] = t
            pend[d] -= 1
            if pend[d] == 0:
                self.work.append(d)

    def drain(self) -> None:
        work, done, start, pend = self.work, self.done, self.start, self.pend
        while work:
            s = work.pop()
            if done[s] >= 0.0:
                continue
            if start[s] < 0.0:
                if pend[s]:
                    continue
                self.begin(s, self.maxin[s])
            self.slices(s)
            self.finish(s)

    def loop(self, progress: Callable[[int], None] | None = None) -> None:
        """Pop the heap in order, carrying each chunk to its next shared link. Until a
        chunk is delivered the step side has nothing to do, so a chunk that reaches a
        shared link is pushed and the heap's first popped in one ``heappushpop`` (the
        push, the empty drain and the pop it replaces, in the same order)."""
        heap, network = self.heap, self.network
        while True:
            self.drain()
            if not heap:
                return
            t, m, i, h, t0 = heapq.heappop(heap)
            while True:
                self.events += 1
                if progress is not None and not self.events & 0xFFFF:
                    progress(self.events)
                wait = network(m, i, t, h, t0)
                if wait is None:
                    break
                t, m, i, h, t0 = heapq.heappushpop(heap, wait)

    def result(self) -> Result:
        cp, done = self.cp, self.done
        at = np.asarray(done, np.float64)
        if (at < 0.0).any():
            stuck = np.flatnonzero(at < 0.0)[:4].tolist()
            desc = "; ".join(f"rank {cp.step_rank[s]} ch {cp.step_chan[s]} step "
                             f"{cp.step_name[s]}" for s in stuck)
            raise RuntimeError(f"simulation deadlocked: {desc}")
        # each rank's latest step (times are sums from +0.0: no -0.0 for max to order)
        rk = np.asarray(cp.step_rank, np.int64)
        real = rk < cp.nranks
        latest = np.zeros(cp.nranks, np.float64)
        np.maximum.at(latest, rk[real], at[real])
        rank_done = latest.tolist()
        sent = list(map(cp.step_slices.__getitem__, cp.msg_sstep))  # shared tuples
        by_id = dict(zip(map(id, sent), sent))
        nbytes = sum(sum(by_id[k]) * n for k, n in Counter(map(id, sent)).items())
        return Result(max(rank_done, default=0.0), rank_done, cp.nmsgs, nbytes, self.events,
                      self.start, done, self.transfers)


def _dependents(cp: Compiled) -> tuple[list[int], list, list[int]]:
    """The next step of every step's channel, the steps waiting on it (in step order;
    one shared empty tuple for the many that none waits on), and how many steps every
    step waits for. A channel's steps form a chain, so no two steps name the same
    previous one."""
    ns = cp.nsteps
    prev = np.asarray(cp.step_prev, np.int64)
    has = prev >= 0
    nxt = np.full(ns, -1, np.int64)
    nxt[prev[has]] = np.flatnonzero(has)
    ndeps = np.fromiter(map(len, cp.step_deps), np.int64, ns)
    none: tuple[int, ...] = ()
    dependents: list = [none] * ns
    for s in np.flatnonzero(ndeps).tolist():
        for d in cp.step_deps[s]:
            if dependents[d] is none:
                dependents[d] = [s]
            else:
                dependents[d].append(s)
    return nxt.tolist(), dependents, (has + ndeps).tolist()


def engine_for(job: Job, fresh: bool = True) -> _Engine:
    """The event engine's state for ``job`` (fresh: set up to run from the start)."""
    return _Engine(job.compiled, job.topo, job.devices, job.rules, job.trace, fresh)


class Reference:
    """The event engine itself, the specification every other engine reproduces: any
    model, any run, with or without a trace. ``progress(events)`` every 65,536 heap
    events."""

    name = "reference"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        return "the α-β model asked for (model fast)" if rules.alpha_beta else None

    def run(self, job: Job) -> Outcome | Declined:
        eng = engine_for(job)
        eng.loop(job.progress)
        res = eng.result()
        return Outcome(res.time_ns, res.events, res)
