"""A large all-reduce on the user's own buffers with one copy of each byte: the peers'
inputs and outputs read where they lie with ``process_vm_readv(2)``.

Through the segment (:mod:`ll_split`) a rank stages its part, folds, and copies the
peers' folded blocks out: 4 S moved per rank on 2 ranks for an all-reduce of ``S``
bytes; above 16 MiB on 2 ranks the ring (Simple) ran instead. Registered buffers
(:mod:`ll_reg`) need no staging because every peer maps them; plain buffers cannot be
mapped, but they can be read through the kernel (cross-memory attach, as Open MPI's
``smsc/cma`` and :mod:`ll_direct`'s reduce-scatter do). One call, the registered path's
shape with the kernel's reads:

1. publish: every rank posts its input's and its output's addresses in its LL line's
   inline payload (:class:`~ringtree.runtime.protocols.ll_direct.DirectOp`'s words, the
   output in word :data:`OUT`) and waits for every peer's (the LL wait: a dead peer is
   named, nothing spins when ranks outnumber cores);
2. fold: rank ``r`` folds block ``r`` (elements ``r m / n`` to ``(r+1) m / n``) of every
   rank's input, in the Program's rank order, into block ``r`` of its output — a peer's
   row read :data:`PIECE` bytes at a time into an
   L2-sized scratch (straight into the output piece for the first operand when the
   output is not the own input), the own row read in place; AVG divides the block;
3. a synchronisation carrying the rank's read status (a failed read raises on every
   rank, naming who could not read whom); after it every output block is folded;
4. copy: one ``process_vm_readv`` per peer reads its folded block straight into the own
   output;
5. a last synchronisation (status again): no rank returns, and so no caller reuses a
   buffer, while a peer may still read it.

*In place.* A rank's output block ``r`` is its own input row of block ``r``. Peers read
only blocks ``q != r`` of it in step 2, so writing block ``r`` does not disturb them; but
the fold must use the row's old values: when the own row comes first or second in the
order, the first ufunc reads it before it writes (an elementwise ufunc whose output is
exactly one input); when it comes later, each piece folds into a scratch piece copied
into place afterwards (as :mod:`ll_reg` does). Bits: every element is the same operands
in the same order as the rank-order fold (:meth:`~ringtree.ops.Reducer.combine`, a ufunc
per pair, no fused multiply-add): the bits of every other path.

*Bytes per rank* (2 ranks, S the buffer): the fold reads the own half in place (S/2)
and the peer's half through the kernel (S/2 read from memory, written into L2), writes
the folded half (S/2); the copy reads the peer's folded half and writes it (S/2 + S/2):
2.5 S from memory, against 4 S through the segment — plus the kernel's per-page cost of
pinning the peer's pages (a ``process_vm_readv`` moves 5-9 GB/s here against 15-30 GB/s
for a warm ``memcpy``, ``benchmarks/cma_copy.py``). On ``n`` ranks the fold reads S
(S/n in place, the rest through the kernel) and writes S/n, the copy reads and writes
(n-1)/n S each: (3 - 1/n) S.

*Failure.* A peer dead before it posts is named by the LL wait; during a read by
``ESRCH`` (:meth:`~ringtree.runtime.protocols.ll_direct.Direct.read`). Any other failed
read is posted in the next synchronisation and raised on every rank. The reads write
only the scratch and the own output, never an input: out of place a failure leaves every
input as it was; in place the own output block (= the own input block) may hold a
partial fold, as any in-place collective that fails mid-way.

Where it runs: from :data:`MIN_BYTES` (``RINGTREE_CMA_MIN`` overrides it, as for the
other single-copy calls), where it was measured ahead of the segment's split and the
ring (``docs/design-notes.md``, "Single-copy all-reduce on plain buffers"). Not for
PREMUL_SUM (each rank's factor is its own, applied to its own input).
"""

from __future__ import annotations

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Collective, Program
from ringtree.ops import ReduceOp, Reducer
from ringtree.runtime.protocols.ll_direct import ADDR, Direct, DirectOp
from ringtree.transports import shm_cma as cma
from ringtree.transports.shm_ll import LL

__all__ = ["MIN_BYTES", "AllReduceOp", "applies", "op_for"]

OUT = 3  # the inline payload word of the output's address (ll_direct: PID, ADDR, TOKEN)
# the all-reduce's bytes from which it runs, by more than 2 ranks (benchmarks/ll_direct.py
# --colls all_reduce, A/B against the split and the ring in the same processes)
MIN_BYTES: dict[bool, int] = {False: 4 << 20, True: 4 << 20}
# bytes of a peer's row read and folded at a time: 2 ranks, 16 and 64 MiB, alternated in
# one job (loaded host): 256 KiB pieces (ll_direct.PIECE) 1.03-1.13x the time of 512 KiB,
# 1 MiB and 2 MiB within 3% of 512 KiB, 64 KiB 1.2x; two pieces of scratch fill the
# 1 MiB L2 here
PIECE = 512 << 10


def applies(direct: Direct | None, coll: Collective, count: int, itemsize: int,
            op_code: int) -> bool:
    """Does a call of ``count`` elements run on a single-copy path (this all-reduce, or
    :class:`~ringtree.runtime.protocols.ll_direct.Direct`'s other collectives)?"""
    if direct is None:
        return False
    if coll is not Collective.ALL_REDUCE:
        return direct.applies(coll, count, itemsize, op_code)
    n = direct.ll.n
    if n < 2 or op_code == ReduceOp.PREMUL_SUM.code:
        return False
    least = direct.min_bytes if direct.min_bytes is not None else MIN_BYTES[n > 2]
    return count * itemsize >= max(least, 1)


def op_for(ll: LL, direct: Direct, prog: Program, dt: DType, count: int, op_code: int,
           root: int) -> DirectOp:
    """The single-copy op of ``prog`` (where :func:`applies`)."""
    cls = AllReduceOp if prog.collective is Collective.ALL_REDUCE else DirectOp
    return cls(ll, direct, prog, dt, count, op_code, root)


class AllReduceOp(DirectOp):
    """The all-reduce: fold the own block of every rank's input, then read the peers'
    folded blocks (the module's steps)."""

    __slots__ = ("bounds", "pos")

    def __init__(self, ll: LL, direct: Direct, prog: Program, dt: DType, count: int,
                 op_code: int, root: int):
        super().__init__(ll, direct, prog, dt, count, op_code, root)
        n = ll.n
        self.bounds = [q * count // n for q in range(n + 1)]  # block q: bounds[q:q+2]
        self.pos = self.order.index(ll.rank)  # the own row's place in the fold
        self.run = self._all_reduce

    def _publish_both(self, x: np.ndarray, out: np.ndarray, timeout: float) -> list:
        """Post the input's and the output's addresses; every rank's pair once all have."""
        ll, W = self.ll, self.ll.W
        words = self._words[ll.parity(timeout, self.describe)]
        at = words[ll.rank]
        W[at + ADDR], W[at + OUT] = cma.address(x), cma.address(out)
        ll.sync(self.head, timeout, self.describe)
        return [(int(W[i + ADDR]), int(W[i + OUT])) for i in words]

    def _all_reduce(self, x: np.ndarray, out: np.ndarray, red: Reducer, timeout: float
                    ) -> None:
        n, me, b = self.ll.n, self.ll.rank, self.bounds
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        addrs = self._publish_both(x, out, timeout)
        status = 0
        if b[me + 1] > b[me]:
            status = self._fold(x, out, red, [a for a, _ in addrs], b[me], b[me + 1])
            if not status and self.avg:
                red.postdivide(out[b[me]:b[me + 1]], n)
        self._complete(status, timeout)
        base, item = cma.address(out), out.itemsize
        for q in range(n):
            if q != me and b[q + 1] > b[q]:
                at = b[q] * item
                e = self.direct.read(q, [(base + at, addrs[q][1] + at,
                                          (b[q + 1] - b[q]) * item)])
                if e:
                    status = q << 32 | e
                    break
        self._complete(status, timeout)

    def _fold(self, x: np.ndarray, out: np.ndarray, red: Reducer, ins: list[int],
              lo: int, hi: int) -> int:
        """out[lo:hi] = the rank-order fold of every rank's x[lo:hi] (peers' rows at
        ``ins``), a piece at a time: 0, or the failed read's status."""
        me, item = self.ll.rank, x.itemsize
        own_row, dst = x[lo:hi], out[lo:hi]
        alias = np.may_share_memory(own_row, dst)  # in place
        via_tmp = alias and self.pos >= 2  # the own row is read after the first write
        acc_is_own = alias and not via_tmp
        step = max(1, PIECE // item)
        s = self._buffers(min(step, hi - lo), x.dtype)
        for a in range(0, hi - lo, step):
            m = min(step, hi - lo - a)
            acc = s[1][:m] if via_tmp else dst[a:a + m]
            first = None
            for k, q in enumerate(self.order):
                if q == me:
                    v = own_row[a:a + m]
                else:
                    v = acc if k == 0 and not acc_is_own else s[0][:m]
                    e = self.direct.read(q, [(cma.address(v), ins[q] + (lo + a) * item,
                                              m * item)])
                    if e:
                        return q << 32 | e
                if k == 0:
                    first = v
                else:
                    red.combine(acc, first if k == 1 else acc, v)
            if via_tmp:
                dst[a:a + m] = acc
        return 0
