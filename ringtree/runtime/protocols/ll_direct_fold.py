"""The single-copy folds: a large all-reduce (and reduce-scatter) on the user's own
buffers with one copy of each byte: the peers' inputs read and their outputs written
where they lie, with ``process_vm_readv(2)`` and ``process_vm_writev(2)``.

The reduce-scatter (:class:`ScatterOp`, run where :mod:`ll_direct` decides) is the
all-reduce's first half: block ``r`` of every rank's input folded into rank ``r``'s
output, nothing pushed. Both run the block's loop as one compiled call where the kernel
folds the dtype and op (:class:`FoldOp`).

Through the segment (:mod:`ll_split`) a rank stages its part, folds, and copies the
peers' folded blocks out: 4 S moved per rank on 2 ranks for an all-reduce of ``S``
bytes; above 16 MiB on 2 ranks the ring (Simple) ran instead. Registered buffers
(:mod:`ll_reg`) need no staging because every peer maps them; plain buffers cannot be
mapped, but the kernel can copy between them (cross-memory attach, as Open MPI's
``smsc/cma`` does). One all-reduce:

1. publish: every rank posts its input's and its output's addresses in its LL line's
   inline payload (:class:`~ringtree.runtime.protocols.ll_direct.DirectOp`'s words, the
   output in word :data:`OUT`) and waits for every peer's (the LL wait: a dead peer is
   named, nothing spins when ranks outnumber cores);
2. fold and push: rank ``r`` folds block ``r`` (elements ``r m / n`` to ``(r+1) m / n``)
   of every rank's input, in the Program's rank order, into block ``r`` of its output,
   :data:`PIECE` bytes at a time — a peer's row read into an L2-sized scratch (straight
   into the output piece for the first operand when the output is not the own input),
   the own row read in place, AVG dividing the piece — and writes each folded piece,
   still in L2, into block ``r`` of every peer's output (``process_vm_writev``). Where
   the kernel folds the dtype and op (not AVG), the block's loop is one compiled call
   with the GIL released (``shm_native.fold_push``, pieces of :data:`NATIVE_PIECE`,
   through an L1 tile in place): the same reads, fold order and writes;
3. complete: a synchronisation carrying the rank's status (a failed read or write raises
   on every rank, naming who could not read or write whom). After it every output is
   whole, and no rank returns, so no caller reuses a buffer, while a peer may still read
   or write it.

The registered path's shape — fold into the own output, synchronise, read every peer's
folded block, synchronise — ran this way first (one ``process_vm_readv`` per peer for
the copy): pushing the folded pieces from L2 instead saves reading the folded block
back from memory (S/2 on 2 ranks) and one synchronisation, and took 0.68-0.88x its time
at 4-64 MiB on 2 ranks (``docs/design-notes.md``).

*In place.* A rank's output block ``r`` is its own input row of block ``r``. Only rank
``r`` reads anyone's row ``r``, so writing block ``r`` of its own output and of its
peers' (their rows ``r``, read by rank ``r`` piece by piece before it writes the same
piece back) disturbs no reader; but the own fold must use the row's old values: when
the own row comes first or second in the order, the first ufunc reads it before it
writes (an elementwise ufunc whose output is exactly one input); when it comes later,
each piece folds into a scratch piece copied into place afterwards (as :mod:`ll_reg`
does). Bits: every element is the same operands in the same order as the rank-order
fold (:meth:`~ringtree.ops.Reducer.combine`, a ufunc per pair, no fused multiply-add),
the bits of every other path, on every rank (the peers get the folding rank's bytes).

*Bytes per rank* (2 ranks, S the buffer): the fold reads the own half in place (S/2)
and the peer's half through the kernel (S/2 read from memory, written into L2), writes
the folded half (S/2) and, through the kernel from L2, the peer's copy of it (S/2): 2 S
from memory, against 4 S through the segment and the 2.5 S of ``cpu_peers.py``'s limit
(which copies the other half back rather than having it written) — plus the kernel's
per-page cost of pinning the peer's pages (``process_vm_readv`` moves 5-9 GB/s here
against 15-30 GB/s for a warm ``memcpy``, ``benchmarks/cma_copy.py``). On ``n`` ranks:
the fold reads S (S/n in place, the rest through the kernel) and writes S/n to the own
output and (n-1)/n S to the peers': 2 S.

*Failure.* A peer dead before it posts is named by the LL wait; during a read or write
by ``ESRCH`` (:meth:`~ringtree.runtime.protocols.ll_direct.Direct.read`). Any other
failure is posted in the synchronisation and raised on every rank. Reads and writes
touch only the scratch and the outputs: out of place a failure leaves every input as
it was; in place the outputs (= inputs) may hold folded pieces, as any in-place
collective that fails mid-way.

Where it runs: from :data:`MIN_BYTES` (``RINGTREE_CMA_MIN`` overrides it, as for the
other single-copy calls), where it was measured ahead of the segment's split and the
ring (``docs/design-notes.md``, "Single-copy all-reduce on plain buffers" and "The
crossover is the host's"): 2 ranks from 2 MiB; on more ranks from 8 MiB (below, with
2 ranks per core, the kernel's slower copy cost as much CPU time as the split's extra
passes). In the band of sizes where hosts disagree, the communicator times both paths
at the first call of each octave and keeps the faster
(:mod:`~ringtree.runtime.protocols.ll_crossover`). Not for PREMUL_SUM (each rank's factor is its own, applied to its own input). The probe
(:func:`~ringtree.runtime.protocols.ll_direct_probe.probe`) checks writes too.
"""

from __future__ import annotations

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Collective, Program
from ringtree.ops import ReduceOp, Reducer
from ringtree.runtime.protocols.ll_direct import ADDR, WROTE, Direct, DirectOp
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import LL

__all__ = ["MIN_BYTES", "AllReduceOp", "FoldOp", "ScatterOp", "applies"]

OUT = 3  # the inline payload word of the output's address (ll_direct: PID, ADDR, TOKEN)
# the all-reduce's bytes from which it runs, by "more than 2 ranks" (benchmarks/ll_direct.py
# --colls all_reduce, alternated against the split and the ring in the same processes,
# loaded host): 2 ranks 1.10-1.74x the split's speed at 4 MiB, 1.14-2.6x above, behind
# or level at 1-2 MiB (0.74-1.03); 4 ranks on 2 cores level or behind the split at 2-64 MiB in three of four
# runs (0.85-1.07; 1.74 once). On a quiet host (the split's time over this one's, two
# runs each): 2 ranks 0.94 at 1 MiB, 0.98 at 2, 1.12 at 4, 1.32-1.34 at 8-16, 2.56 at 64;
# 3 ranks 0.81-0.83 at 4 MiB, 0.99 at 8, 1.01-1.14 at 16, 1.08-1.19 at 32, 1.26-1.27 at 64;
# 4 ranks on 2 cores 0.67-0.91 at 4 MiB, 0.85-1.02 at 8, 0.99-1.12 at 16, 1.00-1.06 at
# 32, 1.02-1.16 at 64: so more than 2 ranks from 32 MiB. With the block's loop compiled
# (shm_native.fold_push; quiet host, AMD EPYC, 512 KiB L2 a core): 2 ranks 0.85-0.93 at
# 512 KiB, 1.00 at 768 KiB, 1.03-1.08 at 1 MiB, 1.14-1.15 at 2, 1.25 at 4, 1.51 at 16,
# 1.91 at 64; 3 ranks on 2 cores 0.77 at 1 MiB, 1.04 at 4, 1.20 at 8, 1.07 at 16, 1.22
# at 32; 4 ranks 0.76 at 2 MiB, 0.89 at 4, 1.09 at 8, 1.07 at 16, 1.16 at 32. On a third
# host (AMD EPYC Zen 3, where the kernel's copy ran at 9 GB/s against 23 for a user-space
# copy at 1 MiB) the split won to 8 MiB with 64 KiB pieces (0.65 at 1 MiB, 0.75 at 2, 0.82
# at 4, 0.96 at 8) and to about 3 MiB with the 128 KiB pieces below. The crossover is the
# host's; the one that loses least on the worst of the three measured hosts is 2 MiB
# (at 1 MiB the split costs at most 8 % on the Zen 2 host, the single copy 1.5x on the
# Zen 3 one): 2 ranks from 2 MiB, more from 8 MiB. Where the hosts disagree, the
# communicator measures both instead (ll_crossover.BAND); this is the rule outside it,
# and inside with RINGTREE_TUNE=model
MIN_BYTES: dict[bool, int] = {False: 2 << 20, True: 8 << 20}
# bytes of a peer's row read and folded at a time: 2 ranks, 16 and 64 MiB, alternated in
# one job (loaded host): 256 KiB pieces (ll_direct.PIECE) 1.03-1.13x the time of 512 KiB,
# 1 MiB and 2 MiB within 3% of 512 KiB, 64 KiB 1.2x; two pieces of scratch fill the
# 1 MiB L2 here
PIECE = 512 << 10
SCATTER_PIECE = 256 << 10  # the same for the reduce-scatter's Python loop
# the same in the compiled loop (shm_native.fold_push), where a piece costs no Python:
# 2 ranks, alternated in one job (quiet host, 512 KiB L2), two runs, µs: 1 MiB 32 KiB
# 187-200, 64 KiB 188-190, 128 KiB 194-198, 256 KiB 200-203; 16 MiB 2,772-3,106 /
# 2,726-3,146 / 2,891-3,271 / 3,080-3,485; 64 MiB 10,744-11,006 / 10,474-10,897 /
# 10,914-11,234 / 11,407-11,527; on a Zen 3 host with the same L2, where each move
# through the kernel costs more (32 MiB read in 64 KiB moves 1.3x the time of 256 KiB
# ones), 64 / 128 / 256 KiB: 1 MiB 239 / 228 / 212, 4 MiB 731-807 / 660-716 / 629-636,
# 16 MiB 2,523-3,118 / 2,227-2,787 / 2,407-2,606, 64 MiB 9,990 / 9,123 / 8,809. 128 KiB
# is within 6 % of the best on the first host and 13 % on the second (64 KiB: 27 %;
# 256 KiB: 12 % on the first, and four ranks' scratch rows would no longer fit the L2)
NATIVE_PIECE = 128 << 10
# the scratch's rows (a piece of each peer's) together, so that on 5-8 ranks they still
# fit a 512 KiB L2 beside the output piece: the piece shrinks to this ÷ (n - 1)
NATIVE_SCRATCH = 384 << 10


def native_piece(n: int, item: int) -> int:
    """Bytes of each peer's row the compiled loop moves at a time on ``n`` ranks:
    :data:`NATIVE_PIECE`, shrunk to whole pages so that the ``n - 1`` rows of the
    scratch fit :data:`NATIVE_SCRATCH`, in whole items of ``item`` bytes."""
    per = max(4096, min(NATIVE_PIECE, NATIVE_SCRATCH // (n - 1)) & ~4095)
    return max(item, per // item * item)


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
    nbytes = count * itemsize
    measured = direct.measured.get(nbytes.bit_length())  # ll_crossover's, in its band
    if measured is not None:
        return measured
    least = direct.min_bytes if direct.min_bytes is not None else MIN_BYTES[n > 2]
    return nbytes >= max(least, 1)


class FoldOp(DirectOp):
    """A single-copy call that folds: the block's loop compiled where it can be."""

    __slots__ = ("op_code", "pids", "native")

    def __init__(self, ll: LL, direct: Direct, prog: Program, dt: DType, count: int,
                 op_code: int, root: int):
        super().__init__(ll, direct, prog, dt, count, op_code, root)
        self.op_code = op_code
        self.pids = [direct.pids.get(q, 0) for q in range(ll.n)]
        # the block's loop in one compiled call (AVG divides in Python; one rank copies)
        self.native = native.pushes() and native.folds(dt.code, op_code) and \
            not self.avg and ll.n > 1

    def _fold_native(self, own_row: np.ndarray, dst: np.ndarray, ins: list[int],
                     outs: list[int] | None, at: int) -> int:
        """The block's loop in one compiled call (``shm_native.fold_push``, pieces of
        :data:`NATIVE_PIECE`): every peer's row read from ``ins[q] + at``, the rank-order
        fold with ``own_row`` into ``dst``, each piece pushed to ``outs[q] + at`` (None:
        not pushed); the same reads, fold and writes as the Python loops, the same bits.
        0, or the failed move's status."""
        n, item = self.ll.n, own_row.itemsize
        piece = native_piece(n, item)
        s = self._scratch
        slots = (n - 1) * (piece + 4096)  # a page more a slot: _llc.c, PUSH_SLOT
        if s is None or s.dtype != np.uint8 or s.size < slots:
            s = self._scratch = np.empty(slots, np.uint8)
        status = native.fold_push(self.pids, ins, outs, self.order, self.ll.rank, own_row,
                                  dst, at, self.dtype.code, self.op_code, piece, s)
        if status:
            q, wrote = status >> 32, bool(status & WROTE)
            return q << 32 | self.direct.failed(q, status & 0xFFFF, wrote)
        return 0


class AllReduceOp(FoldOp):
    """The all-reduce: fold the own block of every rank's input, writing each folded
    piece into every peer's output too (the module's steps)."""

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
        me, b = self.ll.rank, self.bounds
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        addrs = self._publish_both(x, out, timeout)
        status = 0
        if b[me + 1] > b[me]:
            status = self._fold(x, out, red, addrs, b[me], b[me + 1])
        self._complete(status, timeout)

    def _fold(self, x: np.ndarray, out: np.ndarray, red: Reducer, addrs: list,
              lo: int, hi: int) -> int:
        """out[lo:hi] and every peer's = the rank-order fold of every rank's x[lo:hi]
        (``addrs``: every rank's input and output addresses), a piece at a time: 0, or the
        failed read's or write's status."""
        me, item, n = self.ll.rank, x.itemsize, self.ll.n
        own_row, dst = x[lo:hi], out[lo:hi]
        if self.native:
            return self._fold_native(own_row, dst, [a for a, _ in addrs],
                                     [o for _, o in addrs], lo * item)
        alias = np.may_share_memory(own_row, dst)  # in place
        via_tmp = alias and self.pos >= 2  # the own row is read after the first write
        acc_is_own = alias and not via_tmp
        step = max(1, PIECE // item)
        s = self._buffers(min(step, hi - lo), x.dtype)
        peers = [q for q in range(n) if q != me]
        for a in range(0, hi - lo, step):
            m = min(step, hi - lo - a)
            at = (lo + a) * item  # the piece's byte offset in every rank's buffers
            acc = s[1][:m] if via_tmp else dst[a:a + m]
            first = None
            for k, q in enumerate(self.order):
                if q == me:
                    v = own_row[a:a + m]
                else:
                    v = acc if k == 0 and not acc_is_own else s[0][:m]
                    e = self.direct.read(q, [(cma.address(v), addrs[q][0] + at, m * item)])
                    if e:
                        return q << 32 | e
                if k == 0:
                    first = v
                else:
                    red.combine(acc, first if k == 1 else acc, v)
            piece = dst[a:a + m]
            if via_tmp:
                piece[...] = acc
            if self.avg:
                red.postdivide(piece, n)
            src = cma.address(piece)
            for q in peers:  # the folded piece, from L2 into the peers' outputs
                e = self.direct.read(q, [(src, addrs[q][1] + at, m * item)], write=True)
                if e:
                    return q << 32 | e
        return 0


class ScatterOp(FoldOp):
    """The reduce-scatter: fold block ``block`` of every rank's input into the output,
    a peer's row read a piece at a time into a scratch (:mod:`ll_direct`'s steps)."""

    __slots__ = ()

    def __init__(self, ll: LL, direct: Direct, prog: Program, dt: DType, count: int,
                 op_code: int, root: int):
        super().__init__(ll, direct, prog, dt, count, op_code, root)
        self.run = self._scatter

    def _scatter(self, x: np.ndarray, out: np.ndarray, red: Reducer, timeout: float) -> None:
        order = self.order
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        addrs = self._publish(x, timeout)
        item = x.itemsize
        lo_b = self.block * self.count
        mine = x[lo_b:lo_b + self.count]
        if self.native:
            status = self._fold_native(mine, out, addrs, None, lo_b * item) if \
                self.count else 0
            self._complete(status, timeout)
            return
        step = max(1, SCATTER_PIECE // item)
        scratch = self._buffers(min(step, self.count), x.dtype)
        alias = np.may_share_memory(mine, out)
        status = 0
        for lo in range(0, self.count, step):
            m = min(step, self.count - lo)
            status = self._piece(x, out, red, addrs, lo, m, scratch, alias, mine)
            if status:
                break
        if not status and self.avg:
            red.postdivide(out, len(order))
        self._complete(status, timeout)

    def _piece(self, x, out, red, addrs, lo: int, m: int, scratch, alias: bool,
               mine) -> int:
        """Fold elements ``lo:lo+m`` of every rank's block into ``out`` in rank order:
        0, or the failed read's status."""
        me, item = self.ll.rank, x.itemsize
        at = (self.block * self.count + lo) * item  # the piece's byte offset in an input
        own = mine[lo:lo + m]
        if alias:  # in place: out's piece is our own operand; keep it before writing out
            scratch[1][:m] = own
            own = scratch[1][:m]
        acc, first = out[lo:lo + m], None
        for k, q in enumerate(self.order):
            if q == me:
                operand = own
            else:
                operand = acc if k == 0 else scratch[0][:m]  # the first: straight into out
                e = self.direct.read(q, [(cma.address(operand), addrs[q] + at, m * item)])
                if e:
                    return q << 32 | e
            if k == 0:
                first = operand  # folded with the second, not copied first
            else:
                red.combine(acc, first if k == 1 else acc, operand)
        if len(self.order) == 1 and first is not acc:  # one rank: its block, as it is
            acc[...] = first
        return 0
