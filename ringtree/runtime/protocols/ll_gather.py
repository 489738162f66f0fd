"""All-gather on LL at every size: the place round streamed through the cells, and
compiled with the fewest copies a staged exchange allows; reduce-scatter's fold round
without the copy of the block no peer reads.

An all-gather of ``S`` output bytes on ``n`` ranks must copy, on every rank, the
``(n-1)/n · S`` bytes its peers contributed into its output and its own ``S/n``. Through
a shared segment each contribution is staged once: written into the rank's cell by its
owner, read out of it by every other rank. The place round before this module did one
more pass per rank and kept the whole round on the critical path: copy the own part
into the cell, publish, wait, then copy *every* block out of the segment, the own one
included (``S/n`` written and ``S`` copied out, after the wait). The kernel's
``Round.gather`` (``transports/_llc.c``) copies the own block straight from the input
while the peers are still writing theirs (between publishing and waiting), then only
the peers' blocks out of the segment, so after the wait it copies ``(n-1)/n · S``.

A contribution larger than a cell streams through the cells as an all-reduce does
(:class:`~ringtree.runtime.protocols.ll.LLOp`'s chunk): one synchronisation per
cell-sized part, parts of every block placed at the same offset. Parity alternation
keeps it safe: a rank writes a cell again only after every peer published the next
part, so it has read this one. Every byte is a copy, so any path gives the same bits;
``RINGTREE_LL_NATIVE=0`` runs the same parts with NumPy.

A reduce-scatter's rank folds block ``r`` of every contribution, its own included, and
its peers read every block of its input but that one; the kernel's ``Round.scatter``
copies ``(n-1)/n`` of the input into the segment instead of all of it and folds the own
block from the input, in its place in the Program's order (the same operands in the
same order: the same bits).

A call of the last shape one of these ran, all-gather, reduce-scatter or in-place
broadcast, is one C entry on the communicator's hot path (:func:`gather_now`,
:func:`scatter_now`, :func:`broadcast_now`: ``Round.ghot``, ``Round.shot``,
``Round.bshot``), the flight recorder's entry written from C; a late peer hands the
rest of the call back to Python (:func:`~.ll_entry.enter`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ringtree.ir.program import Collective
from ringtree.runtime.protocols.ll_entry import MISS, enter, timeout_of
from ringtree.transports import shm_native as native

# planner.ready's keys for the last all-gather, reduce-scatter and broadcast shapes the
# one-entry paths took (cleared with it)
GATHER = "gather_now: the last shape"
SCATTER = "scatter_now: the last shape"
BCAST = "broadcast_now: the last shape"


def runner(op, placed: tuple[int, ...]) -> Callable:
    """The ``run(x, out, red, timeout)`` of ``op`` (an all-gather's
    :class:`~ringtree.runtime.protocols.ll.LLOp`, its output blocks from ranks
    ``placed``): compiled when ``op.k`` is (it sets the kernel's places), else NumPy."""
    ll, k = op.ll, op.k
    part = op.chunk or op.count  # elements of a block per synchronisation
    if k is not None:
        size = part * op.dtype.storage.itemsize
        rows = []
        for p in (0, 1):
            off, stride = ll.area(0, p, size)
            rows.append([off + q * stride for q in placed])
        k.places(rows[0], rows[1], placed.index(ll.rank) if ll.rank in placed else -1)
        if not op.chunk:  # one part: the whole call is one C entry (gather_now)
            op.hot = k
            k.set_head(*op.head)
        return lambda x, out, red, timeout: _compiled(op, part, x, out, timeout)
    if not op.chunk:
        return op._place_round
    return lambda x, out, red, timeout: _python(op, part, x, out, timeout)


def gather_now(runner, comm, x: np.ndarray, out, timeout: float | None):
    """``LLRunner.gather_now``: :meth:`~.ll_runner.LLRunner.blocks_now` for an all-gather,
    whose last shape with a one-part compiled op (``planner.ready[GATHER]``) runs in one C
    call, ``Round.ghot``: it checks the memory (contiguous, writeable, ``size`` blocks of
    ``x``'s format, no overlap), writes the flight recorder's entry, publishes, copies
    the own block while the peers write theirs, waits and places. Python's part is the
    O(1) checks of the all-reduce's (:mod:`.ll_hot`); the layers it skips cost ~5 µs a call."""
    return _one_entry(runner, comm, Collective.ALL_GATHER, GATHER, x, out, None, timeout)


def scatter_now(runner, comm, x: np.ndarray, out, op, timeout: float | None):
    """``LLRunner.scatter_now``: :func:`gather_now` for a reduce-scatter (``op`` matched by
    identity, as the caller wrote it): ``Round.shot`` checks the memory (``x`` the round's
    input, ``out`` one block of its format, no overlap), writes the flight recorder's
    entry, stages every block of ``x`` but its own, publishes, waits and folds block
    ``rank`` in the Program's order with the own row read from ``x``: the bits of the
    rank-order fold, as ``Round.scatter``'s. AVG and PREMUL_SUM, a chunked op and an op the
    kernel does not fold go :meth:`~.ll_runner.LLRunner.blocks_now`'s way."""
    return _one_entry(runner, comm, Collective.REDUCE_SCATTER, SCATTER, x, out, op, timeout)


def broadcast_now(runner, comm, x: np.ndarray, root, timeout: float | None):
    """``LLRunner.broadcast_now``: :func:`gather_now` for an in-place broadcast (``root``
    matched by identity): ``Round.bshot`` checks the memory (contiguous, writeable, the
    round's size), writes the flight recorder's entry; the root streams ``x`` into its
    cell and publishes, every other rank publishes, waits and copies the root's bytes."""
    return _one_entry(runner, comm, Collective.BROADCAST, BCAST, x, x, root, timeout)


def broadcast_hot(op) -> None:
    """Give ``op`` (a broadcast's compiled one-part LLOp) :func:`broadcast_now`'s entry: a
    rank but the root copies the root's contribution from its cell (``Round.places``)."""
    if not op.writes:
        base = np.frombuffer(op.ll.seg.mm, np.uint8, count=1).ctypes.data
        op.k.places(*([src.ctypes.data - base] for src in op.src), -1)
    op.hot = op.k
    op.k.set_head(*op.head)


def entry(op, x: np.ndarray, red) -> tuple:
    """``planner.ready``'s entry for the one-entry path of ``op`` (its ``hot`` set): the
    dtype, size and op (None: an all-gather; a broadcast's root) matched, the LLOp, the
    C entry, and what Python does after a late peer (``after(x, out, parity)``)."""
    return (x.dtype, x.size, red, op, *_entry(op))


def queued(op) -> tuple[Callable, Callable] | None:
    """The C entry and completion of a queued async all-gather, reduce-scatter or
    broadcast of ``op`` (:func:`~.ll_entry.run_queued`), or None (no one entry: the
    general round's ``run``)."""
    if op.hot is None or op.premul:  # (one rank: PREMUL_SUM's scale is set per call)
        return None
    centry, after = _entry(op)  # (one rank's entry, the single copy's: no after needed)
    return None if after is None and op.ll.n > 1 and not op.paired else (centry, after)


def _entry(op) -> tuple[Callable, Callable | None]:
    if op.paired:  # the single copy's (ll_direct_entry.Compiled): ll_entry.enter completes
        return op.run.entry, None
    if op.coll is Collective.ALL_GATHER:
        return op.hot.ghot, lambda x, out, p: place(op, p, out.reshape(-1), x.size, 0,
                                                    x.size)
    if op.coll is Collective.BROADCAST:
        return op.hot.bshot, _after_broadcast(op)
    return op.hot.shot, getattr(op.run, "after", None)


def _after_broadcast(op) -> Callable:
    def after(x: np.ndarray, out: np.ndarray, p: int) -> None:
        if not op.writes:  # the root's bytes, from its cell
            x.reshape(-1)[...] = op.src[p]
    return after


def _general(runner, comm, coll: Collective, x: np.ndarray, out, red,
             timeout: float | None):
    if coll is Collective.BROADCAST:
        return runner.broadcast_blocks(comm, x, red, timeout)
    return runner.blocks_now(comm, coll, x, out, red, timeout)


def _one_entry(runner, comm, coll: Collective, key: str, x: np.ndarray, out, red,
               timeout: float | None):
    reg = runner.reg  # (ll_reg)
    if reg is not None and x.nbytes * runner.ll.n >= reg.floor_blocks:
        done = reg.call(comm, coll, x, out, red, timeout)
        if done is not MISS:
            return done
    timeout = timeout_of(timeout)
    m = comm.planner.ready.get(key)
    if m is None or x.dtype is not m[0] or x.size != m[1] or red is not m[2] or \
            type(out) is not np.ndarray or not enter(runner, comm, m, x, out, timeout):
        return _general(runner, comm, coll, x, out, red, timeout)
    return out


def _parts(total: int, part: int) -> range:
    return range(0, total, part) if total else range(1)


def _compiled(op, part: int, x: np.ndarray, out: np.ndarray, timeout: float) -> None:
    ll, k, head, what = op.ll, op.k, op.head, op.describe
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    total, item = x.size, x.itemsize
    for lo in _parts(total, part):
        piece = x[lo:lo + part]
        p = native.run_gather(ll, k, piece, out, lo * item, total * item, head, timeout,
                              what)
        if p < 0:
            place(op, -1 - p, out, total, lo, piece.size)


def _python(op, part: int, x: np.ndarray, out: np.ndarray, timeout: float) -> None:
    ll, what = op.ll, op.describe
    total = x.size
    for lo in _parts(total, part):
        piece = x[lo:lo + part]
        p = ll.parity(timeout, what)
        op.mine[p][:piece.size] = piece
        ll.sync(op.head, timeout, what)
        place(op, p, out, total, lo, piece.size)


def place(op, p: int, out: np.ndarray, total: int, lo: int, m: int) -> None:
    """Copy elements ``lo:lo+m`` of every output block from parity ``p``'s cells."""
    rows = op.rows[p] if op.placed is None else op.rows[p][op.placed]
    out.reshape(len(rows), total)[:, lo:lo + m] = rows[:, :m]


def scatter_runner(op, block: int, order: tuple[int, ...]) -> Callable:
    """The compiled ``run(x, out, red, timeout)`` of a reduce-scatter's
    :class:`~ringtree.runtime.protocols.ll.LLOp` (``op.k`` set, not PREMUL_SUM) that
    folds ``block`` of the ranks in ``order``; one part, not AVG: also ``op.hot``, the
    kernel :func:`scatter_now` calls, and ``run.after``, its completion after a late
    peer (the own block written into the segment, then the fold from it)."""
    count, k = op.count, op.k
    size = count * op.dtype.storage.itemsize
    k.skips(order.index(op.ll.rank), block * size, (block + 1) * size)
    lo, hi = block * count, (block + 1) * count

    def run(x, out, red, timeout) -> None:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)

        def own(p: int) -> None:
            op.mine[p][lo:hi] = x[lo:hi]

        native.run_scatter(op.ll, k, x, out, op.head, timeout, op.describe, own)
        if op.avg:
            red.postdivide(out, len(order))

    def after(x: np.ndarray, out: np.ndarray, p: int) -> None:
        op.mine[p][lo:hi] = x.reshape(-1)[lo:hi]
        k.fold(out, p)

    run.after = after
    if not op.chunk and not op.avg:
        op.hot = k
        k.set_head(*op.head)
    return run
