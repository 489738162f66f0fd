"""Collectives on registered buffers: every rank reads its peers' data where it lies.

A rank's registered memory is an arena of shared memory
(:mod:`ringtree.transports.shm_arena`, ``Communicator.empty``/``zeros``): its peers can
map it, so an all-reduce needs no staging. Per rank and call, for ``S`` bytes on ``n``
ranks (reads + writes), against the split through the LL segment
(:mod:`.ll_split`: 4 S on 2 ranks):

- all-reduce: fold block ``me`` of every rank's *input*, where it lies, in rank order
  into the own output block (S read, S/n written), then push it into block ``me`` of
  every peer's *output* (2 (n-1)/n S): 2.5 S on 2 ranks, the bound of
  ``benchmarks/cpu_peers.py``'s memory limit, and one synchronisation. Only rank ``me``
  reads or writes block ``me`` of any buffer, so in place no rank overwrites what
  another still folds;
- all-gather: copy every peer's input into the output, one synchronisation;
- reduce-scatter: fold block ``me`` of every input into the output, one synchronisation;
- broadcast: a rank but the root copies the root's buffer, one synchronisation.

The synchronisation is what lets a caller reuse its buffers: no rank returns while a
peer may still read or write them.

*Agreement.* Registration is each rank's own business, so a call may be mixed. Before
anything else a rank whose buffers are all registered writes, in its LL state line (not
in the parity lines, which a rank on the segment's path posts), the call's LL number,
where its input and output lie, and the call's header, then waits until each peer has
either done the same (registered) or posted or announced the call (a rank on the
ordinary path: on LL it posts after staging, on Simple it announces; neither waits for
anything first, so no wait here can deadlock). The marks are written before any post,
so a peer seen posted is registered exactly when its mark shows the call. Every rank
then knows the same set: all registered — the paths above; otherwise every registered
rank takes the ordinary path, as the unregistered ones already did. The call's LL
number is not taken by the agreement, so the ordinary path runs as if it had not been.

*Bits.* Every element is folded from the same operands in the same order as the
rank-order fold (``Reducer.combine``: a ufunc per pair, no fused multiply-add, no
reassociation), so the bits are those of every other path; a rank whose output block
is its input (in place) and comes third or later in the order folds through a scratch
piece.

*Compiled.* Where the kernel folds the dtype and op (every one but float16's; any
all-gather), the call after the agreement is one C entry, and on the buffers of the last
call the agreement too (:mod:`.ll_reg_kernel`); ``RINGTREE_LL_NATIVE=0`` or a build
without a compiler runs the same steps with NumPy, to the same bits.

*Failure.* The waits are the LL waits (liveness, timeout, doorbell when ranks outnumber
cores): a dead peer is named. A peer's memory stays mapped after it died, so a read of
it cannot fault; the next wait names the rank.
"""

from __future__ import annotations

from math import inf
from threading import get_ident

import numpy as np

from ringtree.dtypes import DType, parse_dtype
from ringtree.errors import MismatchError, RingtreeError
from ringtree.ir.program import Collective
from ringtree.ir.wire import PROTO_LL, WireHeader, algo_code
from ringtree.ops import ReduceOp, Reducer, resolve
from ringtree.runtime.plan import Desc
from ringtree.runtime.protocols import ll_reg_kernel as kernel_path
from ringtree.runtime.protocols.ll_entry import MISS, timeout_of
from ringtree.runtime.protocols.ll_reg_kernel import KernelPath
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_native as native
from ringtree.transports import shm_segment as seg
from ringtree.transports.shm_arena import Arena
from ringtree.transports.shm_ll import ANN_SEQ, SEQ_MASK

# state-line words (shm_ll uses 0-5): the call's LL number, input and output location
# words (shm_arena.Arena.locate), the call's header (three words)
REG_SEQ, REG_IN, REG_OUT, REG_HEAD = 8, 9, 10, 11
# smallest call (bytes of the larger buffer) run on registered buffers, by (collective,
# more than 2 ranks); below, the segment's one-entry paths (in C) cost less than this
# path's two synchronisations (the agreement and the last): where registered buffers
# were ahead of plain ones in two or three alternated runs of benchmarks/ll_reg.py with
# the compiled entry (loaded host; "more" measured on 4 ranks on 2 cores;
# docs/design-notes.md)
MIN_BYTES = {(Collective.ALL_REDUCE, False): 256 << 10, (Collective.ALL_REDUCE, True): 256 << 10,
             (Collective.ALL_GATHER, False): 4 << 20, (Collective.ALL_GATHER, True): 2 << 20,
             (Collective.REDUCE_SCATTER, False): 512 << 10,
             (Collective.REDUCE_SCATTER, True): 1 << 20,
             (Collective.BROADCAST, False): 512 << 10, (Collective.BROADCAST, True): 2 << 20}
PIECE = 256 << 10       # bytes folded at a time when the fold keeps an accumulator
SKIP = (ReduceOp.AVG, ReduceOp.PREMUL_SUM)
ALGO = algo_code("registered (in place)")


def of(comm, create: bool = True):
    """The communicator's :class:`Registered` (made on first use), or None when its
    ranks do not share an LL segment."""
    runner = comm.ll
    if runner is None:
        return None
    if runner.reg is None and create:
        runner.reg = Registered(runner)
        comm.fabric.closers.append(runner.reg.arena.close)
    return runner.reg


# from these bytes a 2-rank all-reduce runs NumPy's steps instead of the kernel's entry:
# NumPy's adds (dispatched to the CPU's widest vectors) fold faster than the kernel's
# loops (built for the baseline x86-64) once the rows leave L2; quiet host, 2 ranks
# pinned, alternated in one job (benchmarks/ll_reg.py, three runs), NumPy's time over the
# kernel's: 1 MiB 1.07-1.14, 2 MiB 0.97, 4 MiB 0.87-0.91, 8 MiB 0.75-0.79, 16 MiB
# 0.81-0.84, 64 MiB 0.88-0.93; 4 ranks on 2 cores, where the entry's waits matter more,
# the kernel was ahead or level at every size (4 MiB 0.71x NumPy's time)
NUMPY_FOLD_FROM = 4 << 20


def _numpy_folds(coll: Collective, n: int, nbytes: int) -> bool:
    """Does this call fold with NumPy's steps rather than the kernel's entry?"""
    return coll is Collective.ALL_REDUCE and n == 2 and nbytes >= NUMPY_FOLD_FROM


class RegOp:
    """One call shape: what ``LLRunner.run_arrays`` needs (name, desc, coll, run)."""

    __slots__ = ("name", "coll", "desc", "head", "run", "describe", "k", "root")

    def __init__(self, coll: Collective, dt: DType, count: int, red: Reducer | None, run,
                 ll, root: int = 0):
        self.name, self.coll, self.run, self.root = coll.value, coll, run, root
        code = red.code if red is not None else 0
        # the compiled entry (Round.reg: the data path and the synchronisations after the
        # agreement), or None: RINGTREE_LL_NATIVE=0, no compiler, a fold it does not do
        self.k = native.make_round(ll, (0, 0), 0, ((), ()), 0, dt.code, code) if \
            native.enabled() and (red is None or native.folds(dt.code, code)) and \
            not _numpy_folds(coll, ll.n, count * dt.storage.itemsize) else None
        if self.k is not None:  # where its agreement marks and reads (Registered._fast)
            self.k.reg_words(ll.my_state, [st for _, st in ll.peer_state],
                             (REG_SEQ, REG_IN, REG_OUT, REG_HEAD, ANN_SEQ))
        self.desc = Desc(self.name, count, dt.value, dt.code, red.name if red else "-",
                         code, root, 0, "registered", coll.code, PROTO_LL)
        self.head = WireHeader(0, count, 0, ALGO, coll.code, dt.code, code, PROTO_LL,
                               root).call_words()
        text = f"{self.name}(count={count}, {dt.value}, registered buffers)"
        self.describe = lambda: text


class Registered(KernelPath):
    """A communicator's registered memory and the calls that read it in place."""

    def __init__(self, runner):
        ll = self.ll = runner.ll
        self.runner = runner
        tag = ll.seg.name[len(seg.PREFIX):].split("-")[0]
        me = ll.peers[ll.rank]
        self.arena = Arena(tag, ll.rank, me.pid, me.ns)
        self.min_bytes = {c: MIN_BYTES[(c, ll.n > 2)] for c in (
            Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
            Collective.BROADCAST)}
        self.ops: dict[tuple, RegOp] = {}
        self._reds: dict[tuple, tuple] = {}  # (NumPy dtype, op as called) -> DType, Reducer
        self.locs: tuple = ()
        # the last call's (key, Round.reg's arguments, the peers' locations, flattened)
        self._args: tuple = (None, None, ())
        self._xa = self._oa = 0  # this call's input and output addresses
        self.code: tuple | None = None  # (answer, s) of an entry that made the agreement
        self.current: RegOp | None = None
        self.in_place = False
        self._scratch = np.empty(0, np.uint8)

    @property
    def min_bytes(self) -> dict:
        """The smallest call run on registered buffers, by collective (bytes of the
        larger buffer)."""
        return self._min_bytes

    @min_bytes.setter
    def min_bytes(self, sizes: dict) -> None:
        self._min_bytes = dict(sizes)
        # the hooks' test before :meth:`call` (which decides exactly), so that a small
        # call does not pay for its frame: an all-reduce's bytes, and ranks x an
        # all-gather's or reduce-scatter's input bytes (at least its larger buffer)
        never = self.ll.n == 1
        self.floor_all_reduce = inf if never else sizes[Collective.ALL_REDUCE]
        self.floor_blocks = inf if never else min(sizes[Collective.ALL_GATHER],
                                                  sizes[Collective.REDUCE_SCATTER],
                                                  sizes[Collective.BROADCAST])

    # ---- the call --------------------------------------------------------------------

    def call(self, comm, coll: Collective, x: np.ndarray, out, op, timeout):
        """Run the call on registered buffers when every rank's are; :data:`MISS` (the
        ordinary path) otherwise. Collective when this rank's buffers are registered."""
        runner, ll = self.runner, self.ll
        if max(x.nbytes, out.nbytes if type(out) is np.ndarray else 0) < \
                self.min_bytes[coll] or comm._group is not None or runner.pending or \
                comm.health.broken is not None or comm._closed or comm.executor.busy or ll.n == 1:
            return MISS  # (the size first: every rank's answer is the same)
        t = timeout_of(timeout)
        words = self._locate(coll, x, out)
        root = 0
        if coll is Collective.BROADCAST:  # (``op`` is the root)
            root, op = op, None
            if type(root) is not int or not 0 <= root < ll.n:
                return MISS  # the ordinary path refuses it
        if words is None:
            return MISS
        try:
            dt, red = self._reds[(x.dtype, op)]
        except (KeyError, TypeError):  # (TypeError: an op that does not hash)
            try:
                dt = parse_dtype(x.dtype)
                red = resolve(op, dt) if coll.reduces else None
            except (TypeError, ValueError):
                return MISS  # the ordinary path refuses it on every rank
            if red is None or red.user is None:
                self._reds[(x.dtype, op)] = dt, red
        count = x.size if coll is not Collective.REDUCE_SCATTER else x.size // ll.n
        if (red is None) is coll.reduces or (red is not None and (red.user is not None or
                                                                 red.op in SKIP)):
            return MISS
        if comm._owner.ident != get_ident() and not comm.background:
            comm._owner.check(comm.rank)
        key = (coll, dt, count, red, root)
        rop = self.ops.get(key)
        if rop is None:
            run = {Collective.ALL_REDUCE: self._all_reduce, Collective.ALL_GATHER:
                   self._all_gather, Collective.BROADCAST: self._broadcast}.get(
                       coll, self._scatter)
            rop = self.ops[key] = RegOp(coll, dt, count, red, run, ll, root)
        self.current, self.code, tt = rop, None, comm.timeout if t is None else t
        try:
            locs = self._fast(rop, words, tt)
            if locs is False:
                self._mark(rop, words)
                locs = self._learn(rop, words, tt, True)
        except RingtreeError as err:
            raise comm._on_error(err) from None
        if locs is None:
            return MISS
        if locs is not True:
            self.locs = locs
        comm.seq += 1
        result = x if out is None else out
        st = dt.storage  # (bfloat16: its uint16 bits)
        return runner.run_arrays(comm, rop, x.reshape(-1).view(st),
                                 result.reshape(-1).view(st), red, result, None, comm.seq,
                                 False, t)

    def _locate(self, coll: Collective, x: np.ndarray, out) -> tuple[int, int] | None:
        """This rank's (input, output) location words, or None when its buffers are not
        both registered, contiguous and shaped for ``coll``; sets :attr:`in_place`."""
        if out is None and coll is Collective.ALL_REDUCE:
            out = x
        if type(out) is not np.ndarray or not x.flags.c_contiguous or \
                not out.flags.c_contiguous or not out.flags.writeable or out.dtype != x.dtype:
            return None
        a, n, me = self.arena, self.ll.n, self.ll.rank
        self._xa, self._oa = cma.address(x), cma.address(out)
        wi, wo = a.locate(x, self._xa), a.locate(out, self._oa)
        if wi < 0 or wo < 0:
            return None
        if coll is Collective.ALL_REDUCE or coll is Collective.BROADCAST:
            fits, same = out.size == x.size, wi == wo
        elif coll is Collective.ALL_GATHER:
            fits, same = out.size == n * x.size, wi == wo + me * x.nbytes
        else:
            fits, same = x.size == n * out.size, wo == wi + me * out.nbytes
        if not fits or (not same and np.may_share_memory(x, out)):
            return None
        self.in_place = same
        return wi, wo

    def _mark(self, rop: RegOp, words: tuple[int, int]) -> None:
        """Mark this call registered in the state line: locations, header, number."""
        ll, W = self.ll, self.ll.W
        s = ll.seq + 1
        k = ll.my_state
        h = rop.head
        W[k + REG_IN], W[k + REG_OUT] = words
        W[k + REG_HEAD], W[k + REG_HEAD + 1], W[k + REG_HEAD + 2] = \
            h[0], h[1] | (s & SEQ_MASK), h[2]
        seg.fence()
        W[k + REG_SEQ] = s
        seg.fence()  # our mark before their sleep flags (Dekker with LL._sleep)

    def _learn(self, rop: RegOp, words: tuple[int, int], t: float, busy: bool) -> tuple | None:
        """After :meth:`_mark`, learn the peers' choice: every rank's (input, output)
        words when all are registered, else None (``busy``: spin and yield first, as
        the kernel did not)."""
        ll, W = self.ll, self.ll.W
        s = ll.seq + 1
        k = ll.my_state
        for r, j in ll.peer_sleep:
            if W[j]:
                seg.ring_bell(ll.peer_bells[r])
        locs: list = [None] * ll.n
        locs[ll.rank] = words
        plain = False
        for r, st in ll.peer_state:
            line = ll.seq_word(r, s & 1)

            def done(st=st, line=line) -> bool:
                return W[st + REG_SEQ] == s or W[line] >= s or W[st + ANN_SEQ] >= s
            if not done():
                ll._wait(r, done, s, t, rop.describe, None, busy)
            if W[st + REG_SEQ] != s:  # read after what done() saw: a mark came first
                plain = True
                continue
            mine, theirs = W[k + REG_HEAD:k + REG_HEAD + 3], W[st + REG_HEAD:st + REG_HEAD + 3]
            if mine != theirs:
                raise MismatchError(ll._mismatch(r, mine, theirs, s, rop.describe))
            locs[r] = (int(W[st + REG_IN]), int(W[st + REG_OUT]))
        return None if plain else tuple(locs)

    def _sync(self, rop: RegOp, t: float) -> None:
        self.ll.parity(t, rop.describe)
        self.ll.sync(rop.head, t, rop.describe)

    def _peer(self, q: int, word: int, dtype: np.dtype, count: int) -> np.ndarray:
        info = self.ll.peers[q]
        try:
            return self.arena.peer(q, info.pid, info.ns, word, dtype, count)
        except (OSError, TypeError) as e:
            raise RingtreeError(f"rank {self.ll.rank} cannot map rank {q}'s registered "
                                f"buffer: {e}") from None

    # ---- the paths -------------------------------------------------------------------

    def _all_reduce(self, x: np.ndarray, out: np.ndarray, red: Reducer, t: float) -> None:
        n, me, rop = self.ll.n, self.ll.rank, self.current
        if rop.k is not None:
            self._native(x, out, t)
            return
        m = x.size
        lo, hi = me * m // n, (me + 1) * m // n
        rows = [x[lo:hi] if q == me else self._peer(q, self.locs[q][0], x.dtype, m)[lo:hi]
                for q in range(n)]
        mine = out[lo:hi]
        self._fold(rows, mine, red, self.in_place and me >= 2)
        copy = cma.stream if kernel_path.pushes_stream(n, out.nbytes) else np.copyto
        for q in range(n):  # pushed: only this rank reads or writes block me anywhere
            if q != me and hi > lo:
                copy(self._peer(q, self.locs[q][1], x.dtype, m)[lo:hi], mine)
        self._sync(rop, t)

    def _all_gather(self, x: np.ndarray, out: np.ndarray, red, t: float) -> None:
        if self.current.k is not None:
            self._native(x, out, t)
            return
        me, c = self.ll.rank, x.size
        copy = cma.stream if out.nbytes >= kernel_path.STREAM_MIN else np.copyto
        for q in range(self.ll.n):
            if q != me and c:
                copy(out[q * c:(q + 1) * c], self._peer(q, self.locs[q][0], x.dtype, c))
        if not self.in_place:
            copy(out[me * c:(me + 1) * c], x)
        self._sync(self.current, t)

    def _broadcast(self, x: np.ndarray, out: np.ndarray, red, t: float) -> None:
        rop = self.current
        if rop.k is not None:
            self._native(x, out, t)
            return
        if self.ll.rank != rop.root and x.size:  # copy the root's buffer where it lies
            copy = cma.stream if x.nbytes >= kernel_path.STREAM_MIN else np.copyto
            copy(x, self._peer(rop.root, self.locs[rop.root][0], x.dtype, x.size))
        self._sync(rop, t)

    def _scatter(self, x: np.ndarray, out: np.ndarray, red: Reducer, t: float) -> None:
        if self.current.k is not None:
            self._native(x, out, t)
            return
        n, me, c = self.ll.n, self.ll.rank, out.size
        rows = [x[me * c:(me + 1) * c] if q == me else
                self._peer(q, self.locs[q][0], x.dtype, n * c)[me * c:(me + 1) * c]
                for q in range(n)]
        self._fold(rows, out, red, self.in_place and me >= 2)
        self._sync(self.current, t)

    def _fold(self, rows: list, dst: np.ndarray, red: Reducer, alias: bool) -> None:
        """dst = ((rows[0] ⊕ rows[1]) ⊕ rows[2]) ⊕ …, a piece at a time when an
        accumulator is kept (3+ rows, bfloat16); through a scratch piece when ``dst``
        is a row read after the first two (``alias``)."""
        m = dst.size
        if len(rows) == 2 and red.dtype is not DType.BFLOAT16:
            red.combine(dst, rows[0], rows[1])
            return
        step = max(1, PIECE // dst.itemsize)
        tmp = None
        if alias:
            if self._scratch.dtype != dst.dtype or self._scratch.size < min(step, m):
                self._scratch = np.empty(min(step, m), dst.dtype)
            tmp = self._scratch
        for lo in range(0, m, step):
            hi = min(m, lo + step)
            d = dst[lo:hi] if tmp is None else tmp[:hi - lo]
            red.combine(d, rows[0][lo:hi], rows[1][lo:hi])
            for r in rows[2:]:
                red.combine(d, d, r[lo:hi])
            if tmp is not None:
                dst[lo:hi] = d


__all__ = ["MIN_BYTES", "Registered", "of"]
