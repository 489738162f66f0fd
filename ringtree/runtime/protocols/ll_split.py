"""A large all-reduce on LL as a reduce-scatter and an all-gather through the segment:
fewer passes over memory than the fold round.

Passes per rank for an all-reduce of ``S`` bytes on ``n`` ranks (reads + writes; the
limit of ``benchmarks/cpu_peers.py`` is 2.5 S on 2 ranks: read a peer's half and add
it, copy the other half, as if the peer's memory could be read where it lies):

- the fold round (:meth:`~ringtree.runtime.protocols.ll.LLOp._streamed`): copy the whole
  part into the cell (2 S), fold all ``n`` rows into the output ((n+1) S): 5 S on 2
  ranks, every rank doing every add;
- this split (the shape of vLLM's and DeepSpeed's shared-memory kernels, and of the
  ring's reduce-scatter + all-gather): stage every block but the own one
  (2 (n-1)/n S), fold the own block of every rank's part in the Program's order, the
  own row from the input, into this rank's cell of the next parity a tile at a time,
  each tile copied from L1 into the output (S read, 2 S/n written), publish it, copy the
  peers' folded blocks out (2 (n-1)/n S): 4 S on 2 ranks, each add done once.

Two synchronisations per cell-sized part instead of one, each an ordinary LL call
number, so the two-parity rule holds as for every call: the fold's destination (the
cell of parity ``s + 1``) is written only after every rank posted ``s``, i.e. finished
call ``s - 1``, the last reader of that cell. With the kernel both calls of a part are
one C entry (``Round.split``; ``Round.hot`` when the part is the whole buffer: the
communicator's hot path), which returns to Python only when a peer sleeps or is late
(:meth:`Split.after` finishes either call there).

Every element is folded from the same operands in the same order as the fold round
(the own row is the same bytes, read from the input instead of the segment), so the
bits are the same; ``RINGTREE_LL_NATIVE=0``, a build without a compiler and a dtype
the kernel does not fold (float16) run the same two calls with NumPy, and the choice
(:func:`applies`) depends only on what every rank shares (collective, size, dtype,
op, ranks), never on whether the kernel is there.
"""

from __future__ import annotations

import numpy as np

from ringtree.ir.wire import USER_OP
from ringtree.ops import ReduceOp, quiet
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import SEQ_MASK

# Smallest all-reduce (bytes) the split runs; below, one fold round is cheaper than a
# second synchronisation (benchmarks/ll_split.py).
SPLIT_MIN = 256 << 10
# Largest part (bytes of the buffer) per pair of synchronisations (at most a cell):
# 256 and 512 KiB parts were not faster than the 1 MiB cell (benchmarks/ll_split.py).
PART = 1 << 20
SKIP_OPS = (ReduceOp.AVG.code, ReduceOp.PREMUL_SUM.code, USER_OP)


def applies(op, op_code: int, nbytes: int) -> bool:
    """Does the all-reduce ``op`` (an :class:`~ringtree.runtime.protocols.ll.LLOp` of
    ``nbytes``) run split? Not for AVG and PREMUL_SUM (their pre- and post-steps) nor
    user ops, nor one rank."""
    n = op.ll.n
    return n > 1 and nbytes >= SPLIT_MIN and op_code not in SKIP_OPS and \
        (op.chunk or op.count) >= n


class Split:
    """The ``run(x, out, red, timeout)`` of the all-reduce ``op`` (an
    :class:`~ringtree.runtime.protocols.ll.LLOp`) split into parts of ``op.chunk`` (or
    all ``op.count``) elements, each a reduce-scatter then an all-gather; a last part
    whose size the ranks do not divide runs the fold round."""

    def __init__(self, op, op_code: int):
        ll = self.ll = op.ll
        n, me = ll.n, ll.rank
        self.op, self.n, self.me = op, n, me
        part = min(op.chunk or op.count, PART // op.dtype.storage.itemsize)
        self.part = part = part - part % n
        B = self.B = part // n                               # elements of a block
        storage = op.dtype.storage
        item = self.item = storage.itemsize
        size = part * item
        order = self.order = tuple(range(n)) if op.order is None else op.order
        # the folded block of each rank, at the start of its cell (per parity)
        self.dst = tuple(ll.view(me, p, storage, B) for p in (0, 1))
        self.blocks = tuple(ll.rows(p, storage, B) for p in (0, 1))  # row b: rank b's
        self.staged = tuple(ll.rows(p, storage, B, me * B, size) for p in (0, 1))
        self.offs = tuple(ll.area(me, p, B * item)[0] for p in (0, 1))
        self.k1 = self.k2 = None
        if native.enabled() and native.folds(op.dtype.code, op_code):
            code = op.dtype.code
            self.k1 = native.round_for(ll, order, me, code, item, op_code, B, part, size)
            self.k1.skips(order.index(me), me * B * item, (me + 1) * B * item)
            self.k2 = native.round_for(ll, (), 0, code, item, op_code, B, B, B * item)
            cells = [[ll.area(q, p, B * item)[0] for q in range(n)] for p in (0, 1)]
            self.k2.places(cells[0], cells[1], me)
            self.k1.pair(self.k2, *self.offs)
            if part == op.count:  # one part: the hot path's one C entry (Round.hot)
                op.hot = self.k1
                self.k1.set_head(*op.head)

    def __call__(self, x: np.ndarray, out: np.ndarray, red, timeout: float) -> None:
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        total, part = x.size, self.part
        whole = total - total % part
        one = self._compiled if self.k1 is not None else self._python
        for lo in range(0, whole, part):
            xp, op_out = x[lo:lo + part], out[lo:lo + part]
            if not one(xp, op_out, red, timeout):
                self._copy_peers(op_out)
        if whole < total:
            tail(self.op, x[whole:], out[whole:], red, timeout)

    def _compiled(self, xp: np.ndarray, op_out: np.ndarray, red, timeout: float) -> bool:
        """One part in one kernel entry (``Round.split``: calls s and s + 1)."""
        ll, head = self.ll, self.op.head
        s = ll.seq + 1
        if ll.synced < s - 1:
            ll.parity(timeout, self.op.describe)
        r = self.k1.split(xp, op_out, s, head[0], head[1] | (s & SEQ_MASK), head[2])
        self.after(xp, op_out, r, s, timeout)
        return True

    def after(self, xp: np.ndarray, op_out: np.ndarray, r: int, s: int,
              timeout: float) -> None:
        """Complete a part the kernel ran from call ``s`` (``Round.split``, or
        ``Round.hot`` on the hot path) and that returned ``r``: -1 done; a code of call
        ``s`` (a peer slept or was late before the fold): Python finishes that wait,
        folds, and runs the all-gather call; ``native.SECOND`` + a code of call s + 1:
        Python finishes that wait and copies the peers' blocks."""
        ll, op, k1 = self.ll, self.op, self.k1
        what = op.describe
        ll.written[0] = ll.written[1] = None  # the kernel wrote both lines' headers
        if r == -1:
            ll.seq = ll.synced = s + 1
            return
        if r >= native.SECOND // 2:
            ll.seq = s + 1
            native.finish(ll, self.k2, r - native.SECOND, s + 1, timeout, what)
        else:
            ll.seq = s
            lo, hi = self.me * self.B, (self.me + 1) * self.B
            p = s & 1
            op.mine[p][lo:hi] = xp[lo:hi]
            native.finish(ll, k1, r, s, timeout, what)
            ll.synced = s
            k1.fold(self.dst[1 - p], p)
            op_out[lo:hi] = self.dst[1 - p]
            if run_share(ll, self.k2, op_out, self.B * self.item, op.head, timeout, what):
                return
        ll.synced = ll.seq
        self._copy_peers(op_out)

    def _copy_peers(self, op_out: np.ndarray) -> None:
        """Copy the peers' folded blocks of the last call out of the segment."""
        p = self.ll.seq & 1
        for b in range(self.n):
            if b != self.me:
                op_out[b * self.B:(b + 1) * self.B] = self.blocks[p][b]

    def _python(self, xp: np.ndarray, op_out: np.ndarray, red, timeout: float) -> bool:
        """The same two calls with NumPy."""
        ll, op = self.ll, self.op
        what = op.describe
        lo, hi = self.me * self.B, (self.me + 1) * self.B
        p = ll.parity(timeout, what)
        mine = op.mine[p]
        mine[:lo] = xp[:lo]
        mine[hi:self.part] = xp[hi:]
        ll.sync(op.head, timeout, what)
        self._fold(p, xp[lo:hi], red)
        op_out[lo:hi] = self.dst[1 - p]
        ll.parity(timeout, what)
        ll.sync(op.head, timeout, what)
        return False

    def _fold(self, p: int, xb: np.ndarray, red) -> None:
        """dst[1 - p] = the Program's fold of block ``me`` of parity ``p``'s parts, the
        own row from ``xb``."""
        rows = [xb if q == self.me else self.staged[p][q] for q in self.order]
        d, uf = self.dst[1 - p], self.op.ufunc
        if uf is None:  # bfloat16: the reducer's combine, as the fold round
            red.combine(d, rows[0], rows[1])
            for r in rows[2:]:
                red.combine(d, d, r)
        elif self.op.quiet:
            quiet(uf, rows[0], rows[1], d)
            for r in rows[2:]:
                quiet(uf, d, r, d)
        else:
            uf(rows[0], rows[1], out=d)
            for r in rows[2:]:
                uf(d, r, out=d)


def tail(op, x: np.ndarray, out: np.ndarray, red, timeout: float) -> None:
    """A last part of fewer elements than the ranks' blocks need: one fold round."""
    ll, m = op.ll, x.size
    if op.k is not None:
        native.run_round(ll, op.k, x, out, op.head, timeout, op.describe)
        return
    p = ll.parity(timeout, op.describe)
    op.mine[p][:m] = x
    ll.sync(op.head, timeout, op.describe)
    op._fold(p, out, red, m)


def run_share(ll, k, out, block: int, head, timeout: float, what) -> bool:
    """The all-gather half alone (``Round.share``: after Python finished the
    reduce-scatter half): publish the folded block, wait, copy the peers'. False when
    Python must copy them (the wait was finished here)."""
    s = ll.seq + 1
    ll.written[s & 1] = None
    r = k.share(out, s, head[0], head[1] | (s & SEQ_MASK), head[2], 0, block, block)
    ll.seq = s
    if r != -1:
        native.finish(ll, k, r, s, timeout, what)
    ll.synced = s
    return r == -1
