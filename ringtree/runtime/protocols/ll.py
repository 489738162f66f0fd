"""The LL protocol's runner for one-round Programs (:mod:`ringtree.transports.shm_ll`).

LL runs the ``direct`` schedules (:mod:`ringtree.schedules.direct`): one round in which
every rank hands its data to the ranks that need it and each rank combines what it
received. Through one shared segment that round is three moves: write this rank's
contribution into its parity area (inline in its line up to 96 bytes, else its cell),
:meth:`LL.sync`, then read what the Program says this rank reads, straight out of the
segment:

============== =============================== ======================================
collective     contribution of rank r          result (read from the Program)
============== =============================== ======================================
all_reduce     its input (pre-scaled for        the contributions folded in the
               PREMUL_SUM)                      Program's order (AVG: then ÷ n)
reduce         the same                         the same, on the root only
reduce_scatter its whole input (n blocks)       the block the Program folds, reduced
broadcast      the root's buffer (others none)  copied out of the root's area
all_gather     its input                        every area, in the output's block order
barrier        nothing                          —
============== =============================== ======================================

:func:`one_shot` reads that from the rank's Program — the ranks whose contributions it
folds and in which order, which block of each it reads, which rank fills each output
block — and refuses a Program that forwards what it receives or has several channels:
LL has no second round. So the LL plan of a call runs the same Program the checker
proved and the Simple plan would run: every rank folds the same contributions, left to
right, from the same bytes, so every rank gets the same bits, and the Simple run of the
Program the same bits again (``ufunc.accumulate`` along the rank axis is a left fold;
bfloat16 and user ops go through :meth:`Reducer.combine` rank by rank).

A :class:`LLOp` runs what the Program has its rank do, not a collective by name: a
*fold round* (contribute, then fold: all-reduce, reduce at the root, reduce-scatter), a
*place round* (contribute if it sends, then copy whole contributions into the output
blocks the Program names: all-gather, broadcast) or a *write round* (contribute if it
sends, synchronise: a reduce's other ranks, a barrier); an all-reduce or all-gather
larger than a cell streams through the cells, one round per cell (all-gather:
:mod:`.ll_gather`). It is prepared once per call shape with its header and every view it
needs, so a repeated call allocates nothing.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Buf, Collective, Program
from ringtree.ir.wire import PROTO_LL, USER_OP, WireHeader, algo_code
from ringtree.ops import _UFUNC, ReduceOp, Reducer, quiet
from ringtree.runtime.plan import Desc
from ringtree.runtime.protocols import LL as LL_PROTO
from ringtree.runtime.protocols import ll_entry, ll_gather, ll_split, register
from ringtree.schedules import Options, generate
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import INLINE, LL

ALGO = "direct"
COLLECTIVES = (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.REDUCE,
               Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.BARRIER)
STREAMED = (Collective.ALL_REDUCE, Collective.ALL_GATHER)  # any size: cell by cell
ONE_ENTRY = (Collective.REDUCE, Collective.BARRIER)  # whose round is a C entry (ll_entry)
for _c in COLLECTIVES:
    register(LL_PROTO, _c, ALGO)


@dataclass(frozen=True)
class OneShot:
    """What one rank's one-round Program does, as LL runs it."""

    order: tuple[int, ...]   # ranks whose contributions it folds, left to right
    block: int               # the block of each contribution it folds
    placed: tuple[int, ...]  # output block b gets rank placed[b]'s contribution
    to: frozenset[int] = frozenset()  # the ranks it sends to


def one_shot(prog: Program) -> OneShot:
    """The :class:`OneShot` of ``prog``; ValueError if LL cannot run it."""
    if len(prog.channels) != 1:
        raise ValueError(f"LL runs one-channel programs ({prog.algo} has "
                         f"{len(prog.channels)} channels)")
    steps, me = prog.channels[0], prog.rank
    acc = next((s.dst for s in steps if s.reduce and s.dst is not None), None)
    saved, order, placed, block = {}, [], {}, 0
    received: set[tuple[Buf, int]] = set()  # chunks that hold data from another rank
    to: set[int] = set()
    for s in steps:
        to.update(s.send_to)
        derived = bool(s.recv_from) or s.src is not None and \
            any((s.src.buf, c) in received for c in s.src.chunks())
        if derived and s.send_to:
            raise ValueError(f"LL runs one-round programs: {prog.algo} {prog.collective.value}"
                             f" forwards what it receives ({s})")
        if s.dst is None:
            continue
        if derived:
            received.update((s.dst.buf, c) for c in s.dst.chunks())
        if s.dst == acc and s.src != acc:      # the local contribution, or the first
            order += s.recv_from or (me,)
            if s.src is not None:
                block = saved.get(s.src, s.src).index
        elif s.dst == acc:                     # acc ⊕= recv(q)
            order += s.recv_from
        elif s.recv_from:                      # a block received whole
            placed[s.dst.index] = s.recv_from[0]
        elif s.src is not None and s.src.buf is Buf.INPUT:
            if s.dst.buf is Buf.OUTPUT:        # its own block of the output
                placed[s.dst.index] = me
            else:                              # kept aside (in place)
                saved[s.dst] = s.src
    return _checked(prog, OneShot(tuple(order), block, tuple(placed.get(b, -1)
                                                            for b in range(len(placed))),
                                  frozenset(to)))


def _checked(prog: Program, shape: OneShot) -> OneShot:
    n, coll = prog.nranks, prog.collective
    if not coll.blocks(n)[1]:  # no output (a barrier): what it combines is a token
        shape = OneShot((), 0, (), shape.to)
    if n == 1:
        return OneShot((0,), 0, (0,)) if coll.blocks(n)[1] else shape
    me, root = prog.rank, prog.root
    others = frozenset(range(n)) - {me}
    readers = frozenset({root} - {me}) if coll is Collective.REDUCE else \
        (others if me == root else frozenset()) if coll is Collective.BROADCAST else others
    if shape.to != readers:  # in one round, a contribution goes to every rank that reads it
        raise ValueError(f"LL: {prog.algo} {coll.value} on rank {me} sends to "
                         f"{sorted(shape.to)}, not to every rank that reads its data "
                         f"({sorted(readers)}): not a one-round program")
    folds = coll.reduces and coll is not Collective.BARRIER and \
        (coll is not Collective.REDUCE or prog.rank == prog.root)
    if folds and sorted(shape.order) != list(range(n)):
        raise ValueError(f"LL: {prog.algo} {coll.value} on rank {prog.rank} folds ranks "
                         f"{shape.order}, not every rank once")
    if coll is Collective.ALL_GATHER and sorted(shape.placed) != list(range(n)):
        raise ValueError(f"LL: {prog.algo} all_gather places ranks {shape.placed}")
    if coll is Collective.BROADCAST and shape.placed[:1] != (prog.root,):
        raise ValueError(f"LL: {prog.algo} broadcast does not copy the root's buffer")
    return shape


def program(coll: Collective, nranks: int, rank: int, root: int) -> Program:
    """The Program LL runs for ``coll`` (one channel)."""
    return generate(coll, ALGO, nranks, rank, Options(root=max(root, 0), channels=1))


def contribution_bytes(coll: Collective, count: int, itemsize: int, nranks: int) -> int:
    """Bytes one rank writes for a call (what must fit a cell): its whole input."""
    return count * itemsize * coll.blocks(nranks)[0]


def fits(ll: LL, coll: Collective, count: int, itemsize: int) -> bool:
    """Can LL run this call? (An all-reduce or all-gather of any size can: it streams
    through the cells, one cell per synchronisation.)"""
    return coll in STREAMED or coll in COLLECTIVES and \
        contribution_bytes(coll, count, itemsize, ll.n) <= max(ll.cell_bytes, INLINE)


class LLOp:
    """One prepared call shape of a Program; ``run(x, out, reducer, timeout)`` runs it."""

    __slots__ = ("ll", "coll", "count", "root", "head", "mine", "rows", "rowlist", "scratch",
                 "ufunc", "quiet", "avg", "premul", "dtype", "name", "run", "src", "chunk", "desc",
                 "order", "placed", "writes", "gathers", "own", "k", "hot", "rec", "queued_entry")
    paired = False  # one LL call a call (the single copy's ops make two: ll_entry.enter)

    def __init__(self, ll: LL, prog: Program, dt: DType, count: int, op_code: int,
                 root: int, name: str = ""):
        shape = one_shot(prog)
        coll, n, me = prog.collective, ll.n, ll.rank
        storage = dt.storage
        self.ll, self.coll, self.count, self.root, self.dtype = ll, coll, count, root, dt
        self.name = name or coll.value
        opname = "user" if op_code == USER_OP else list(ReduceOp)[op_code].value \
            if coll.reduces else "-"
        # the call's Desc but for its sequence number (ringtree.runtime.plan.DescAt)
        self.desc = Desc(self.name, count, dt.value, dt.code, opname, op_code, root, 0,
                         prog.algo, coll.code, PROTO_LL)
        self.head = WireHeader(0, count, 0, algo_code(prog.algo), coll.code, dt.code,
                               op_code, PROTO_LL, root).call_words()
        size = contribution_bytes(coll, count, storage.itemsize, n)
        self.chunk = 0
        if coll in STREAMED and size > max(ll.cell_bytes, INLINE):
            # streamed: cell-sized chunks, one synchronisation each
            self.chunk = ll.cell_bytes // storage.itemsize
            count = self.chunk
            size = count * storage.itemsize
        per = count * coll.blocks(n)[0]
        self.mine = tuple(ll.view(me, p, storage, per) for p in (0, 1))
        self.rows = tuple(ll.rows(p, storage, count, shape.block * count, size)
                          for p in (0, 1))  # row q: rank q's contribution
        self.order = shape.order if shape.order != tuple(range(n)) else None
        self.placed = list(shape.placed) if shape.placed != tuple(range(n)) else None
        order = shape.order or range(n)
        self.rowlist = tuple(tuple(r[q] for q in order) for r in self.rows)  # fold order
        self.src = tuple(r[shape.placed[0] if shape.placed else me] for r in self.rows)
        self.scratch = np.empty((n, count), storage) if n > 2 and coll.reduces else None
        self.ufunc = self.quiet = None
        self.avg = op_code == ReduceOp.AVG.code
        self.premul = op_code == ReduceOp.PREMUL_SUM.code
        if coll.reduces and op_code != USER_OP and dt is not DType.BFLOAT16:
            self.ufunc = _UFUNC[list(ReduceOp)[op_code]]
            self.quiet = dt.is_float
        # what the Program has this rank do in its one round, not which collective it is
        self.writes = bool(shape.to) and per > 0
        folds = bool(shape.order)
        self.gathers, self.own = len(shape.placed) > 1, shape.placed == (me,)  # (its block)
        self.k = None if n == 1 or op_code == USER_OP or not native.enabled() else \
            native.round_for(ll, shape.order, shape.block, dt.code, storage.itemsize, op_code,
                             count, per, size)
        split = folds and n > 1 and coll is Collective.ALL_REDUCE and \
            ll_split.applies(self, op_code, self.count * storage.itemsize)
        self.hot = self.rec = self.queued_entry = None  # (rec, queued_entry: callers set)
        if self.k is not None and not (self.chunk or self.premul or self.avg or split) and \
                (folds and coll is Collective.ALL_REDUCE or coll in ONE_ENTRY):
            self.hot = self.k
            self.k.set_head(*self.head)
        elif n == 1:  # one rank: every collective's one C entry copies (Round.alone)
            self.hot = ll_entry.alone(self, op_code)
        if folds and n == 1:
            self.run = self._alone
        elif split:  # a reduce-scatter and an all-gather through the segment
            self.run = ll_split.Split(self, op_code)
        elif coll is Collective.REDUCE_SCATTER and self.k is not None and not self.premul:
            self.run = ll_gather.scatter_runner(self, shape.block, shape.order)
        elif folds and self.k is not None:
            self.run = self._streamed_native if self.chunk else \
                self._fold_native if self.premul or self.avg else self._sum_native
        elif folds:
            self.run = self._streamed if self.chunk else self._fold_round
        elif self.gathers:
            self.run = ll_gather.runner(self, shape.placed)
        elif shape.placed:
            self.run = self._place_native if self.k is not None else self._place_round
        else:
            self.run = self._write_native if self.k is not None else self._write_round
        if coll is Collective.BROADCAST and self.k is not None and not self.chunk:
            ll_gather.broadcast_hot(self)  # LLRunner.broadcast_now's one C entry

    def describe(self) -> str:
        root = f", root={self.root}" if self.root >= 0 else ""
        return f"{self.name}(count={self.count}, {self.dtype.value}{root}, proto=LL)"

    # ---- the pieces ---------------------------------------------------------------------

    def _put(self, x: np.ndarray, red: Reducer | None, timeout: float) -> int:
        """Write our contribution into the parity the next call uses."""
        p = self.ll.parity(timeout, self.describe)
        if self.premul and red is not None:
            red.premultiply(x, self.mine[p])
        else:
            self.mine[p][...] = x
        return p

    def _fold(self, p: int, out: np.ndarray, red: Reducer, m: int | None = None) -> None:
        """out = c₀ ⊕ c₁ ⊕ … in the Program's order (of the rows' first ``m`` elements:
        one part of a streamed call)."""
        rows = self.rowlist[p] if m is None else [r[:m] for r in self.rowlist[p]]
        n = len(rows)
        uf = self.ufunc
        if n == 1:
            out[...] = rows[0]
        elif uf is None:
            red.combine(out, rows[0], rows[1])
            for r in rows[2:]:
                red.combine(out, out, r)
        elif n == 2:
            if self.quiet:
                quiet(uf, rows[0], rows[1], out)
            else:
                uf(rows[0], rows[1], out=out)
        else:
            with np.errstate(over="ignore", invalid="ignore") if self.quiet else nullcontext():
                if self.order is None:  # rank order: one accumulate over the stacked rows
                    acc = self.scratch if m is None else self.scratch[:, :m]
                    stacked = self.rows[p] if m is None else self.rows[p][:, :m]
                    uf.accumulate(stacked, axis=0, out=acc)
                    out[...] = acc[-1]
                else:                   # the same left fold, row by row
                    uf(rows[0], rows[1], out=out)
                    for r in rows[2:]:
                        uf(out, r, out=out)
        if self.avg:
            red.postdivide(out, n)

    # ---- one round, by what the Program does -----------------------------------------

    def _fold_round(self, x, out, red, timeout) -> None:
        """Contribute, then fold every contribution (all-reduce, reduce at the root,
        reduce-scatter: the block the Program folds)."""
        self._put(x, red, timeout)
        p = self.ll.sync(self.head, timeout, self.describe)
        self._fold(p, out, red)

    def _alone(self, x, out, red, timeout) -> None:
        """One rank folds only its own contribution (pre-scaled for PREMUL_SUM)."""
        if self.premul:
            red.premultiply(x, out)
        elif out is not x:
            out[...] = x

    def _streamed(self, x, out, red, timeout) -> None:
        """A fold round per cell-sized part (an all-reduce larger than a cell)."""
        ll, C, head, what = self.ll, self.chunk, self.head, self.describe
        total = x.size
        two = not self.avg and self.ufunc is not None and len(self.rowlist[0]) == 2
        for lo in range(0, total, C):
            hi = min(total, lo + C)
            m = hi - lo
            p = ll.parity(timeout, what)
            if self.premul:
                red.premultiply(x[lo:hi], self.mine[p][:m])
            else:
                self.mine[p][:m] = x[lo:hi]
            ll.sync(head, timeout, what)
            if two:
                rows = self.rowlist[p]
                if self.quiet:
                    quiet(self.ufunc, rows[0][:m], rows[1][:m], out[lo:hi])
                else:
                    self.ufunc(rows[0][:m], rows[1][:m], out=out[lo:hi])
            else:
                self._fold(p, out[lo:hi], red, m)

    def _place_round(self, x, out, red, timeout) -> None:
        """Contribute if the Program sends, then copy whole contributions into the output
        blocks it names (all-gather: every rank's; broadcast: the root's)."""
        ll = self.ll
        if self.writes:
            self._put(x, None, timeout)
        else:
            ll.parity(timeout, self.describe)
        self._place(ll.sync(self.head, timeout, self.describe), x, out)

    def _place(self, p: int, x, out) -> None:
        if self.gathers:
            rows = self.rows[p] if self.placed is None else self.rows[p][self.placed]
            out.reshape(len(rows), self.count)[...] = rows
        elif not self.own:
            out[...] = self.src[p]
        elif out is not x:
            out[...] = x

    def _write_round(self, x, out, red, timeout) -> None:
        """Contribute (if there is anything to send) and synchronise: a reduce's
        non-root, a barrier."""
        if self.writes:
            self._put(x, red, timeout)
        else:
            self.ll.parity(timeout, self.describe)
        self.ll.sync(self.head, timeout, self.describe)

    # ---- the same rounds through the compiled kernel (shm_native) ---------------------

    def _native_x(self, x, red, timeout, folds: bool = True):
        """What the kernel copies in: ``x``, or None when this rank sends nothing (and
        does not fold its own contribution) or its contribution is already written
        (PREMUL_SUM's pre-scaled copy, a strided input)."""
        if not (folds or self.writes):
            return None
        if self.premul and red is not None or not x.flags.c_contiguous:
            mine = self.mine[self.ll.parity(timeout, self.describe)]
            mine = mine if mine.size == x.size else mine[:x.size]  # a streamed part
            if self.premul and red is not None:
                red.premultiply(x, mine)
            else:
                mine[...] = x
            return None
        return x

    def _round(self, x, out, timeout) -> int:
        return native.run_round(self.ll, self.k, x, out, self.head, timeout, self.describe)

    def _sum_native(self, x, out, red, timeout) -> None:
        """A fold round in one kernel call (the hot path: no pre- or post-op)."""
        native.run_round(self.ll, self.k, x, out, self.head, timeout, self.describe)

    def _fold_native(self, x, out, red, timeout) -> None:
        self._round(self._native_x(x, red, timeout), out, timeout)
        if self.avg:
            red.postdivide(out, len(self.rowlist[0]))

    def _streamed_native(self, x, out, red, timeout) -> None:
        """:meth:`_streamed`, each cell-sized part one kernel call."""
        C, n = self.chunk, len(self.rowlist[0])
        for lo in range(0, x.size, C):
            part, o = x[lo:lo + C], out[lo:lo + C]
            self._round(self._native_x(part, red, timeout), o, timeout)
            if self.avg:
                red.postdivide(o, n)

    def _place_native(self, x, out, red, timeout) -> None:
        self._place(self._round(self._native_x(x, None, timeout, False), None, timeout), x, out)

    def _write_native(self, x, out, red, timeout) -> None:
        self._round(self._native_x(x, red, timeout, False), None, timeout)


class LLCollectives:
    """A front end over one :class:`LL` for tests and benchmarks: prepares (and caches)
    an op per call shape from LL's Programs. ``x``/``out`` are flat NumPy arrays in
    storage dtype."""

    def __init__(self, ll: LL, timeout: float = 300.0):
        self.ll, self.timeout = ll, timeout
        self.ops: dict[tuple, LLOp] = {}

    def op(self, coll: Collective, dt: DType, count: int, red: Reducer | None,
           root: int = -1) -> LLOp:
        code = red.code if red is not None else 0
        key = (coll, dt, count, code, root)
        o = self.ops.get(key)
        if o is None:
            if not fits(self.ll, coll, count, dt.itemsize):
                raise ValueError(f"LL cannot run {coll.value} of {count} × {dt.value} "
                                 f"(cells hold {self.ll.cell_bytes} bytes)")
            prog = program(coll, self.ll.n, self.ll.rank, root)
            o = self.ops[key] = LLOp(self.ll, prog, dt, count, code, root)
        return o

    def all_reduce(self, x: np.ndarray, dt: DType, red: Reducer, out=None) -> np.ndarray:
        out = x if out is None else out
        self.op(Collective.ALL_REDUCE, dt, x.size, red).run(x, out, red, self.timeout)
        return out

    def reduce(self, x: np.ndarray, dt: DType, red: Reducer, root: int, out=None):
        if self.ll.rank == root and out is None:
            out = x
        self.op(Collective.REDUCE, dt, x.size, red, root).run(
            x, out if self.ll.rank == root else None, red, self.timeout)
        return out

    def reduce_scatter(self, x: np.ndarray, dt: DType, red: Reducer, out=None):
        count = x.size // self.ll.n
        out = np.empty(count, x.dtype) if out is None else out
        self.op(Collective.REDUCE_SCATTER, dt, count, red).run(x, out, red, self.timeout)
        return out

    def broadcast(self, x: np.ndarray, dt: DType, root: int) -> np.ndarray:
        self.op(Collective.BROADCAST, dt, x.size, None, root).run(x, x, None, self.timeout)
        return x

    def all_gather(self, x: np.ndarray, dt: DType, out=None) -> np.ndarray:
        out = np.empty(x.size * self.ll.n, x.dtype) if out is None else out
        self.op(Collective.ALL_GATHER, dt, x.size, None).run(x, out, None, self.timeout)
        return out

    def barrier(self) -> None:
        self.op(Collective.BARRIER, DType.UINT8, 0, None).run(None, None, None, self.timeout)
