"""All-gather, reduce-scatter and broadcast with one copy: peers read each other's
*user buffers* with ``process_vm_readv(2)`` (Linux cross-memory attach), synchronised
through the LL segment's lines.

Through the shared segment an all-gather copies every contribution twice — its owner
writes it into a cell, every peer copies it out (:mod:`ll_gather`) — and streams it
through the cells, one synchronisation per cell. Open MPI's shared-memory BTL copies
once, from the owner's buffer into the reader's, through the kernel (``opal/mca/smsc/cma``);
so does this path. One call:

1. publish: the rank writes its buffer's address into its line's inline payload and posts
   the call (:meth:`~ringtree.transports.shm_ll.LL.sync`: every rank's header is checked,
   a dead peer is named, nothing is spun on when ranks outnumber cores);
2. read: all-gather — every peer's contribution straight into its block of the output
   (one system call per peer, :mod:`ringtree.transports.shm_cma`, GIL released), the own
   block copied in step 3 between the post and the wait, with streaming stores from
   :data:`STREAM_MIN`; from blocks over :data:`SHARE_PIECE` (2-8 ranks), the copies
   shared instead (:meth:`DirectOp._shared`: pieces drawn from counters in the lines, an
   early rank writing its input into a late rank's output with ``process_vm_writev``,
   peers taken as they post, the own block copied while none has); reduce-scatter
   (:class:`~ringtree.runtime.protocols.ll_direct_fold.ScatterOp`) — block ``r`` of every
   peer's input, a cache-sized piece at a time, folded into the output in the Program's
   rank order (the same operands in the same order as the segment's path: the same
   bits; ``Reducer.combine``, no fused multiply-add; the loop compiled where the kernel
   folds the pair); broadcast — every rank but the root reads the root's buffer;
3. complete: a second synchronisation whose payload is the rank's read status. It is
   what lets a rank's buffer be reused: no rank returns before every peer has read it.
   A failed read is reported there, so every rank raises (naming the rank that could
   not read and the one it read from) instead of waiting for it.

A peer that died is named: before it posts, by the LL wait's liveness check; during the
read, by ``ESRCH``. A read only ever writes the output (all-gather: the blocks of the
peers; reduce-scatter: a scratch buffer, then the output's piece), never an input, so a
failure leaves the inputs as they were.

Whether it may run is probed once per communicator (:mod:`ll_direct_probe`). Where the
kernel is built, a call's two synchronisations and its moves are one C entry
(:mod:`ll_direct_entry`) that runs these steps; they run in Python for what it leaves
(shared and bounced copies) and after it hands a call back (a peer late).

Where it runs: from :data:`MIN_BYTES` (the larger buffer; ``RINGTREE_CMA_MIN``), where it
was measured faster than the path it replaces on this machine (``docs/design-notes.md``,
"Single-copy all-gather, reduce-scatter and broadcast"): ``process_vm_readv`` moves
5-9 GB/s here against 15-30 for a warm ``memcpy`` (``benchmarks/cma_copy.py``), so it
wins once the staged path's second copy costs more than the kernel's pinning. Below, in
the octaves :mod:`~ringtree.runtime.protocols.ll_crossover` measures on the communicator
(from 8 KiB on 2 ranks), as measured: with the C entry about half the segment's time at
64 KiB on an Intel Xeon host.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from ringtree.dtypes import DType
from ringtree.errors import PeerError, RingtreeError
from ringtree.ir.program import Collective, Program
from ringtree.ir.wire import PROTO_LL, WireHeader, algo_code
from ringtree.ops import ReduceOp
from ringtree.runtime.plan import Desc
from ringtree.runtime.protocols.ll import one_shot
from ringtree.transports import shm_cma as cma
from ringtree.transports.shm_ll import LL
from ringtree.tuning.proto import THRESHOLDS

__all__ = ["MIN_BYTES", "Direct", "DirectOp"]

# the larger buffer's bytes from which the direct path runs, by (collective, ranks > 2),
# measured against the segment's paths and Simple in the same processes
# (benchmarks/ll_direct.py): above LL's range on every count. All-gather, 2 ranks: LL's
# one C call with streamed stores was 0.6-0.9x the single copy's time from 512 KiB to
# 4 MiB; reduce-scatter: Simple's ring took 2-4x longer; broadcast, 2 ranks, its C entry
# against Simple's pipeline (alternated jobs, an Intel Xeon host): 1 MiB 52-70 µs
# against 212-245, 4 MiB a tie (on another host, before the entry: a tie at 2 MiB)
MIN_BYTES: dict[tuple[Collective, bool], int] = {
    (c, more): THRESHOLDS[c][more] + 1 for more in (False, True) for c in (
        Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST)}
# all-gather output bytes from which the own block is copied with streaming stores (as
# LL's gather in transports/_llc.c): 0.81-0.87x the call's CPU time at 8-64 MiB on 2
# ranks, a tie at 4.5 MiB, where the output may still serve the caller from the caches;
# and from which the peers' blocks (a broadcast's buffer) are read bounced through an
# L2 scratch and streamed on (shm_cma.read_spans: no read for ownership either). 2 ranks,
# alternated in one job (benchmarks/ll_direct.py's "unbounced" arm), straight ÷ bounced:
# 8 MiB 1.06-1.12, 12 MiB 1.14, 16 MiB 1.16-1.20, 32 MiB 1.13, 64 MiB 1.11
STREAM_MIN = 8 << 20
# a broadcast's bytes from which its read bounces: the last-level cache's. Its reader's
# and root's buffers are all the memory it touches; up to 12 MiB they stayed in a 16 MiB
# L3, where the straight read was faster (bounced ÷ straight 1.30-1.37 at 8 MiB, 1.28 at
# 12 MiB; 16 MiB 0.94-0.96, 32 MiB 0.94, 64 MiB 0.90); on a host reporting 480 MiB the
# straight read (the C entry) won at 16 and 32 MiB (1,192-1,283 µs against 1,610-1,630;
# 2,609-2,760 against 2,987-3,152) and tied at 64 MiB
BOUNCE_BROADCAST = cma.last_level_cache(16 << 20)
PID, ADDR, TOKEN = 0, 1, 2  # words of a line's inline payload
# the all-gather's shared copies (DirectOp._shared): the output's address (the word
# ll_direct_fold's all-reduce posts it in too), and from COUNT on one piece counter per peer
# the rank reads from (a line's inline payload holds 12 words)
OUT, COUNT = 3, 4
SHARE_MAX = 8       # ranks up to which the all-gather shares its reads (12 - COUNT)
# bytes a claim copies (16 pieces of an 8 MiB block): 2 ranks, 8-64 MiB, alternated in
# one job on a loaded host: 256 KiB, 1 MiB and 2 MiB 1.02-1.14x its time; 4 ranks on 2
# cores within 5 % of it
SHARE_PIECE = 512 << 10
WROTE = 1 << 16     # a read status's flag: the failed call was a write (process_vm_writev)
# the headers' algorithm: a rank that took the segment's path for the same call (other
# settings) is a MismatchError naming both, not a read of what its line holds
ALGO_CODE = algo_code("direct (single copy)")  # encoded here: every rank can name it


def payload_word(ll: LL, rank: int, parity: int) -> int:
    """Word index of ``rank``'s inline payload in parity ``parity``'s line."""
    return ll.area(rank, parity, 8)[0] // 8


class Direct:
    """A communicator's permission to read its peers: their pids, where the path runs."""

    def __init__(self, ll: LL, min_bytes: int | None):
        self.ll = ll
        self.pids = {r: info.pid for r, info in ll.peers.items() if r != ll.rank}
        self.min_bytes = min_bytes
        # the all-reduce's choice by octave of bytes (bit_length), where it was measured
        # on this communicator (ll_crossover): True for the single copy
        self.measured: dict[int, bool] = {}
        # the all-gather's, by octave of output bytes (True: the single copy; False: the
        # segment's streamed gather, which the planner then takes on LL at any size)
        self.measured_gather: dict[int, bool] = {}
        # and by the same octaves, where its single copy reads each peer's block straight
        # into the output (one process_vm_readv a peer, Intel MPI's way) instead of in
        # shared, bounced pieces (measured too: which wins depends on the callers' pages);
        # unmeasured octaves: straight on 2 ranks
        self.straight_gather: dict[int, bool] = {}
        self.measured_scatter: dict[int, bool] = {}  # the reduce-scatter's, by octave
        self.measured_bcast: dict[int, bool] = {}  # the broadcast's, by octave
        self._measured = {Collective.ALL_GATHER: self.measured_gather,
                          Collective.REDUCE_SCATTER: self.measured_scatter,
                          Collective.BROADCAST: self.measured_bcast}
        # 2 ranks: the all-gather pushes above LL's range too (DirectOp.push); None until
        # the ranks agree on it (ll_crossover), then the same on every rank
        self.push_large: bool | None = None
        self.straight_default = ll.n == 2
        self.share = cma.can_claim()  # shared copies (RINGTREE_CMA_SHARE; an atomic add)
        self.scratch = cma.bounce_buffer()  # bounced reads of large outputs (STREAM_MIN)

    def applies(self, coll: Collective, count: int, itemsize: int, op_code: int) -> bool:
        """Run a call of ``count`` elements a block directly? (From :data:`MIN_BYTES` of
        its larger buffer; in an octave measured on this communicator, as measured.)"""
        table = self._measured.get(coll)
        if table is None or coll is Collective.REDUCE_SCATTER and \
                op_code == ReduceOp.PREMUL_SUM.code:  # (its factor is each rank's own)
            return False
        nbytes = count * itemsize * (1 if coll is Collective.BROADCAST else self.ll.n)
        if self.min_bytes is not None:
            return nbytes >= max(self.min_bytes, 1)
        measured = table.get(nbytes.bit_length())
        return nbytes >= MIN_BYTES[(coll, self.ll.n > 2)] if measured is None else measured

    def gather_measured(self, nbytes: int) -> bool | None:
        """What :mod:`~ringtree.runtime.protocols.ll_crossover` measured for an all-gather
        of ``nbytes`` of output (True: the single copy; False: the segment's streamed
        gather), or None."""
        return self.measured_gather.get(nbytes.bit_length())

    def claim(self, peer: int, index: int, local: int, remote: int, nbytes: int,
              write: bool, bounce: bool = False) -> tuple[int, int]:
        """:func:`~ringtree.transports.shm_cma.claim` with ``peer``: (errno or 0, pieces
        copied); ESRCH raises, naming it. ``bounce``: a read through :attr:`scratch`."""
        try:
            return 0, cma.claim(self.pids[peer], self.ll.W, index, local, remote, nbytes,
                                SHARE_PIECE, write, self.scratch if bounce else None)
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise PeerError(peer, f"rank {peer} died (pid {self.pids[peer]} is gone) "
                                      f"while rank {self.ll.rank} copied its part of a "
                                      "shared copy") from None
            return e.errno or errno.EIO, 0

    def read(self, peer: int, spans: list[tuple[int, int, int]], write: bool = False,
             bounce: bool = False) -> int:
        """Read ``spans`` from ``peer`` (``write``: write them into it; ``bounce``: read
        through :attr:`scratch`, :func:`~ringtree.transports.shm_cma.read_spans`): 0, or
        the errno (| :data:`WROTE` for a write; ESRCH raises, naming it)."""
        try:
            if write:
                cma.write_spans(self.pids[peer], spans)
            else:
                cma.read_spans(self.pids[peer], spans, scratch=self.scratch if bounce else None)
        except OSError as e:
            return self.failed(peer, e.errno or errno.EIO, write)
        return 0

    def failed(self, peer: int, err: int, write: bool) -> int:
        """A failed move with ``peer``: ESRCH raises, naming it; else the status bits
        (``err`` | :data:`WROTE` for a write)."""
        if err == errno.ESRCH:
            raise PeerError(peer, f"rank {peer} died (pid {self.pids[peer]} is gone) "
                                  f"while rank {self.ll.rank} "
                                  f"{'wrote into' if write else 'read'} its buffer") from None
        return err | (WROTE if write else 0)


class DirectOp:
    """One call shape on the direct path; ``run(x, out, reducer, timeout)`` runs it (the
    :class:`~ringtree.runtime.protocols.ll.LLOp` interface the LL runner calls)."""

    __slots__ = ("ll", "direct", "coll", "count", "nbytes", "dtype", "name", "desc", "head",
                 "order", "block", "avg", "root", "run", "hot", "rec", "_scratch", "_words",
                 "pieces", "queued_entry", "push")
    paired = True   # two LL calls a call (the hot paths: ll_entry.enter, ll_hot)
    premul = False  # (ll_entry.scaled: a one-rank PREMUL_SUM never runs here)

    def __init__(self, ll: LL, direct: Direct, prog: Program, dt: DType, count: int,
                 op_code: int, root: int):
        shape = one_shot(prog)
        coll = prog.collective
        self.ll, self.direct, self.coll, self.count, self.dtype = ll, direct, coll, count, dt
        self.nbytes = count * dt.storage.itemsize  # one block
        self.name = coll.value
        opname = list(ReduceOp)[op_code].value if coll.reduces and op_code < 255 else \
            "user" if coll.reduces else "-"
        self.desc = Desc(self.name, count, dt.value, dt.code, opname, op_code, root, 0,
                         prog.algo, coll.code, PROTO_LL)
        self.head = WireHeader(0, count, 0, ALGO_CODE, coll.code, dt.code, op_code, PROTO_LL,
                               root).call_words()
        self.order, self.block = shape.order, shape.block
        self.avg = op_code == ReduceOp.AVG.code
        self.root = root
        self.hot = self.rec = None  # the C entry (ll_direct_entry.prepare) and its recorder
        self.queued_entry = None  # a queued call's C entry, if it has one (ll_runner)
        self.pieces = (0, 0)  # the last shared all-gather's pieces: read, written for peers
        self._scratch: np.ndarray | None = None
        # every rank's inline payload word, by parity
        self._words = tuple([payload_word(ll, q, p) for q in range(ll.n)] for p in (0, 1))
        # (the reduce-scatter and the all-reduce: ll_direct_fold's subclasses)
        self.run = self._gather if coll is Collective.ALL_GATHER else self._broadcast
        # an all-gather pushes (_push) below LL's range on 2 ranks, or on more for blocks of
        # at most a piece; on 2 ranks above it too where agreed (Direct.push_large). Decided
        # once: the C entry's mode and these steps must be the same on every rank
        n, nb = ll.n, self.nbytes
        self.push = coll is Collective.ALL_GATHER and (
            nb * n < MIN_BYTES[(Collective.ALL_GATHER, n > 2)] and (n == 2 or nb <= SHARE_PIECE)
            or n == 2 and bool(direct.push_large))

    def describe(self) -> str:
        return f"{self.name}(count={self.count}, {self.dtype.value}, proto=LL, single copy)"

    # ---- the two synchronisations ------------------------------------------------------

    def _publish(self, x: np.ndarray, timeout: float, out: int = 0) -> list[int]:
        """Post ``x``'s address (and ``out``, the output's, with zeroed piece counters,
        if given); every rank's address of ``x`` once all have."""
        return [int(self.ll.W[i + ADDR]) for i in self._posted(x, timeout, out)]

    def _posted(self, x: np.ndarray, timeout: float, out: int = 0) -> list[int]:
        """:meth:`_publish`'s post and wait; every rank's payload word."""
        ll, W = self.ll, self.ll.W
        words = self._words[ll.parity(timeout, self.describe)]
        i = words[ll.rank]
        W[i + ADDR] = cma.address(x)
        if out:
            W[i + OUT] = out
            for c in range(i + COUNT, i + COUNT + ll.n):
                W[c] = 0
        ll.sync(self.head, timeout, self.describe)
        return words

    def _complete(self, status: int, timeout: float, meanwhile=None) -> None:
        """Post this rank's read status (0, or peer << 32 | errno) and wait until every
        rank has finished reading; raise on every rank if one's read failed.
        ``meanwhile()`` runs between the post and the wait (work that needs no peer)."""
        ll = self.ll
        ll.W[self._words[ll.parity(timeout, self.describe)][ll.rank]] = status
        mine = ll.post(self.head)
        if meanwhile is not None:
            meanwhile()
        self._statuses(ll.collect(mine, timeout, self.describe))

    def _statuses(self, p: int) -> None:
        """Raise if a rank posted a failed move in parity ``p``'s line (every rank
        raises: every rank reads every status)."""
        W = self.ll.W
        for r, i in enumerate(self._words[p]):
            s = int(W[i])
            if s:
                q, e = s >> 32, s & 0xFFFF
                raise RingtreeError(f"rank {r} could not {'write into' if s & WROTE else 'read'}"
                                    f" rank {q}'s buffer in {self.describe()}: {os.strerror(e)}")

    # ---- the calls -------------------------------------------------------------------

    def _gather(self, x: np.ndarray, out: np.ndarray, red, timeout: float) -> None:
        nb, me = self.nbytes, self.ll.rank
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        base = cma.address(out)
        own = None
        if cma.address(x) != base + me * nb:  # not in place: the own block while peers read
            own = self._own_copy(x, out[me * self.count:(me + 1) * self.count])
        straight = self.straight()
        if self.push:
            status = self._push(x, base, timeout)
        elif self.shares(straight):
            status, own = self._shared(x, base, own, timeout)
        else:
            status = self._reads(self._publish(x, timeout), base, straight)
        self._complete(status, timeout, own)

    def straight(self) -> bool:
        """Does the all-gather read each peer's block straight (else in shared, bounced
        pieces)? Its octave's measured mode, read at each call (the measuring switches
        it between its arms), else :attr:`Direct.straight_default`."""
        d = self.direct
        return d.straight_gather.get((self.nbytes * self.ll.n).bit_length(),
                                     d.straight_default)

    def shares(self, straight: bool) -> bool:
        """Does a call that does not push share its copies (:meth:`_shared`)?"""
        d, n = self.direct, self.ll.n
        return not straight and d.share and 2 <= n <= SHARE_MAX and \
            self.nbytes > SHARE_PIECE and cma.can_claim()

    def _reads(self, addrs: list[int], base: int, straight: bool) -> int:
        """Every peer's block read into the output at ``base`` (``addrs``: every rank's
        input): the status, 0 or peer << 32 | errno."""
        ll, nb, me = self.ll, self.nbytes, self.ll.rank
        for q in range(ll.n):
            if q != me and nb:
                dst = base + q * nb
                # straight where the peer's input and our block share their offset in a
                # cache line, or where offsets cost the kernel's copy nothing: on a Zen 3
                # host rep movsb took 2.4-2.7x as long across offsets
                bounce = nb * ll.n >= STREAM_MIN and not (straight and (
                    (addrs[q] - dst) % 64 == 0 or not cma.offsets_matter()))
                e = self.direct.read(q, [(dst, addrs[q], nb)], bounce=bounce)
                if e:
                    return q << 32 | e
        return 0

    def _push(self, x: np.ndarray, base: int, timeout: float) -> int:
        """Where :attr:`push` (below LL's own range, where the single copy runs only
        where it was measured faster, :mod:`~ringtree.runtime.protocols.ll_crossover`, on
        2 ranks, or on more for blocks of at most a piece, larger ones being shared,
        :meth:`_shared`; on 2 ranks above it where the ranks agreed): the rank
        writes its input into its block of every peer's output, one
        ``process_vm_writev`` a peer, from its own (cache-warm) input. On an Intel Xeon
        host, 2 ranks, alternated in one job, a 1 MiB all-gather's write and own copy
        took 38-41 µs where the read and own copy took 57-70; 4 MiB 304-318 against
        358-362; 64 and 256 KiB level. The status: 0, or peer << 32 | errno | WROTE."""
        return self._pushes(x, self._posted(x, timeout, base))

    def _pushes(self, x: np.ndarray, words: list[int]) -> int:
        """:meth:`_push`'s writes, every rank's words posted: the status."""
        ll, W, me, nb = self.ll, self.ll.W, self.ll.rank, self.nbytes
        src = cma.address(x)
        for k in range(1, ll.n):  # (a call runs here from 1 byte: applies)
            q = (me + k) % ll.n
            if e := self.direct.read(q, [(src, int(W[words[q] + OUT]) + me * nb, nb)],
                                     write=True):
                return q << 32 | e
        return 0

    def _shared(self, x: np.ndarray, base: int, own, timeout: float):
        """The all-gather's copies shared, peer by peer as they arrive: block ``q`` of
        rank ``r``'s output is cut into :data:`SHARE_PIECE` pieces drawn from a counter in
        ``r``'s line, by ``r`` reading from ``q`` and by ``q`` writing its input into
        ``r``'s output (``process_vm_writev``); so an early rank takes over part of a late
        one's copies and the two finish together, every piece copied once. A rank starts
        on each peer as soon as that peer has posted (no barrier first: with more ranks
        than cores, those running copy while the others wait for a core), and copies its
        own block (``own()``) while no peer is there. Returns the status (0, or peer << 32
        | errno) and ``own`` if it is still to run."""
        ll, W, me = self.ll, self.ll.W, self.ll.rank
        p = ll.parity(timeout, self.describe)
        words = self._words[p]
        i = words[me]
        W[i + ADDR], W[i + OUT] = cma.address(x), base
        for c in range(i + COUNT, i + COUNT + ll.n):
            W[c] = 0
        mine = ll.post(self.head)
        s, status, done = ll.seq, 0, [0, 0]
        pending = sorted(ll.peer_seq[p], key=lambda rj: (rj[0] - me) % ll.n)  # me+1 first
        while pending and not status:
            ready = [(r, j) for r, j in pending if W[j] >= s]
            if not ready and own is not None:
                own()
                own = None
            elif not ready:
                r, j = pending[0]
                ll._wait(r, lambda j=j: W[j] >= s, s, timeout, self.describe, mine)
            for r, j in ready:
                pending.remove((r, j))
                if (W[j + 1], W[j + 2], W[j + 3]) != mine:
                    ll.collect(mine, timeout, self.describe)  # another call: named
                status = self._pair(r, words, base, done)
                if status:
                    break
        ll.collect(mine, timeout, self.describe)
        self.pieces = tuple(done)
        return status, own

    def _pair(self, q: int, words: list[int], base: int, done: list[int]) -> int:
        """This rank's share of the copies between it and ``q`` (both posted): q's block
        into our output, then our input into q's; the status."""
        nb, me, W = self.nbytes, self.ll.rank, self.ll.W
        e, got = self.direct.claim(q, words[me] + COUNT + q, base + q * nb,
                                   int(W[words[q] + ADDR]), nb, False,
                                   nb * self.ll.n >= STREAM_MIN)
        done[0] += got
        if e:
            return q << 32 | e
        e, got = self.direct.claim(q, words[q] + COUNT + me, int(W[words[me] + ADDR]),
                                   int(W[words[q] + OUT]) + me * nb, nb, True)
        done[1] += got
        return q << 32 | WROTE | e if e else 0

    def _own_copy(self, x: np.ndarray, block: np.ndarray):
        """The copy of this rank's input into its block of the output, as a function:
        streamed (no read for ownership) when the output exceeds :data:`STREAM_MIN`."""
        if self.nbytes * self.ll.n >= STREAM_MIN:
            return lambda: cma.stream(block, x)
        return lambda: np.copyto(block, x)

    def _broadcast(self, x: np.ndarray, out: np.ndarray, red, timeout: float) -> None:
        """Every rank but the root reads the root's buffer into its own."""
        addrs = self._publish(x, timeout)
        self._complete(self._bcast_moves(x, out, addrs), timeout)

    def _bcast_moves(self, x: np.ndarray, out: np.ndarray, addrs: list[int]) -> int:
        """A broadcast's moves, every rank's address of ``x`` in ``addrs``: the root's own
        copy (out not x), every other rank's read of the root's buffer; the status."""
        root = self.root
        if self.ll.rank == root:
            if out is not x:
                out[...] = x
        elif self.nbytes:
            e = self.direct.read(root, [(cma.address(out), addrs[root], self.nbytes)],
                                 bounce=self.nbytes >= BOUNCE_BROADCAST)
            return root << 32 | e if e else 0
        return 0

    def _buffers(self, m: int, dtype: np.dtype) -> np.ndarray:
        s = self._scratch
        if s is None or s.shape[1] < m or s.dtype != dtype:
            s = self._scratch = np.empty((2, m), dtype)
        return s
