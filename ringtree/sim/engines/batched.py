"""The batched engine: a shared template Program run for all ranks at once, in numpy.

When every rank runs the same template (:mod:`.symbolic`), the per-rank event loop of
:mod:`.reference` repeats one computation per rank. Here each template step is evaluated
for every simulated rank as one vector operation, level by level through the template's
dependency graph (issue order, ``Program.memory_deps`` of the executor's compiler, and
sends feeding receives), with exactly the engine's arithmetic:

- a step starts at ``max(start(previous step of its channel), done(memory deps))``;
- slice i is ready at ``max(ready(i−1), arrivals of slice i) + γ``, injected at
  ``max(ready, previous injection on the connection)``;
- congestion-aware: every link is a FIFO serving chunks in order of arrival — the
  engine's heap order, (time, message, slice), a message's order being (sender, its
  connection's rank in ``Template.conn_rank``, step). A level's chunks are sorted per
  link and served in that order. The order is *verified*: if any link would serve a chunk that
  arrived before one it already served (a later level overtaking an earlier one), the
  batch is abandoned with :class:`Unordered` and the caller runs the event engine;
- congestion-unaware: a connection is a pipe of its bottleneck bandwidth, shared as in
  :func:`~ringtree.sim.machine.model.channel_shares`.

State is O(simulated ranks × template steps) floats; nothing is kept per message.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ringtree.ir.program import Program
from ringtree.sim.compile.symbolic import peer_offset
from ringtree.sim.compile.template import Template, Unordered
from ringtree.sim.engines.contract import Declined, Job, Outcome
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Rules, channel_shares, path

__all__ = ["Batched", "Template", "Unordered", "run", "run_copies"]


class Batched:
    """A shared template run for every simulated rank at once (:func:`run`); declines a
    plan without a template (schedules whose generators branch on the rank, runs not
    folded) and a run whose levels would leave the reference's order."""

    name = "batched"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        if job.plan.batch is None:
            return "no shared template for this run"
        return "a trace keeps every transfer (the reference engine does)" if job.trace \
            else None

    def run(self, job: Job) -> Outcome | Declined:
        plan = job.plan
        try:
            t, events = run(plan.batch, plan.template, job.topo, job.devices, job.rules,
                            progress=job.progress)
        except Unordered as e:
            return Declined(f"{e}")
        return Outcome(t, events)


class _Links:
    """The routes of the template's connections and the FIFO state of their links."""

    def __init__(self, tp: Template, t: Program, topo: Topology, devices: list[int],
                 aware: bool) -> None:
        n, g = tp.n, tp.gc                      # routes of one copy, then tiled
        offs = sorted({(c, peer_offset(q, n)) for c, _, s in tp.steps for q in s.send_to})
        self.conn = {k: i for i, k in enumerate(offs)}         # (c, a) -> column
        ranks = range(g)
        routes = [[topo.route(devices[r], devices[(r + a) % n], c) for (c, a) in offs]
                  for r in ranks]
        share = None
        if not aware:
            every = [(r, topo.route(devices[r], devices[(r + a) % n], c))
                     for r in range(n) for (c, a) in tp.share_offs]
            share = channel_shares(every)
        paths = [[path(topo, rt, share) for rt in row] for row in routes]
        self.lat = np.array([[p.latency for p in row] for row in paths]).reshape(g, -1)
        self.bott = np.array([[p.bottleneck for p in row] for row in paths]).reshape(g, -1)
        self.first = np.array([[p.first for p in row] for row in paths]).reshape(g, -1)
        h = max((len(rt) for row in routes for rt in row), default=0)
        self.route = np.full((g, len(offs), h), -1, np.int64)
        for r, row in enumerate(routes):
            for k, rt in enumerate(row):
                self.route[r, k, :len(rt)] = rt
        nl = len(topo.links)
        users: dict[int, set[tuple[int, int]]] = {}
        for r, row in enumerate(routes):
            for k, rt in enumerate(row):
                for li in rt:
                    users.setdefault(li, set()).add((r, k))
        # a link one connection uses serves it in order: no sorting, no order check
        self.shared = np.zeros(max(1, nl), bool)
        for li, u in users.items():
            self.shared[li] = len(u) > 1
        self.rate = np.array([topo.bytes_per_ns(i) for i in range(nl)] or [1.0])
        self.llat = np.array([lk.latency for lk in topo.links] or [0.0])
        self.nl = max(1, nl)
        b = tp.copies
        if b > 1:                                # copy k: its ranks' rows, its own links
            self.lat, self.bott, self.first = (np.tile(x, (b, 1)) for x in
                                               (self.lat, self.bott, self.first))
            shift = (np.arange(b) * self.nl).repeat(g)[:, None, None]
            rt = np.tile(self.route, (b, 1, 1))
            self.route = np.where(rt >= 0, rt + shift, -1)
            self.shared, self.rate, self.llat = (np.tile(x[:self.nl], b) for x in
                                                 (self.shared, self.rate, self.llat))
        self.free = np.zeros(b * self.nl)
        self.last_t = np.full(b * self.nl, -np.inf)
        self.last_k = np.zeros((b * self.nl, 4), np.int64)


class _Run:
    """One batched simulation of a :class:`Template`."""

    def __init__(self, tp: Template, t: Program, topo: Topology, devices: list[int],
                 rules: Rules) -> None:
        self.tp, self.topo = tp, topo
        self.aware = rules.aware
        self.integer = rules.integer_ns
        self.links = _Links(tp, t, topo, devices, self.aware)
        g, ns = tp.g, len(tp.steps)
        red = np.array(rules.reduce_rates(topo, [devices[r % tp.gc] for r in range(g)]))
        self.comp = [(tp.ops[s] * tp.sl[s] / red[:, None]) if tp.ops[s] and red.all()
                     else None for s in range(ns)]
        if any(tp.ops) and not red.all():
            self.comp = [(tp.ops[s] * tp.sl[s] / np.where(red > 0, red, np.inf)[:, None])
                         if tp.ops[s] else None for s in range(ns)]
        self.start: list[np.ndarray | None] = [None] * ns
        self.done: list[np.ndarray | None] = [None] * ns
        self.arr: dict[tuple[int, int], np.ndarray] = {}
        nconn = len(self.links.conn)
        self.conn_inj = np.zeros((nconn, g))
        self.conn_arr = np.zeros((nconn, g))
        self.over = rules.overhead_ns
        self.events = np.zeros(tp.copies, np.int64)     # per copy
        self.chunks: list[tuple] = []
        self.tmax = np.zeros(tp.copies)
        self.needed = {d for ds in tp.deps for d in ds}

    def begin(self, s: int) -> np.ndarray:
        tp = self.tp
        st = np.zeros(tp.g)
        p = tp.prev[s]
        if p >= 0:
            st = np.maximum(st, _known(self.start[p]))
            self.start[p] = None                 # its only reader is the next step
        for d in tp.deps[s]:
            st = np.maximum(st, _known(self.done[d]))
        return st

    def group(self, steps: list[int]) -> None:
        """Steps of one level with the same shape, as one (steps, ranks, slices) batch."""
        tp = self.tp
        s0 = tp.steps[steps[0]][2]
        st = np.stack([self.begin(s) for s in steps])
        for s, row in zip(steps, st):
            self.start[s] = row
        nsl = np.stack([tp.nsl[s] for s in steps])
        sl = np.stack([tp.sl[s] for s in steps])
        shape = sl.shape
        ins = [np.stack([self._arrivals(s, p, shape[1:]) for s in steps])
               for p in range(len(s0.recv_from))]
        comp = None
        if any(self.comp[s] is not None for s in steps):
            comp = np.stack([self.comp[s] if self.comp[s] is not None else np.zeros(shape[1:])
                             for s in steps])
        r = st.copy()
        rs = np.zeros(shape)
        for i in range(shape[2]):
            t = r
            for a in ins:
                t = np.maximum(t, a[:, :, i])
            if comp is not None:
                t = t + comp[:, :, i]
            r = np.where(nsl > i, t, r)
            rs[:, :, i] = t
        sdone = np.zeros(shape[:2])
        for pos in range(len(s0.send_to)):
            self.inject(steps, pos, rs, nsl, sl, sdone)
        done = np.maximum(np.where(nsl > 0, r, st), sdone)
        if done.size:
            np.maximum(self.tmax, done.reshape(-1, tp.copies, tp.gc).max(axis=(0, 2)),
                       out=self.tmax)
        for s, row in zip(steps, done):
            if s in self.needed:                 # kept only for steps that wait on it
                self.done[s] = row

    def _arrivals(self, s: int, p: int, shape) -> np.ndarray:
        a = self.arr.pop((s, p), None)
        return a if a is not None else np.zeros(shape)

    def inject(self, steps: list[int], pos: int, rs: np.ndarray, nsl: np.ndarray,
               sl: np.ndarray, sdone: np.ndarray) -> None:
        tp, lk = self.tp, self.links
        g, ns = tp.g, len(steps)
        meta = [tp.send_of[(s, pos)] for s in steps]            # (rstep, rpos, offset)
        cols = np.array([lk.conn[(tp.steps[s][0], m[2])] for s, m in zip(steps, meta)])
        offs = np.array([m[2] for m in meta])
        own = np.arange(g) % tp.gc                 # rank within its copy
        recv = (own[None, :] + offs[:, None]) % tp.n % tp.gc + (np.arange(g) - own)[None, :]
        rows = np.arange(ns)[:, None]
        bott, first, lat = lk.bott[:, cols].T, lk.first[:, cols].T, lk.lat[:, cols].T
        got = np.zeros(sl.shape)
        for i in range(sl.shape[2]):
            on = nsl > i
            b = sl[:, :, i]
            t = np.maximum(rs[:, :, i], self.conn_inj[cols])
            with np.errstate(invalid="ignore"):
                self.conn_inj[cols] = np.where(on, t if self.aware else t + b / bott,
                                               self.conn_inj[cols])
                fin = t + b / first
            np.maximum(sdone, np.where(on, fin, sdone), out=sdone)
            if self.aware:
                k, w = np.nonzero(on)
                self.chunks.append((w, cols[k], np.full(w.size, i), t[k, w] + self.over,
                                    b[k, w], recv[k, w], np.array(
                                        [tp.conn_rank[(tp.steps[s][0], m[2])]
                                         for s, m in zip(steps, meta)])[k],
                                    np.array([tp.steps[s][1] for s in steps])[k],
                                    [(m[0], m[1]) for m in meta], k))
                continue
            d = self.over + lat + b / bott
            if self.integer:
                d = np.floor(d)
            arrive = np.maximum(t + d, self.conn_arr[cols])
            self.conn_arr[cols] = np.where(on, arrive, self.conn_arr[cols])
            got[rows, recv, i] = arrive
            self.events += on.reshape(-1, tp.copies, tp.gc).sum(axis=(0, 2))
        if not self.aware:
            for m, row in zip(meta, got):
                self.arr[(m[0], m[1])] = row

    def level(self, steps: list[int]) -> None:
        self.chunks = []
        tp = self.tp
        groups: dict[tuple, list[int]] = {}
        for s in steps:
            st = tp.steps[s][2]
            groups.setdefault((tp.sl[s].shape[1], len(st.recv_from), len(st.send_to),
                               self.comp[s] is None), []).append(s)
        for grp in groups.values():
            self.group(grp)
        if self.aware and self.chunks:
            self.network()

    def network(self) -> None:
        """Carry the level's chunks over their routes, link FIFOs in arrival order."""
        src, col, sli, t, b, recv, rank, jj = (np.concatenate([c[k] for c in self.chunks])
                                               for k in range(8))
        lk = self.links
        for h in range(lk.route.shape[2]):
            link = lk.route[src, col, h]
            on = link >= 0
            if not on.any():
                break
            sh = lk.shared[link] & on
            one = np.nonzero(on & ~sh)[0]
            if one.size:
                t[one] = self._single(link[one], t[one], b[one], sli[one])
            sh = np.nonzero(sh)[0]
            if sh.size:
                t[sh] = self._hop(link[sh], t[sh], b[sh], (src[sh], rank[sh], jj[sh],
                                                           sli[sh]))
        self.events += np.bincount(src // self.tp.gc, minlength=self.tp.copies)
        self._deliver(src, col, sli, t, recv)

    def _hop(self, link, t, b, keys) -> np.ndarray:
        lk = self.links
        order = np.lexsort((t, link))
        sl, st = link[order], t[order]
        if ((sl[1:] == sl[:-1]) & (st[1:] == st[:-1])).any():   # a tie: the whole key
            order = np.lexsort(tuple(reversed((link, t) + keys)))
        link, t, b = link[order], t[order], b[order]
        first = np.ones(link.size, bool)
        first[1:] = link[1:] != link[:-1]
        heads = np.nonzero(first)[0]
        lastpos = np.append(heads[1:], link.size) - 1
        at_heads, at_last = order[heads], order[lastpos]
        self._check(link[heads], t[heads], np.stack([k[at_heads] for k in keys], 1))
        sizes = lastpos - heads + 1
        pos = np.arange(link.size) - np.repeat(heads, sizes)
        ser = b / lk.rate[link]
        out = self._fifo(link, t, ser, heads, sizes, pos)
        if self.integer:
            out = np.floor(out)
        lk.last_t[link[lastpos]] = t[lastpos]
        lk.last_k[link[lastpos]] = np.stack([k[at_last] for k in keys], 1)
        res = np.empty_like(out)
        res[order] = out
        return res

    def _single(self, link, t, b, sli) -> np.ndarray:
        """Links with one connection: its slices in order, the engine's sums."""
        lk = self.links
        out = np.empty_like(t)
        for i in range(int(sli.max()) + 1):
            w = np.nonzero(sli == i)[0] if i or sli.any() else slice(None)
            li = link[w]
            st = np.maximum(lk.free[li], t[w])
            ser = b[w] / lk.rate[li]
            lk.free[li] = st + ser
            out[w] = st + ser + lk.llat[li]
        return np.floor(out) if self.integer else out

    def _fifo(self, link, t, ser, heads, sizes, pos) -> np.ndarray:
        """Each link serves its chunks in order: start = max(free, arrival), free =
        start + serialization, out = free + latency — the engine's sums, in its order.
        Chunks that queue behind the previous one are one running sum per link (a row
        of a cumulative sum, added left to right); links where a chunk finds the link
        idle are served one position at a time."""
        lk = self.links
        ng, width = heads.size, int(sizes.max())
        gid = np.repeat(np.arange(ng), sizes)
        st0 = np.maximum(lk.free[link[heads]], t[heads])
        acc = np.zeros((ng, width + 1))
        acc[:, 0] = st0
        acc[gid, pos + 1] = ser
        np.cumsum(acc, axis=1, out=acc)
        start = acc[gid, pos]
        if (t[pos > 0] > start[pos > 0]).any():      # an idle gap: exact slow path
            out = np.empty_like(t)
            for p in range(width):
                w = np.nonzero(pos == p)[0]
                li = link[w]
                st = np.maximum(lk.free[li], t[w])
                lk.free[li] = st + ser[w]
                out[w] = st + ser[w] + lk.llat[li]
            return out
        done = acc[gid, pos + 1]
        lk.free[link[heads + sizes - 1]] = done[heads + sizes - 1]
        return done + lk.llat[link]

    def _check(self, link, t, ks) -> None:
        """The first chunk a link serves in this batch must come after its last one."""
        lk = self.links
        lt = lk.last_t[link]
        late = np.nonzero(t < lt)[0]
        if late.size:
            raise Unordered("a later level overtakes an earlier one on a link",
                            int(link[late[0]]) // lk.nl)
        for w in np.nonzero(t == lt)[0]:
            if tuple(ks[w]) <= tuple(lk.last_k[link[w]]):
                raise Unordered("two chunks reach a link at once out of order",
                                int(link[w]) // lk.nl)

    def _deliver(self, src, col, sli, t, recv) -> None:
        g = self.tp.g
        base = 0
        for c in self.chunks:
            n_ = len(c[0])
            seg = slice(base, base + n_)
            base += n_
            r, cc, i = src[seg], col[seg], sli[seg]
            a = np.maximum(t[seg], self.conn_arr[cc, r])
            self.conn_arr[cc, r] = a
            k = c[9]
            for row, (s2, p2) in enumerate(c[8]):
                w = k == row
                got = self.arr.get((s2, p2))
                if got is None:
                    got = self.arr[(s2, p2)] = np.zeros((g, self.tp.sl[s2].shape[1]))
                got[recv[seg][w], i[w]] = a[w]


def _known(a: np.ndarray | None) -> np.ndarray:
    """A time already computed (the template's levels order every reader after it)."""
    if a is None:
        raise Unordered("a step read a time before it was computed")
    return a


def run(tp: Template, t: Program, topo: Topology, devices: list[int], rules: Rules,
        progress: Callable[[int], None] | None = None) -> tuple[float, int]:
    """Completion time (ns) of the last rank and the chunks carried; raises
    :class:`Unordered` when the batched order cannot be the event engine's."""
    times, events = run_copies(tp, t, topo, devices, rules, progress)
    return times[0], events[0]


def run_copies(tp: Template, t: Program, topo: Topology, devices: list[int],
               rules: Rules, progress: Callable[[int], None] | None = None
               ) -> tuple[list[float], list[int]]:
    """:func:`run` of every copy of a :func:`~.template.stacked` Template: each copy's
    completion time and chunks carried. :class:`Unordered` names the copy that broke
    the order (the others may still be run, stacked again without it)."""
    r = _Run(tp, t, topo, devices, rules)
    for k, steps in enumerate(tp.order):
        r.level(steps)
        if progress is not None and not k & 63:
            progress(int(r.events.sum()))
    return r.tmax.tolist(), r.events.tolist()
