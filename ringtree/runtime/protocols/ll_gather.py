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
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident

import numpy as np

from ringtree.errors import RingtreeError
from ringtree.ir.program import Collective
from ringtree.settings import MIN_TIMEOUT, as_timeout
from ringtree.transports import shm_native as native
from ringtree.transports.shm_native import NOBUF

# planner.ready's key for the last all-gather shape gather_now took (cleared with it)
GATHER = "gather_now: the last shape"


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
    O(1) checks of ``all_reduce_now``; the layers it skips cost ~5 µs a call."""
    if timeout is not None and not (type(timeout) is float and timeout >= MIN_TIMEOUT):
        timeout = as_timeout(timeout)  # refused before the call is numbered, as _run
    m = comm.planner.ready.get(GATHER)
    ex, ll = comm.executor, runner.ll
    s = ll.seq + 1
    if m is None or x.dtype is not m[0] or x.size != m[1] or type(out) is not np.ndarray \
            or comm._group is not None or comm.health.broken is not None or \
            runner.pending or comm._closed or ex._batches or ex.observer.active or \
            ll.synced < s - 1:
        return runner.blocks_now(comm, Collective.ALL_GATHER, x, out, None, timeout)
    if comm._owner.ident != get_ident() and not comm.background:
        comm._owner.check(comm.rank)
    op, fr = m[2], comm.flight
    if op.rec is not fr:
        op.hot.record(*(fr.lane() if fr is not None else (None,) * 3), op.desc, fr)
        op.rec = fr
    seq = comm.seq + 1
    r = op.hot.ghot(x, out, s, seq)
    if r == NOBUF:
        return runner.blocks_now(comm, Collective.ALL_GATHER, x, out, None, timeout)
    comm.seq, ll.seq = seq, s
    ll.written[s & 1] = None  # the kernel wrote all three header words
    if r != -1:
        try:
            native.finish(ll, op.hot, r, s, comm.timeout if timeout is None else timeout,
                          op.describe)
        except RingtreeError as err:
            err = comm._on_error(err)
            if fr is not None:
                fr.end_native(err)
            raise err from None
        place(op, s & 1, out.reshape(-1), x.size, 0, x.size)
        if fr is not None:
            fr.end_native()
    ll.synced = s
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
    folds ``block`` of the ranks in ``order``."""
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
    return run
