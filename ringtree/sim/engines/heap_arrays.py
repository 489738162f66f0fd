"""The compiled heap's run set up from a Compiled's arrays (:class:`~..compile.wired.Wired`).

:func:`.native.loop` packs the reference engine's state (:class:`.reference._Engine`:
lists per step, message, connection and link) into the arrays ``_heapc`` runs on. A run
compiled as arrays (the tree from its wiring) has every one of those arrays already, or
one NumPy expression away, so :func:`run` builds the same arrays from it — the same
integers and floats at the same indices — without making the engine's lists or the
Compiled's, and reads the result (:class:`~.contract.Result`) off the arrays the loop
leaves, as :meth:`.reference._Engine.result` reads it off the lists. Pools (a step's
slices, its compute times) are laid out per table row instead of per shared tuple:
``_heapc`` reads them only through their offsets, so the values it reads are the same.
``tests/test_sim_heap_arrays.py`` compares every array, dereferenced, with the list
path's, and the runs' floats and events.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import numpy as np

from ringtree.sim.compile.routes import route_links, shared_links
from ringtree.sim.compile.wired import Wired
from ringtree.sim.engines.contract import Job, Outcome, Result
from ringtree.sim.machine.model import compute_ns

__all__ = ["arrays", "run"]

_I, _F = np.int64, np.float64


def _starts(lens: np.ndarray) -> np.ndarray:
    """Offsets (len + 1) of rows of these lengths."""
    off = np.zeros(len(lens) + 1, _I)
    np.cumsum(lens, out=off[1:])
    return off


def _gather(off: np.ndarray, pool: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows ``at`` of the packed rows (``off``, ``pool``), packed in that order."""
    lens = off[1:][at] - off[:-1][at]
    out = _starts(lens)
    return out, pool[np.repeat(off[:-1][at] - out[:-1], lens) + np.arange(out[-1], dtype=_I)]


def _steps(cp: Wired, red: list[float]) -> tuple[np.ndarray, ...]:
    """Per step: start and number of its slices in the bytes' pool, the pool, start of
    its compute times in theirs (−1: it computes nothing), that pool; the steps' next in
    channel, dependents (offsets, steps) and how many steps each waits for."""
    a = cp.arrays
    row, rank, ops = a["row"], a["step_rank"], a["step_ops"]
    slices, deps, _ = a["table"]
    sl_off = _starts(np.fromiter(map(len, slices), _I, len(slices)))
    pool_b = np.fromiter(chain.from_iterable(slices), _I, int(sl_off[-1]))
    sl_n = (sl_off[1:] - sl_off[:-1])[row]
    # γ per (row, reduce rate) of the steps that compute: compute_ns of each slice
    rates, rid = np.unique(np.asarray(red, _F)[rank], return_inverse=True)
    key = row * len(rates) + rid.reshape(-1)
    comp = ops != 0
    keys, one, inv = np.unique(key[comp], return_index=True, return_inverse=True)
    rl = rates.tolist()
    lists = [[compute_ns(b, p, rl[k % len(rl)]) for b in slices[k // len(rl)]]
             for k, p in zip(keys.tolist(), ops[comp][one].tolist())]
    c_off = _starts(np.fromiter(map(len, lists), _I, len(lists)))
    comp_start = np.full(len(row), -1, _I)
    comp_start[comp] = c_off[:-1][inv.reshape(-1)]
    pool_c = np.fromiter(chain.from_iterable(lists), _F, int(c_off[-1]))
    prev = a["step_prev"]
    has = prev >= 0
    nxt = np.full(len(row), -1, _I)
    nxt[prev[has]] = np.flatnonzero(has)
    d_off = _starts(np.fromiter(map(len, deps), _I, len(deps)))
    pool_d = np.fromiter(chain.from_iterable(deps), _I, int(d_off[-1]))
    ndeps = (d_off[1:] - d_off[:-1])[row]
    waits = np.repeat(np.arange(len(row), dtype=_I), ndeps)     # in step order
    on = _gather(d_off, pool_d, row)[1] + a["first"][waits]
    order = np.argsort(on, kind="stable")       # each step's dependents in step order
    dp_off = _starts(np.bincount(on, minlength=len(row)))
    return (sl_off[:-1][row], sl_n, pool_b, comp_start, pool_c, nxt, dp_off,
            waits[order], has + ndeps)


def arrays(job: Job) -> tuple[tuple, np.ndarray]:
    """(the arrays ``_heapc.run`` reads, the steps ready at the start), as
    :func:`.native.loop` packs them for a fresh engine of ``job``."""
    cp, topo, rules = job.compiled, job.topo, job.rules
    assert isinstance(cp, Wired)
    a = cp.arrays
    sl_start, sl_n, pool_b, comp_start, pool_c, nic, dp_off, dp, pend = _steps(
        cp, rules.reduce_rates(topo, job.devices))
    uniq, idx = route_links(cp, topo, job.devices)
    u_off = _starts(np.fromiter(map(len, uniq), _I, len(uniq)))
    pool = np.fromiter(chain.from_iterable(uniq), _I, int(u_off[-1]))
    cl_off, cl = _gather(u_off, pool, idx)
    shared = shared_links(uniq, idx, len(topo.links)).astype(_I)
    rate = np.asarray([topo.bytes_per_ns(i) for i in range(len(topo.links))], _F)
    # a route's first link's rate (:func:`~ringtree.sim.machine.model.path`; inf: none)
    first = np.full(len(uniq), np.inf)
    some = u_off[1:] > u_off[:-1]
    first[some] = rate[pool[u_off[:-1][some]]]
    conn_first = first[idx]
    nconn, nm, ns = len(idx), cp.nmsgs, cp.nsteps
    conn, sstep = a["msg_conn"], a["msg_sstep"]
    arr_off = _starts(sl_n[sstep])
    conn_cur = np.full(nconn, -1, _I)
    heads, first_msg = np.unique(conn, return_index=True)
    conn_cur[heads] = first_msg
    sd_off, sd = a["send"]
    rv_off, rv = a["recv"]
    unsent = sl_n * (sd_off[1:] - sd_off[:-1])
    llat = np.asarray([lk.latency for lk in topo.links], _F)
    state_i = (pend, np.zeros(ns, _I), unsent, np.zeros(nm, _I), np.zeros(nm, _I),
               np.zeros(nm, _I), conn_cur)
    state_f = (np.full(ns, -1.0), np.full(ns, -1.0), *(np.zeros(ns, _F) for _ in range(3)),
               *(np.zeros(int(arr_off[-1]), _F) for _ in range(2)),
               *(np.zeros(nconn, _F) for _ in range(2)), np.zeros(len(topo.links), _F))
    out = (sl_start, sl_n, pool_b, comp_start, rv_off, rv, sd_off, sd, nic, dp_off, dp,
           conn, a["msg_rstep"], sstep, cl_off, cl, shared, arr_off, pool_c, conn_first,
           rate, llat, *state_i, *state_f)
    return out, np.flatnonzero(pend == 0).astype(_I)


def run(job: Job, heap: Callable) -> Outcome:
    """``job`` run to the end by ``heap`` (``_heapc.run``) on :func:`arrays`."""
    packed, work = arrays(job)
    events = heap(packed, float(job.rules.overhead_ns), bool(job.rules.integer_ns), 0, work,
                  job.progress)
    res = result(job.compiled, packed[-10], packed[-9], events)
    return Outcome(res.time_ns, res.events, res)


def result(cp: Wired, start: np.ndarray, done: np.ndarray, events: int) -> Result:
    """What :meth:`.reference._Engine.result` reads off the engine's lists, off the
    arrays: every rank's latest step, the bytes the messages carried."""
    if (done < 0.0).any():
        stuck = np.flatnonzero(done < 0.0)[:4].tolist()
        desc = "; ".join(f"rank {cp.step_rank[s]} ch {cp.step_chan[s]} step "
                         f"{cp.step_name[s]}" for s in stuck)
        raise RuntimeError(f"simulation deadlocked: {desc}")
    a = cp.arrays
    rk = a["step_rank"]
    real = rk < cp.nranks
    latest = np.zeros(cp.nranks, _F)
    np.maximum.at(latest, rk[real], done[real])
    rank_done = latest.tolist()
    slices = a["table"][0]
    rows = np.bincount(a["row"][a["msg_sstep"]], minlength=len(slices)).tolist()
    nbytes = sum(sum(sl) * k for sl, k in zip(slices, rows) if k)
    return Result(max(rank_done, default=0.0), rank_done, cp.nmsgs, nbytes, events,
                  start.tolist(), done.tolist(), None)
