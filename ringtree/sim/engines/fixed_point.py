"""The event engine's answer as a fixed point: the step side as arrays, level by level,
and the network carried whole, alternated until neither changes.

Given when every chunk arrives, the engine's step side (:mod:`.reference`) is a pure
function of those arrivals — max-plus sums along every channel:

    start_s = max(0, start_prev(s), done_d for every memory dependency d),
    ready_s,i = max(ready_s,i−1 (start_s for i = 0), arrivals of slice i) + γ_s,i,
    inject_m,i = max(ready_sender(m),i, inject of the chunk before on m's connection),
    done_s = max(ready_s,last (start_s without slices), inject + bytes / first-link rate),

and given when every chunk is injected, the network is a pure function of those
injections: every link a FIFO in the heap's order (arrival, message, slice), carried
link by link with the engine's own sums (:func:`.rounds.serve`; :mod:`.link_stages`).
So this module evaluates the steps of one dependency *level* (one step per channel) as
one vector operation with the engine's floats — maxima, and additions in the engine's
order — then the whole network (the links of one *stage* at once), and repeats from the new arrivals
until the steps inject what they injected before, bit for bit (then the arrivals are
those of these injections too).

Such a fixed point is the engine's answer: every dependency adds time (a chunk crosses
each link in a positive time), so two different fixed points would differ first at some
earliest chunk and link, whose inputs — its own arrival there, and every chunk the link
served before it — are earlier and hence the same in both. A run that has not settled
after :data:`MAX_ITERATIONS` carries goes back to the engine. One-shot ``direct`` settles
after one carry, two-shot ``direct2`` after two to six.
"""

from __future__ import annotations

import numpy as np

from ringtree.sim.compile.compiled import Compiled
from ringtree.sim.engines import link_stages, native
from ringtree.sim.engines.contract import Declined, Job, Outcome, Result, many_at_once
from ringtree.sim.engines.reference import engine_for
from ringtree.sim.machine.model import Rules

__all__ = ["FixedPoint", "Levels", "run", "MAX_ITERATIONS"]

MAX_ITERATIONS = 12
GUESSED_ITERATIONS = 4    # carries from an extrapolated start before the plain start
CHUNK_RUNS = 64           # runs of messages alike below which chunk bytes go by blocks
# with the compiled heap a carry of the fixed point costs a third to a tenth of the
# heap's run (30-85 ns a chunk-hop against 260-700 ns a heap event: one-shot direct,
# direct2 and collnet_direct at 128 nodes), so a run that has not settled in this many
# carries goes to the heap (direct settles in one, direct2 in two to six; collnet_direct
# at 1 GiB on 128 nodes took twelve, 4.4 s against about 1.2 s on the heap)
NATIVE_ITERATIONS = 6


class FixedPoint:
    """The aware model settled as a fixed point of arrays (:func:`run`); declines an
    unaware model, a trace, runs whose ranks send few messages at once, and runs that
    do not settle (remembered for the structure's other sizes)."""

    name = "fixed_point"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        return many_at_once(job, rules) or job.remembered(self.name)

    def run(self, job: Job) -> Outcome | Declined:
        tries = min(MAX_ITERATIONS, NATIVE_ITERATIONS) if native.enabled() else \
            MAX_ITERATIONS
        res = run(engine_for(job, fresh=False), job.progress, tries)
        if res is None:
            return Declined(f"not settled in {tries} carries (or its routes cycle)",
                            remember=True)
        return Outcome(res.time_ns, res.events, res)


class Levels:
    """The steps of a run grouped by dependency level (one step per channel and level:
    a step comes after the previous step of its channel and after its memory
    dependencies), with the previous step and the dependencies of each, as arrays. None
    of this depends on the size (kept for a sweep in ``Compiled.memo``)."""

    def __init__(self, cp: Compiled) -> None:
        ns = cp.nsteps
        lev = [0] * ns
        for s in range(ns):                      # steps are numbered after their deps
            p = cp.step_prev[s]
            x = lev[p] + 1 if p >= 0 else 0
            for d in cp.step_deps[s]:
                if lev[d] >= x:
                    x = lev[d] + 1
            lev[s] = x
        order = np.argsort(np.asarray(lev, np.int64), kind="stable")
        counts = np.bincount(np.asarray(lev, np.int64)) if ns else np.zeros(0, np.int64)
        cuts = np.concatenate(([0], np.cumsum(counts)))
        prev = np.asarray(cp.step_prev, np.int64)
        self.steps: list[np.ndarray] = []
        self.prev: list[np.ndarray] = []
        self.deps: list[tuple[np.ndarray, np.ndarray]] = []    # (row, dependency)
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            S = order[a:b]
            self.steps.append(S)
            self.prev.append(prev[S])
            rows, ds = [], []
            for r, s in enumerate(S.tolist()):
                for d in cp.step_deps[s]:
                    rows.append(r)
                    ds.append(d)
            self.deps.append((np.asarray(rows, np.int64), np.asarray(ds, np.int64)))
        # per level: the k-th receive of every step (row, message), every send (row,
        # message), the steps that compute
        self.recv: list[list[tuple[np.ndarray, np.ndarray]]] = []
        self.send: list[tuple[np.ndarray, np.ndarray]] = []
        self.comp: list[np.ndarray] = []
        self.rank = np.asarray(cp.step_rank, np.int64)
        self.ops = np.asarray(cp.step_ops, np.float64)
        for S in self.steps:
            rv = [cp.step_recv[s] for s in S.tolist()]
            slots = []
            for k in range(max((len(x) for x in rv), default=0)):
                slots.append((np.asarray([r for r, x in enumerate(rv) if len(x) > k],
                                         np.int64),
                              np.asarray([x[k] for x in rv if len(x) > k], np.int64)))
            self.recv.append(slots)
            srow = [r for r, s in enumerate(S.tolist()) for _ in cp.step_send[s]]
            sm = [m for s in S.tolist() for m in cp.step_send[s]]
            self.send.append((np.asarray(srow, np.int64), np.asarray(sm, np.int64)))
            self.comp.append(np.asarray([r for r, s in enumerate(S.tolist())
                                         if cp.step_ops[s]], np.int64))


def _ok(cp: Compiled) -> bool:
    """The shapes this evaluation covers: messages numbered connection by connection
    (:func:`.compiled.pair`), no step sending twice on one connection, steps numbered
    after their dependencies."""
    conn = np.asarray(cp.msg_conn, np.int64)
    if conn.size and not bool(np.all(conn[1:] >= conn[:-1])):
        return False
    for s in range(cp.nsteps):
        snd = cp.step_send[s]
        if len(snd) > 1 and len({cp.msg_conn[m] for m in snd}) != len(snd):
            return False
        if cp.step_prev[s] >= s or any(d >= s for d in cp.step_deps[s]):
            return False
    return True


class _Shape:
    """What of a size's arrays depends only on how many slices every step has: where
    every message's chunks are, which chunks every level receives and sends, and the
    chunks of every link stage. The sizes of a sweep that slice alike (``direct2`` from
    4 KiB to 512 MiB: one slice per message) share it (``Compiled.memo`` keeps the
    latest); a size adds only bytes and times (:class:`_Size`)."""

    def __init__(self, eng, lv: Levels, nsl: np.ndarray) -> None:
        cp = eng.cp
        self.nsl, self.routes = nsl, eng.conn_links
        self.msg_step = np.asarray(cp.msg_sstep, np.int64)
        per = nsl[self.msg_step]
        self.first = np.concatenate(([0], np.cumsum(per, dtype=np.int64)))
        self.nchunks = int(self.first[-1])
        self.conn = np.asarray(cp.msg_conn, np.int64)
        self.levels = []
        for S, slots0, (srow, sm) in zip(lv.steps, lv.recv, lv.send):
            w = int(nsl[S].max()) if S.size else 0
            slots = [(rows, self.first[ms]) for rows, ms in slots0]
            sends = None
            if sm.size:
                k = nsl[S[srow]]
                row = np.repeat(srow, k)
                off = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
                sends = (row, off, np.repeat(self.first[sm], k) + off,
                         np.repeat(self.conn[sm], k))
            self.levels.append((w, slots, sends))
        self.stages = link_stages.link_stages(eng, self.conn, self.first)
        self.settled: list[tuple[float, np.ndarray]] = []   # (bytes, arrivals), last two

    def fits(self, eng, nsl: np.ndarray) -> bool:
        return self.routes is eng.conn_links and np.array_equal(self.nsl, nsl)


class _Size:
    """What one size adds to its shape: the bytes of every chunk, the steps' compute
    times, the time every chunk takes to leave its sender."""

    def __init__(self, eng, lv: Levels, shape: _Shape,
                 tuples: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.shape, self.nsl, self.nchunks = shape, shape.nsl, shape.nchunks
        self.conn, self.first = shape.conn, shape.first
        self.sizes = _chunk_bytes(tuples, shape)
        cfirst = np.asarray(eng.conn_first, np.float64)
        # γ = passes · bytes / reduction rate (:func:`.model.compute_ns`), 0 without one
        ops = lv.ops
        red = np.asarray(eng.red, np.float64)[lv.rank]
        kind, table, _ = tuples
        self.levels = []
        for S, crow, (w, slots, sends) in zip(lv.steps, lv.comp, shape.levels):
            comp = None
            if crow.size and w:
                comp = np.zeros((S.size, w))
                c = S[crow]
                ok = red[c] > 0
                comp[crow] = np.where(ok[:, None], ops[c][:, None] * table[kind[c], :w], 0.0)
                comp[crow[ok]] /= red[c[ok]][:, None]
            if sends is not None:
                row, off, g, c = sends
                sends = (row, off, g, c, self.sizes[g] / cfirst[c])
            self.levels.append((w, slots, comp, sends))


def _tuples(step_slices: list[tuple[int, ...]]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which of a few slice tuples every step has (:meth:`.structure.Structure.compile`
    shares one per length), those tuples as rows of bytes (padded with 0), and their
    lengths."""
    ids = np.fromiter(map(id, step_slices), np.int64, len(step_slices))
    u, first, kind = np.unique(ids, return_index=True, return_inverse=True)
    rows = [step_slices[i] for i in first.tolist()]
    table = np.zeros((len(rows), max(map(len, rows), default=0)))
    for r, x in enumerate(rows):
        table[r, :len(x)] = x
    return kind.reshape(-1), table, np.asarray([len(x) for x in rows], np.int64)


def _chunk_bytes(tuples: tuple[np.ndarray, np.ndarray, np.ndarray], shape: _Shape
                 ) -> np.ndarray:
    """Bytes of every chunk in (message, slice) order: the slices of its sending step,
    a block per run of messages sent by steps of one tuple."""
    step_kind, table, _ = tuples
    kind = step_kind[shape.msg_step]
    out = np.empty(shape.nchunks)
    if not kind.size:
        return out
    first = shape.first
    cut = np.flatnonzero(kind[1:] != kind[:-1]) + 1
    if cut.size < CHUNK_RUNS:
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), kind.size]):
            n = int(shape.nsl[shape.msg_step[a]])
            if n:
                out[first[a]:first[b]].reshape(b - a, n)[:] = table[kind[a], :n]
        return out
    n = shape.nsl[shape.msg_step]
    return table[np.repeat(kind, n), np.arange(shape.nchunks) - np.repeat(first[:-1], n)]


def _steps(lv: Levels, sz: _Size, arrive: np.ndarray, ns: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and done of every step and injection time of every chunk, given when every
    chunk arrives (``arrive`` in (message, slice) order)."""
    start = np.zeros(ns)
    done = np.zeros(ns)
    inject = np.zeros(sz.nchunks)
    conn_inj = np.zeros(int(sz.conn.max()) + 1 if sz.conn.size else 1)
    nsl = sz.nsl
    for S, P, (drow, dstep), (w, slots, comp, sends) in zip(lv.steps, lv.prev, lv.deps,
                                                           sz.levels):
        st = np.zeros(S.size)
        has = P >= 0
        np.maximum(st, np.where(has, start[np.maximum(P, 0)], 0.0), out=st)
        if drow.size:
            np.maximum.at(st, drow, done[dstep])
        start[S] = st
        n = nsl[S]
        ready = _ready(st, n, w, slots, comp, arrive)
        d = np.where(n > 0, ready[np.arange(S.size), np.maximum(n - 1, 0)], st) if w else \
            st.copy()
        if sends is not None:
            row, off, g, c, lag = sends
            inj = np.maximum(ready[row, off], conn_inj[c])
            inject[g] = inj
            # a connection's chunks go in (message, slice) order, ready times only grow:
            # its last chunk of the level is its latest
            np.maximum.at(conn_inj, c, inj)
            sdone = np.zeros(S.size)
            np.maximum.at(sdone, row, inj + lag)
            np.maximum(d, sdone, out=d)
        done[S] = d
    return start, done, inject


def _ready(st: np.ndarray, n: np.ndarray, w: int, slots: list, comp: np.ndarray | None,
           arrive: np.ndarray) -> np.ndarray:
    """When every slice of a level's steps is processed (rows: steps, columns: slices):
    ready_j = max(ready_j−1, the slice's arrivals) + γ_j from ready_−1 = start, column
    by column (a receive whose steps all have every slice reads its column whole)."""
    t = st.copy()
    ready = np.empty((w, st.size))               # by column: returned transposed
    # a receive whose steps all have every slice: its arrivals as one gather, a row
    # per slice, and when it is every step's in order, no gather of ``t`` either
    whole = [(arrive[np.arange(w)[:, None] + f], rows.size == st.size and
              bool((rows == np.arange(rows.size)).all()))
             if bool((n[rows] >= w).all()) else None for rows, f in slots]
    for j in range(w):
        for (rows, f), every in zip(slots, whole):
            if every is not None:
                if every[1]:
                    np.maximum(t, every[0][j], out=t)
                else:
                    t[rows] = np.maximum(t[rows], every[0][j])
                continue
            live = n[rows] > j
            r, g = rows[live], f[live] + j
            t[r] = np.maximum(t[r], arrive[g])
        if comp is not None:
            t += comp[:, j]
        ready[j] = t
    return ready.T


def run(eng, progress=None, tries: int | None = None):
    """Settle ``eng``'s run (an :class:`.reference._Engine` fresh from its set-up) as a fixed
    point: its :class:`~.reference.Result`, or None when this does not apply or the run
    does not settle in ``tries`` carries (default :data:`MAX_ITERATIONS`; the engine
    then runs it itself)."""
    if tries is None:
        tries = MAX_ITERATIONS
    cp = eng.cp
    got = cp.memo.get("levels")
    if got is None:
        got = cp.memo["levels"] = Levels(cp) if _ok(cp) else False
    if got is False:
        return None
    lv = got
    tuples = _tuples(cp.step_slices)
    nsl = tuples[2][tuples[0]]
    shape = cp.memo.get("shape")
    if shape is None or not shape.fits(eng, nsl):
        cp.memo.pop("shape", None)               # one shape kept: the latest
        shape = cp.memo["shape"] = _Shape(eng, lv, nsl)
    sz = _Size(eng, lv, shape, tuples)
    net = link_stages.Network(shape.stages, sz.sizes)
    if not net.ok:
        return None
    total = float(sz.sizes.sum())
    seen = shape.settled
    if len(seen) == 2 and seen[1][0] != seen[0][0]:
        # two sizes of this shape settled: their arrivals, extrapolated to this size's
        # bytes, are a start (any start settles on the same point; a near one sooner)
        (b1, a1), (b2, a2) = seen
        got = _settle(eng, lv, sz, net, a2 + (a2 - a1) * ((total - b2) / (b2 - b1)),
                      min(tries, GUESSED_ITERATIONS), progress)
        if got is not None:
            return got[0]
    got = _settle(eng, lv, sz, net, np.zeros(sz.nchunks), tries, progress)
    return None if got is None else got[0]


def _settle(eng, lv: Levels, sz: _Size, net: link_stages.Network, arrive: np.ndarray, tries: int,
            progress):
    """From these arrivals: the steps' injections, carry them, the steps' injections
    from those arrivals, until the same injections come again (then the arrivals are
    theirs too): the result, or None after ``tries`` carries."""
    cp = eng.cp
    inject = _steps(lv, sz, arrive, cp.nsteps)[2]
    for _ in range(tries):
        arrive = net.carry(inject + eng.over, eng.integer)
        if arrive is None:
            return None
        start, done, again = _steps(lv, sz, arrive, cp.nsteps)
        if np.array_equal(again, inject):
            if progress is not None:
                progress(net.events)
            seen = sz.shape.settled
            seen.append((float(sz.sizes.sum()), arrive))
            del seen[:-2]
            return (_result(eng, lv, start, done, net),)
        inject = again
    return None


def _result(eng, lv: Levels, start: np.ndarray, done: np.ndarray, net: link_stages.Network):
    """The engine's :meth:`~.reference._Engine.result` of these step times."""
    cp = eng.cp
    rank = lv.rank
    real = rank < cp.nranks
    rank_done = np.zeros(cp.nranks)
    np.maximum.at(rank_done, rank[real], done[real])
    rd = rank_done.tolist()
    return Result(max(rd, default=0.0), rd, cp.nmsgs, int(net.sizes.sum()), net.events,
                  start.tolist(), done.tolist(), None)
