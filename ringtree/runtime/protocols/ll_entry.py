"""The one C entry of a call whose shape ran before, and the reduce's.

The communicator's hot paths for an all-gather, a reduce-scatter, a broadcast
(:mod:`.ll_gather`) and a reduce (:func:`reduce_now`) keep the last shape each ran on a
one-part compiled op in ``planner.ready`` (cleared with it) as a tuple whose fields 3-5
are the :class:`~ringtree.runtime.protocols.ll.LLOp`, its C entry (``Round.ghot``,
``shot``, ``bshot``, ``rhot``) and what Python does after a late peer. Once the caller
matched the shape by identity, :func:`enter` makes the O(1) checks of ``_run`` (the
communicator's states behind its one flag ``_hot_off``: group, broken, closed, async LL
calls pending, async Simple work in flight, an active profiler; the parity, the issuing
thread), calls the entry, which checks the memory (``NOBUF``: nothing was done, the
general path runs and refuses or copes as before) and writes the flight recorder's
entry, and completes a call whose wait the kernel handed back
(:func:`~ringtree.transports.shm_native.finish`: a sleeping peer rung, a late one waited
for with the liveness checks that name a dead rank, the timeout).

A reduce (``Communicator.reduce``) runs the same round as the general path's LL op
(``Round.rhot``): the root folds every rank's contribution in the Program's order, its
own read from its input (no peer reads it, so it is not copied into the segment; the
same operands in the same order: the bits of the rank-order fold); every other rank
writes its contribution and waits, its buffers never written.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident

import numpy as np

from ringtree.errors import RingtreeError
from ringtree.ir.program import Collective
from ringtree.ops import OP_NAMES
from ringtree.settings import MIN_TIMEOUT, as_timeout
from ringtree.transports import shm_native as native
from ringtree.transports.shm_native import NOBUF

MISS = object()          # a hot path's answer: the call takes the general path
REDUCE = "reduce_now: the last shape"  # planner.ready's key for it
BARRIER = (Collective.BARRIER,)  # ready_blocks' key of a planned barrier, ready's of its entry


def timeout_of(timeout) -> float | None:
    """``timeout`` checked before the call is numbered, as ``_run`` does."""
    if timeout is not None and not (type(timeout) is float and timeout >= MIN_TIMEOUT):
        return as_timeout(timeout)
    return timeout


def enter(runner, comm, m: tuple, x: np.ndarray, out, timeout: float | None) -> bool:
    """Run one call of the shape ``m`` (``planner.ready``'s entry) in its C entry with
    ``x`` and ``out`` as the entry takes them. False: nothing was done (a check or the
    entry refused), the caller takes the general path; True: the call completed (a
    failure raised, recorded for every rank and in the flight recorder)."""
    ll = runner.ll
    s = ll.seq + 1
    if comm._hot_off and comm._hot_blocked() or ll.synced < s - 1:
        return False
    if comm._owner.ident != get_ident() and not comm.background:
        comm._owner.check(comm.rank)
    op = m[3]
    if op.rec is not comm.flight:
        bind(op, comm.flight)
    seq = comm.seq + 1
    r = m[4](x, out, s, seq)
    if r == NOBUF:
        return False
    if op.paired:  # the single copy: LL calls s and s + 1 (ll_direct_entry)
        comm.seq = seq
        paired(runner, comm, op, x, out, r, s, timeout)
        return True
    comm.seq, ll.seq = seq, s
    ll.written[s & 1] = None  # the kernel wrote all three header words
    if r != -1:
        late(runner, comm, op, m[5], x, out, r, s, timeout)
    ll.synced = s
    return True


def run_queued(runner, comm, op, entry: Callable, after: Callable, x: np.ndarray, out,
               seq: int, timeout: float | None) -> bool:
    """Run queued async call ``seq`` of ``op`` in its C entry (``entry``, ``after`` as
    :func:`enter` takes them from ``m``), on the thread that runs the queue: the checks of
    :func:`enter` but the group, the issuing thread and pending calls (made as the call
    was issued and numbered; this is the pending call). False: nothing was done,
    ``run_arrays`` runs it (the parity to wait for, async Simple work in flight, the
    profiler, a broken or closed communicator, memory the entry refuses)."""
    ex, ll = comm.executor, runner.ll
    s = ll.seq + 1
    if comm.health.broken is not None or comm._closed or ex._batches or \
            ex.observer.active or ll.synced < s - 1:
        return False
    if op.rec is not comm.flight:
        bind(op, comm.flight)
    r = entry(x, out, s, seq)
    if r == NOBUF:
        return False
    if op.paired:
        paired(runner, comm, op, x, out, r, s, timeout)
        return True
    ll.seq = s
    ll.written[s & 1] = None  # the kernel wrote all three header words
    if r != -1:
        late(runner, comm, op, after, x, out, r, s, timeout)
    ll.synced = s
    return True


def paired(runner, comm, op, x: np.ndarray, out, r: int, s: int,
           timeout: float | None) -> None:
    """Complete LL calls ``s`` and ``s + 1`` of the single copy's C entry, which returned
    ``r`` (:meth:`~.ll_direct_entry.Compiled.after`); a failure is raised, recorded for
    every rank and in the flight recorder."""
    if r == -1:
        op.run.after(x, out, r, s, 0.0)
    else:
        runner._finish_hot(comm, op, out, r, s, timeout, x)


def bind(op, fr) -> None:
    """Have ``op``'s C entry write its calls into the flight recorder ``fr`` (None:
    nowhere)."""
    op.hot.record(*(fr.lane() if fr is not None else (None,) * 3), op.desc)
    op.rec = fr


def late(runner, comm, op, after: Callable, x: np.ndarray, out, r: int, s: int,
         timeout: float | None) -> None:
    """Complete LL call ``s`` that ``op``'s C entry handed back with ``r`` (not -1): the
    wait (:func:`~ringtree.transports.shm_native.finish`: a sleeping peer rung, a late one
    waited for with the liveness checks that name a dead rank, the timeout), then
    ``after(x, out, parity)``; a failure is raised, recorded for every rank and in the
    flight recorder."""
    fr = comm.flight
    try:
        native.finish(runner.ll, op.hot, r, s, comm.timeout if timeout is None else timeout,
                      op.describe)
    except RingtreeError as err:
        err = comm._on_error(err)
        if fr is not None:
            fr.end_native(err)
        raise err from None
    after(x, out, s & 1)
    if fr is not None:
        fr.end_native()


def barrier(runner, comm, op, timeout: float | None) -> bool:
    """Run a barrier planned on LL (``op``, its :class:`~ringtree.runtime.protocols.ll.LLOp`
    with a C entry) in that entry, ``Round.rhot`` on the op's empty token: this rank's
    header posted and every peer's waited for (on one rank: the call numbered and its
    flight-recorder entry written), as :func:`enter` runs a call. False: nothing was
    done (see :func:`enter`)."""
    m = comm.planner.ready.get(BARRIER)
    if m is None or m[3] is not op:
        m = comm.planner.ready[BARRIER] = (_TOKEN, None, None, op, op.hot.rhot, _nothing)
    return enter(runner, comm, m, _TOKEN, None, timeout)


_TOKEN = np.zeros(0, np.uint8)  # what a barrier's round copies in: nothing


def _nothing(x, out, p: int) -> None:
    """What a barrier does once a late peer's wait completed."""


def reduce_now(runner, comm, x: np.ndarray, root, op, out, timeout: float | None):
    """``LLRunner.reduce_now``: a NumPy reduce (``out`` a NumPy array or None) whose shape,
    root and op (matched by identity, as the caller wrote them) ran on a compiled
    one-part LL op, in one C call, ``Round.rhot``: the root folds in place or into
    ``out`` (x's dtype and shape, not overlapping it), the other ranks write and wait.
    AVG and PREMUL_SUM, float16 and user ops, a torch tensor or a first call of a shape
    answer :data:`MISS` (the general path, which then keeps the shape)."""
    timeout = timeout_of(timeout)
    m = comm.planner.ready.get(REDUCE)
    if m is None or x.dtype is not m[0] or x.size != m[1] or root is not m[2] or \
            op is not m[6] or m[7] is not None and (out is None or out is x) is not m[7]:
        m = _learn(comm, x, root, op, out)
        if m is None:
            return MISS
    mine = m[7] is not None
    if not enter(runner, comm, m, x, out if mine else None, timeout):
        return MISS
    return (x if out is None else out) if mine else None


def _learn(comm, x: np.ndarray, root, op, out) -> tuple | None:
    """The planned reduce of this shape (``planner.ready_blocks``) as ``ready[REDUCE]``,
    if its op has the one entry; None otherwise."""
    if type(root) is not int or not (type(out) is np.ndarray or out is None):
        return None
    mine = comm.rank == root
    in_place = mine and (out is None or out is x)
    hit = comm.planner.ready_blocks.get((Collective.REDUCE, x.dtype, x.size, OP_NAMES.get(
        op.lower()) if type(op) is str else op, root, in_place))
    if hit is None or hit[0].hot is None or not scaled(hit[0], hit[1]):
        return None
    lop = hit[0]
    k = lop.hot

    def after(x: np.ndarray, o, p: int) -> None:  # a late peer: the root folds
        if mine:  # with its contribution, which the kernel did not copy, in the segment
            lop.mine[p][...] = x.reshape(-1)
            k.fold(x if o is None else o, p)

    m = comm.planner.ready[REDUCE] = (x.dtype, x.size, root, lop, k.rhot, after, op,
                                      in_place if mine else None)
    return m


def alone(op, op_code: int):
    """The one C entry of a one-rank :class:`~ringtree.runtime.protocols.ll.LLOp`
    (``shm_native.alone_round``), or None (no kernel, PREMUL_SUM on float16 or bfloat16:
    the general path, ``LLOp._alone``). Its rank folds only its own contribution: a copy
    when out is not x (AVG: x / 1, the same bits), PREMUL_SUM's scale set by
    :func:`scaled` when a hot path takes the shape; a barrier's entry (in place on
    :func:`barrier`'s token) only numbers the call and writes the flight recorder's entry."""
    dt = op.dtype
    if not native.enabled() or op.premul and dt.is_float and dt.itemsize == 2:
        return None  # (the input's bytes: a count's, none for a barrier)
    return native.alone_round(op.ll, dt.code,
                              op.count * op.coll.blocks(1)[0] * dt.storage.itemsize)


def scaled(op, red) -> bool:
    """Before a hot path keeps the shape of ``op`` (its ``hot`` set) with reducer ``red``:
    a one-rank PREMUL_SUM round takes ``red``'s scalar as ``Reducer.premultiply`` does
    (False: the scalar does not fit the integer dtype, the general path raises)."""
    if not op.premul or op.ll.n != 1:
        return True
    st = op.dtype.storage
    try:
        v = float(st.type(red.scalar)) if st.kind == "f" else \
            int(st.type(int(red.scalar or 0)))
    except (OverflowError, ValueError):
        return False
    op.hot.alone(op.count * st.itemsize, v)
    return True
