"""The reference engine's aware heap loop, compiled: the same loop on flat arrays.

:meth:`.reference._Engine.loop` is its twin: ``_heapc.c`` performs the reference's
operations in its order — every comparison, every ``max`` as the same ``if a > t``,
every sum with the same operands left to right, the same work stack, the same heap order
(distinct (arrival, message, slice) keys pop in one order, whatever the heap's layout) —
on the engine's state packed into NumPy arrays, so it reaches the same floats; only the
Python per event is gone (tree all-reduce on dgx_h100_sharp ×128: about 0.2 M events
per second in Python, tens of millions here). :func:`loop` packs the state, runs it
and writes it back into the engine's lists, so :meth:`~.reference._Engine.result` reads
what the Python loop would have left (the arrivals themselves stay packed: nothing
reads them once a run has ended).

Per step: its slices and compute times (pooled: steps that share a tuple share its
entries), its receives, sends and dependents as offset arrays; per message its connection,
steps and where its arrivals go; per connection its links. The extension is built
with the package when a C compiler is there (``setup.py``, optional); without it,
or with ``RINGTREE_SIM_NATIVE=0``, :class:`NativeHeap` declines and the reference engine
runs the loop in Python. ``tests/test_sim_conformance.py`` compares the two bit for bit.
A Compiled kept as arrays (:class:`~ringtree.sim.compile.wired.Wired`) is set up from its
arrays instead (:mod:`.heap_arrays`), to the same arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from ringtree import kernels, settings
from ringtree.sim.compile.wired import Wired
from ringtree.sim.engines import heap_arrays
from ringtree.sim.engines.contract import Declined, Job, Outcome, aware_untraced
from ringtree.sim.engines.reference import engine_for
from ringtree.sim.machine.model import Rules

# None when built without a C compiler, or built from other sources (ringtree.kernels)
_heapc = kernels.load("ringtree.sim.engines._heapc")

__all__ = ["NativeHeap", "available", "enabled", "loop"]

_I, _F = np.int64, np.float64


def available() -> bool:
    """Whether the compiled heap was built with the package."""
    return _heapc is not None


def enabled() -> bool:
    """Built and not switched off (``RINGTREE_SIM_NATIVE=0``)."""
    return _heapc is not None and bool(settings.current().sim_native)


class NativeHeap:
    """The aware heap compiled (:func:`loop`); declines an unaware model (its delivery
    is not this loop's), a trace, and a package built without the extension or with
    ``RINGTREE_SIM_NATIVE=0``."""

    name = "native"

    def accepts(self, job: Job, rules: Rules) -> str | None:
        why = aware_untraced(job, rules)
        if why is not None:
            return why
        if _heapc is None:
            return "the extension was not built (no C compiler at install)"
        if not settings.current().sim_native:
            return "switched off (RINGTREE_SIM_NATIVE=0)"
        return None

    def run(self, job: Job) -> Outcome | Declined:
        if isinstance(job.compiled, Wired):      # arrays already: no lists made
            return heap_arrays.run(job, _heapc.run)
        eng = engine_for(job)
        loop(eng, job.progress)
        res = eng.result()
        return Outcome(res.time_ns, res.events, res)


def check(eng) -> None:
    """What the compiled loop runs: an aware engine with no trace, no rounds held and no
    chunk queued."""
    if not eng.aware or eng.transfers is not None or eng.cut is not None or eng.heap:
        raise ValueError("the compiled heap runs an aware engine without a trace, rounds "
                         "held or chunks queued")


def _pool(rows: Sequence, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(start of every row, the pool) with rows stored once per identity; None → -1."""
    ids = np.fromiter(map(id, rows), np.uint64, len(rows))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    parts = [rows[i] for i in first.tolist()]
    none = [k for k, row in enumerate(parts) if row is None]
    lens = np.fromiter((0 if row is None else len(row) for row in parts), _I, len(parts))
    offs = np.zeros(len(parts), _I)
    np.cumsum(lens[:-1], out=offs[1:])
    offs[none] = -1
    pool = np.fromiter(chain.from_iterable(row for row in parts if row is not None), dtype,
                       int(lens.sum()))
    return offs[inverse.reshape(-1)], pool


def _csr(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (len + 1) and the concatenated rows."""
    lens = np.fromiter(map(len, rows), _I, len(rows))
    off = np.zeros(len(rows) + 1, _I)
    np.cumsum(lens, out=off[1:])
    return off, np.fromiter(chain.from_iterable(rows), _I, int(off[-1]))


def _structure(eng) -> tuple[np.ndarray, ...]:
    """What of the packed run depends on its steps, messages and routes only: receives,
    sends, the next step of each channel, dependents, messages' connections and steps,
    connections' links, shared links. Kept in ``Compiled.memo`` for a sweep's sizes,
    keyed by the lists it was read from (held there, so their identities stay theirs)."""
    cp = eng.cp
    src = (cp.step_recv, cp.step_send, eng.nxt_in_chan, eng.dependents, cp.msg_conn,
           cp.msg_rstep, cp.msg_sstep, eng.conn_links, eng.shared)
    key = ("native", *map(id, src))
    got = cp.memo.get(key)
    if got is None:
        rv_off, rv = _csr(cp.step_recv)
        sd_off, sd = _csr(cp.step_send)
        dp_off, dp = _csr(eng.dependents)
        cl_off, cl = _csr(eng.conn_links)
        msg = [np.asarray(rows, _I) for rows in (cp.msg_conn, cp.msg_rstep, cp.msg_sstep)]
        arrays = (rv_off, rv, sd_off, sd, np.asarray(eng.nxt_in_chan, _I), dp_off, dp,
                  *msg, cl_off, cl, np.asarray(eng.shared, _I))
        got = cp.memo[key] = (src, arrays)
    return got[1]


def pack(eng) -> tuple[tuple, np.ndarray]:
    """(the arrays ``_heapc.run`` reads, the work stack) of ``eng``'s state, its lists
    left as they are."""
    cp = eng.cp
    nm = cp.nmsgs
    structure = _structure(eng)
    sl_start, pool_b = _pool(cp.step_slices, _I)
    sl_n = np.fromiter(map(len, cp.step_slices), _I, cp.nsteps)
    comp_start, pool_c = _pool(eng.comp, _F)
    msg_sstep = structure[9]
    arr_off = np.zeros(nm + 1, _I)
    np.cumsum(sl_n[msg_sstep], out=arr_off[1:])
    # the state, possibly left by rounds that kept the heap's order
    arr_t = np.zeros(int(arr_off[-1]), _F)
    if any(eng.narr):
        for m, a in enumerate(eng.arr):
            if a:
                arr_t[arr_off[m]:arr_off[m] + len(a)] = a
    nwait = np.zeros(nm, _I)
    wait_t = np.zeros(arr_t.size, _F)
    for m, items in eng.waiting.items():
        if [i for i, _ in items] != list(range(len(items))):
            raise ValueError(f"message {m} waits with slices out of order")
        nwait[m] = len(items)
        wait_t[arr_off[m]:arr_off[m] + len(items)] = [t for _, t in items]
    state_i = [np.asarray(x, _I) for x in (eng.pend, eng.nxt, eng.unsent, eng.narr,
                                             eng.ninj)]
    conn_cur = np.asarray(eng.conn_cur, _I)
    state_f = [np.asarray(x, _F) for x in (eng.start, eng.done, eng.maxin, eng.last,
                                             eng.sdone)]
    net_f = [np.asarray(x, _F) for x in (eng.conn_inj, eng.conn_arr, eng.free)]
    arrays = (sl_start, sl_n, pool_b, comp_start, *structure, arr_off,
              pool_c, np.asarray(eng.conn_first, _F), np.asarray(eng.rate, _F),
              np.asarray(eng.llat, _F),
              *state_i, nwait, conn_cur, *state_f, arr_t, wait_t, *net_f)
    return arrays, np.asarray(eng.work, _I)


def loop(eng, progress: Callable[[int], None] | None = None) -> None:
    """Run ``eng`` (an aware :class:`.reference._Engine`, fresh) to the end, as
    :meth:`~.reference._Engine.loop` does, compiled."""
    if _heapc is None:
        raise RuntimeError("ringtree.sim.engines._heapc was not built (no C compiler at install)")
    check(eng)
    arrays, work = pack(eng)
    # the packed arrays are the state now: the lists go while the run needs the memory
    eng.pend = eng.nxt = eng.unsent = eng.narr = eng.ninj = eng.conn_cur = None
    eng.start = eng.done = eng.maxin = eng.last = eng.sdone = None
    eng.conn_inj = eng.conn_arr = eng.free = eng.arr = eng.waiting = eng.work = None
    eng.events = _heapc.run(arrays, float(eng.over), bool(eng.integer), int(eng.events),
                            work, progress)
    # back into the engine's lists: what the Python loop leaves
    ri = arrays[STATE:STATE + 7]
    (eng.pend, eng.nxt, eng.unsent, eng.narr, eng.ninj) = (x.tolist() for x in ri[:5])
    eng.conn_cur = ri[6].tolist()
    rf = arrays[STATE + 7:]
    (eng.start, eng.done, eng.maxin, eng.last, eng.sdone) = (x.tolist() for x in rf[:5])
    (eng.conn_inj, eng.conn_arr, eng.free) = (x.tolist() for x in rf[7:])
    eng.waiting, eng.work = {}, []
    # the arrivals stay packed (and are dropped here): nothing reads them once a run ends


# where the state (written by the run) starts among the arrays: 18 integer and 4 float
# arrays that the run only reads come first
STATE = 22
