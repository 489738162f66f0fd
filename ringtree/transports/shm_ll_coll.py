"""The collectives of the LL protocol (:mod:`ringtree.transports.shm_ll`).

Every collective is the same three moves: write this rank's contribution into its
parity area (inline in its line up to 48 bytes, else its cell), :meth:`LL.sync`, then
read what it needs straight out of the segment:

============== =============================== ======================================
collective     contribution of rank r          result
============== =============================== ======================================
all_reduce     its input (pre-scaled for        c₀ ⊕ c₁ ⊕ … ⊕ cₙ₋₁, left to right,
               PREMUL_SUM)                      on every rank (AVG: then ÷ n)
reduce         the same                         the same, on the root only
reduce_scatter its whole input (n blocks)       block r of every cell, reduced
broadcast      the root's buffer (others none)  copied out of the root's area
all_gather     its input                        every area, in rank order
barrier        nothing                          —
============== =============================== ======================================

Every rank folds the contributions in rank order from the same bytes, so all ranks get
the same bits (the reduction is ``ufunc.accumulate`` along the rank axis, which is
defined as a left fold, or one ``ufunc`` call for two ranks; bfloat16 and user ops go
through :meth:`Reducer.combine` rank by rank).

A :class:`LLOp` is prepared once per call shape (collective, dtype, count, op, root)
with its fingerprint and every view it needs, so a repeated call allocates nothing.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Collective
from ringtree.ops import _UFUNC, ReduceOp, Reducer, quiet
from ringtree.transports.shm_ll import INLINE, LL, fingerprint

COLLECTIVES = (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.REDUCE,
               Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.BARRIER)


def contribution_bytes(coll: Collective, count: int, itemsize: int, nranks: int) -> int:
    """Bytes one rank writes for a call (what must fit a cell)."""
    if coll is Collective.REDUCE_SCATTER:
        return count * itemsize * nranks
    if coll is Collective.BARRIER:
        return 0
    return count * itemsize


def fits(ll: LL, coll: Collective, count: int, itemsize: int) -> bool:
    """Can LL run this call? (An all-reduce of any size can: it streams through the
    cells, one cell per synchronisation.)"""
    return coll is Collective.ALL_REDUCE or coll in COLLECTIVES and \
        contribution_bytes(coll, count, itemsize, ll.n) <= max(ll.cell_bytes, INLINE)


class LLOp:
    """One prepared call shape; ``run(x, out, reducer, timeout)`` executes it."""

    __slots__ = ("ll", "coll", "count", "root", "fp", "mine", "rows", "rowlist", "scratch",
                 "ufunc", "quiet", "avg", "premul", "dtype", "name", "run", "own", "chunk",
                 "label")

    def __init__(self, ll: LL, coll: Collective, dt: DType, count: int, op_code: int,
                 root: int, name: str = ""):
        n, me = ll.n, ll.rank
        storage = dt.storage
        self.ll, self.coll, self.count, self.root, self.dtype = ll, coll, count, root, dt
        self.name = name or coll.value
        opname = "user" if op_code == 255 else list(ReduceOp)[op_code].value \
            if coll.reduces else "-"
        self.label = (self.name, count, dt.value, opname, root)  # for the flight recorder
        self.fp = fingerprint(coll.code, dt.code, op_code, root, count)
        size = contribution_bytes(coll, count, storage.itemsize, n)
        self.chunk = 0
        if coll is Collective.ALL_REDUCE and size > max(ll.cell_bytes, INLINE):
            # streamed: cell-sized chunks, one synchronisation each
            self.chunk = ll.cell_bytes // storage.itemsize
            count = self.chunk
            size = count * storage.itemsize
        per = count * n if coll is Collective.REDUCE_SCATTER else count
        if coll is Collective.BARRIER:
            per = 0
        self.mine = tuple(ll.view(me, p, storage, per) for p in (0, 1))
        skip = me * count if coll is Collective.REDUCE_SCATTER else 0
        self.rows = tuple(ll.rows(p, storage, count, skip, size) for p in (0, 1))
        self.rowlist = tuple(tuple(rows[r] for r in range(n)) for rows in self.rows)
        self.own = tuple(rows[root if root >= 0 else me] for rows in self.rows)
        self.scratch = np.empty((n, count), storage) if n > 2 and coll.reduces else None
        self.ufunc = self.quiet = None
        self.avg = op_code == ReduceOp.AVG.code
        self.premul = op_code == ReduceOp.PREMUL_SUM.code
        if coll.reduces and op_code != 255 and dt is not DType.BFLOAT16:
            self.ufunc = _UFUNC[list(ReduceOp)[op_code]]
            self.quiet = dt.is_float
        self.run = {
            Collective.ALL_REDUCE: self._all_reduce_alone if n == 1 else
            self._all_reduce_streamed if self.chunk else self._all_reduce, Collective.REDUCE: self._reduce,
            Collective.REDUCE_SCATTER: self._reduce_scatter,
            Collective.BROADCAST: self._broadcast, Collective.ALL_GATHER: self._all_gather,
            Collective.BARRIER: self._barrier,
        }[coll]

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
        """out = row₀ ⊕ row₁ ⊕ … in rank order (of the rows' first ``m`` elements: one
        part of a streamed call)."""
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
            acc = self.scratch if m is None else self.scratch[:, :m]
            stacked = self.rows[p] if m is None else self.rows[p][:, :m]
            with np.errstate(over="ignore", invalid="ignore") if self.quiet else nullcontext():
                uf.accumulate(stacked, axis=0, out=acc)
            out[...] = acc[-1]
        if self.avg:
            red.postdivide(out, n)

    # ---- the collectives ------------------------------------------------------------------

    def _all_reduce(self, x, out, red, timeout) -> None:
        self._put(x, red, timeout)
        p = self.ll.sync(self.fp, timeout, self.describe)
        self._fold(p, out, red)

    def _all_reduce_alone(self, x, out, red, timeout) -> None:
        """One rank: the result is the input (pre-scaled for PREMUL_SUM)."""
        if self.premul:
            red.premultiply(x, out)
        elif out is not x:
            out[...] = x

    def _all_reduce_streamed(self, x, out, red, timeout) -> None:
        ll, C, fp, what = self.ll, self.chunk, self.fp, self.describe
        total = x.size
        uf = self.ufunc if not self.avg and len(self.rowlist[0]) == 2 else None
        for lo in range(0, total, C):
            hi = min(total, lo + C)
            m = hi - lo
            p = ll.parity(timeout, what)
            if self.premul:
                red.premultiply(x[lo:hi], self.mine[p][:m])
            else:
                self.mine[p][:m] = x[lo:hi]
            ll.sync(fp, timeout, what)
            if uf is not None:
                rows = self.rowlist[p]
                if self.quiet:
                    quiet(uf, rows[0][:m], rows[1][:m], out[lo:hi])
                else:
                    uf(rows[0][:m], rows[1][:m], out=out[lo:hi])
            else:
                self._fold(p, out[lo:hi], red, m)

    def _reduce(self, x, out, red, timeout) -> None:
        self._put(x, red, timeout)
        p = self.ll.sync(self.fp, timeout, self.describe)
        if self.ll.rank == self.root:
            self._fold(p, out, red)

    def _reduce_scatter(self, x, out, red, timeout) -> None:
        self._put(x, red, timeout)
        p = self.ll.sync(self.fp, timeout, self.describe)
        self._fold(p, out, red)

    def _broadcast(self, x, out, red, timeout) -> None:
        ll = self.ll
        if ll.rank == self.root:
            self._put(x, None, timeout)
            ll.sync(self.fp, timeout, self.describe)
        else:
            ll.parity(timeout, self.describe)
            p = ll.sync(self.fp, timeout, self.describe)
            out[...] = self.own[p]

    def _all_gather(self, x, out, red, timeout) -> None:
        self._put(x, None, timeout)
        p = self.ll.sync(self.fp, timeout, self.describe)
        out.reshape(self.ll.n, self.count)[...] = self.rows[p]

    def _barrier(self, x, out, red, timeout) -> None:
        self.ll.parity(timeout, self.describe)
        self.ll.sync(self.fp, timeout, self.describe)


class LLCollectives:
    """Convenience front end over one :class:`LL`: prepares (and caches) an op per call
    shape. ``x``/``out`` are flat NumPy arrays in storage dtype."""

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
            o = self.ops[key] = LLOp(self.ll, coll, dt, count, code, root)
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
