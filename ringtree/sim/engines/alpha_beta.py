"""The α-β fast path: the congestion-unaware model as one longest-path problem in numpy.

Under the congestion-unaware model (Hockney α-β; ASTRA-sim's ``congestion_unaware``
backend) no two transfers interact, so the whole run is a max-plus recurrence over a DAG
whose nodes are the times of the engine (:mod:`.reference`), with the same rules:

- ``start(s)   = max(start(prev in channel), done(conflicting steps))``
- ``R(s, i)    = max(R(s, i−1) | start(s), A(m, i) for m received) + γ(s, i)``
- ``I(m, i)    = max(R(sender, i), I(m, i−1) + b/B)`` (one slice at a time per connection,
  connections in program order)
- ``A(m, i)    = max(I(m, i) + o + Σlat + b/B, A(m, i−1))`` (FIFO delivery)
- ``done(s)    = max(R(s, last), I(m, i) + b/B_first)``

Evaluating it level by level (Kahn's algorithm, one vectorised relaxation per level) gives
exactly the engine's ``unaware`` answer — the tests check equality — at a fraction of
the per-event cost, which is what makes sweeps over sizes and thousands of ranks cheap.
This is the "aggregation where exact" of the simulator: all slices and all ranks of a
level are one numpy operation.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ringtree.sim.compile.compiled import Compiled, connection_routes
from ringtree.sim.engines.contract import Declined, Job, Outcome
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Rules

__all__ = ["AlphaBeta", "run", "longest_path"]


class AlphaBeta:
    """The congestion-unaware model as one longest-path problem (:func:`run`): asked for
    with ``model="fast"``, whose rules are the unaware model's; it answers the time and
    the chunks carried, not every step's times (so it declines any other model, whose
    callers may read them)."""

    name = "alpha_beta"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        return None if rules.alpha_beta else "answers the α-β time only (model fast)"

    def run(self, job: Job) -> Outcome | Declined:
        cp = job.compiled
        t = run(cp, job.topo, job.devices, job.rules)
        return Outcome(t, sum(len(cp.step_slices[s]) for s in cp.msg_sstep))


def _edges(cp: Compiled, topo: Topology, devices: list[int], rules: Rules
           ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    NS, NM = cp.nsteps, cp.nmsgs
    nsl = np.fromiter((len(x) for x in cp.step_slices), np.int64, NS)
    rbase = np.zeros(NS + 1, np.int64)
    np.cumsum(nsl, out=rbase[1:])
    TR = int(rbase[-1])
    sbytes = np.fromiter(chain.from_iterable(cp.step_slices), np.float64, TR)
    sstep = np.asarray(cp.msg_sstep, np.int64)
    rstep = np.asarray(cp.msg_rstep, np.int64)
    conn = np.asarray(cp.msg_conn, np.int64)
    mnsl = nsl[sstep] if NM else np.zeros(0, np.int64)
    ibase = np.zeros(NM + 1, np.int64)
    np.cumsum(mnsl, out=ibase[1:])
    TI = int(ibase[-1])
    START, DONE, R0 = 0, NS, 2 * NS
    I0, A0 = R0 + TR, R0 + TR + TI
    N = A0 + TI

    red = np.array(rules.reduce_rates(topo, devices))
    ops = np.asarray(cp.step_ops, np.float64)
    srank = np.asarray(cp.step_rank, np.int64)
    nw = np.zeros(N)
    step_of_slice = np.repeat(np.arange(NS), nsl)
    slice_idx = np.arange(TR) - rbase[step_of_slice]
    rate = red[srank][step_of_slice]
    o = ops[step_of_slice]
    with np.errstate(divide="ignore", invalid="ignore"):
        gam = np.where((rate > 0) & (o > 0), o * sbytes / np.where(rate > 0, rate, 1), 0.0)
    nw[R0:R0 + TR] = gam

    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    wt: list[np.ndarray] = []

    def add(a, b, w=0.0) -> None:
        a = np.asarray(a, np.int64)
        src.append(a)
        dst.append(np.asarray(b, np.int64))
        wt.append(np.broadcast_to(np.asarray(w, np.float64), a.shape).copy())

    prev = np.asarray(cp.step_prev, np.int64)
    has = prev >= 0
    add(START + prev[has], START + np.nonzero(has)[0])
    dl = [len(d) for d in cp.step_deps]
    if sum(dl):
        add(DONE + np.fromiter(chain.from_iterable(cp.step_deps), np.int64),
            START + np.repeat(np.arange(NS), dl))
    steps = np.arange(NS)
    add(START + steps, DONE + steps)
    first = nsl > 0
    add(START + steps[first], R0 + rbase[:-1][first])
    later = slice_idx > 0
    rid = R0 + np.arange(TR)
    add(rid[later] - 1, rid[later])
    add(R0 + rbase[1:][first] - 1, DONE + steps[first])

    if NM:
        paths = connection_routes(cp, topo, devices, share=True)
        lat = np.array([p.latency for p in paths])[conn]
        bott = np.array([p.bottleneck for p in paths])[conn]
        frst = np.array([p.first for p in paths])[conn]
        msg_of = np.repeat(np.arange(NM), mnsl)
        mi = np.arange(TI) - ibase[msg_of]
        b = sbytes[rbase[sstep][msg_of] + mi]
        iid, aid = I0 + np.arange(TI), A0 + np.arange(TI)
        add(aid, R0 + rbase[rstep][msg_of] + mi)                 # arrival → receiver slice
        add(R0 + rbase[sstep][msg_of] + mi, iid)                 # sender slice → injection
        pipe = np.where(b > 0, b / bott[msg_of], 0.0)
        inner = mi > 0
        add(iid[inner] - 1, iid[inner], pipe[np.nonzero(inner)[0] - 1])
        add(aid[inner] - 1, aid[inner])
        delay = rules.overhead_ns + lat[msg_of] + pipe
        if rules.integer_ns:
            delay = np.floor(delay)
        add(iid, aid, delay)
        fin = np.where((b > 0) & np.isfinite(frst[msg_of]), b / frst[msg_of], 0.0)
        add(iid, DONE + sstep[msg_of], fin)
        same = np.nonzero(conn[1:] == conn[:-1])[0] + 1           # m with a previous message
        same = same[mnsl[same] > 0]
        lastp = ibase[same] - 1                                   # last slice of m−1
        add(I0 + lastp, I0 + ibase[same], pipe[lastp])
        add(A0 + lastp, A0 + ibase[same])
    return N, np.concatenate(src), np.concatenate(dst), np.concatenate(wt), nw, srank


def longest_path(N: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray,
                 nw: np.ndarray) -> np.ndarray:
    """t(v) = max over edges (t(u) + w) + nw(v), level by level (vectorised Kahn)."""
    order = np.argsort(src, kind="stable")
    src, dst, w = src[order], dst[order], w[order]
    eptr = np.zeros(N + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=N), out=eptr[1:])
    indeg = np.bincount(dst, minlength=N)
    acc = np.zeros(N)
    t = np.zeros(N)
    frontier = np.nonzero(indeg == 0)[0]
    seen = 0
    while frontier.size:
        seen += frontier.size
        t[frontier] = acc[frontier] + nw[frontier]
        lo, hi = eptr[frontier], eptr[frontier + 1]
        cnt = hi - lo
        total = int(cnt.sum())
        if not total:
            break
        off = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(total)
        d = dst[off]
        np.maximum.at(acc, d, t[src[off]] + w[off])
        ud, c = np.unique(d, return_counts=True)
        indeg[ud] -= c
        frontier = ud[indeg[ud] == 0]
    if seen != N:
        raise RuntimeError("simulation deadlocked (cyclic wait in the Programs)")
    return t


def run(cp: Compiled, topo: Topology, devices: list[int], rules: Rules) -> float:
    """Completion time (ns) of the last real rank under the congestion-unaware model
    (``rules``, :class:`~ringtree.sim.machine.model.Rules`)."""
    N, src, dst, w, nw, srank = _edges(cp, topo, devices, rules)
    t = longest_path(N, src, dst, w, nw)
    done = t[cp.nsteps:2 * cp.nsteps]
    real = srank < cp.nranks
    return float(done[real].max()) if real.any() else 0.0
