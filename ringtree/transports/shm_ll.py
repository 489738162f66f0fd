"""LL's shared segment: one per communicator whose ranks share a host.

The model is MPICH's release/gather, Open MPI's coll/xhc and NCCL's LL protocol
(Jain et al., SC'18; ``ompi/mca/coll/xhc``; ``nccl/src/device/prims_ll.h``). This module
is the segment's mechanics only — layout, publish, wait / sleep / doorbell, liveness,
close; what a collective writes and reads is :mod:`ringtree.runtime.protocols.ll`.
One synchronisation is one publication and one wait, with no messages:

- The segment holds, per rank, two 128-byte *lines* (one per sequence parity) and a
  state line, then per rank two *cells* of ``cell_bytes`` (again one per parity).
- A line is ``[seq, header, 96 bytes of inline payload]``. ``seq`` is the rank's LL
  call counter: a uint64 that only grows, so nothing is ever reset. The header is the
  call part of the message header every Simple message carries
  (:meth:`ringtree.ir.wire.WireHeader.call_words`: count, sequence number, algorithm,
  collective, dtype, op, protocol, root) — one encoding of a call's identity for both
  protocols. The line is two cache lines so that the header costs no inline payload
  (one line of 64 bytes held 48 inline bytes behind an 8-byte fingerprint).
- Publication ``s`` of a rank: its contribution is in parity ``s & 1`` (inline if it
  fits the line, else its cell); write the header, then ``seq = s`` (x86-64 keeps stores
  in order; elsewhere a fence). Then wait until every rank's parity-``s & 1`` line shows
  ``seq >= s``, compare headers (a difference is :class:`MismatchError` naming both ranks
  and the field, :meth:`~ringtree.ir.wire.WireHeader.describe_difference`, raised on
  every rank, since every rank reads every line).
- Why two parities suffice: a rank posts ``s + 1`` only after finishing call ``s``, so
  when anyone writes parity ``s & 1`` again (call ``s + 2``) it has seen every rank post
  ``s + 1``, i.e. every rank has finished reading call ``s`` (Open MPI coll/sm's two
  buffer sets; MPICH's monotonic flags).

Waiting (``wait=``): poll the peers' lines; with a core per rank spin first
(``spin_us``); then poll with ``os.sched_yield`` between looks (vLLM's shm queue, Open
MPI) for up to ``yield_us``; then sleep in ``poll(2)`` on this rank's doorbell (a named
pipe) after announcing it in the state line — the Dekker handshake of
:mod:`ringtree.transports.shm`: the sleeper stores its flag, fences, re-checks; a poster
stores ``seq``, fences, and rings only ranks whose flag is set. While sleeping, every
0.05 s a rank checks that the ranks it waits for are alive (``/proc``; :class:`PeerError`
names the rank), calls ``on_idle`` (the communicator's abort check) about once a
second, and honours the call's timeout (:class:`CollectiveTimeout` naming the ranks).

Clean-up: the segment and doorbells are unlinked once every rank has mapped them, so a
killed job leaves nothing in ``/dev/shm``.
"""

from __future__ import annotations

import os
import platform
import secrets
import select
import time

import numpy as np

from ringtree.errors import CollectiveTimeout, MismatchError, PeerError
from ringtree.ir.wire import PROTO_SIMPLE, WireHeader
from ringtree.transports import shm_segment as seg
from ringtree.transports.shm_segment import PeerInfo

MAGIC = 0x52544E47_4C4C5632
LINE = 128                 # two cache lines: seq and header in the first
HEAD = 32                  # seq (8 bytes) and the call's header (24)
INLINE = LINE - HEAD       # payload bytes that ride in the line itself
RANK_STRIDE = 3 * LINE     # per rank: line of parity 0, line of parity 1, state line
LINES_OFF = 4096           # header page first: magic, nranks, cell bytes
# state-line words: "ring my bell", "I closed", and the last call this rank runs on
# Simple (its sequence number and header, three words: see LL.announce)
SLEEP, CLOSED, ANN_SEQ, ANN_HEAD = 0, 1, 2, 3
SEQ_MASK = 0xFFFFFFFF      # the header's sequence number: the low half of its 2nd word
POISON = (1 << 64) - 1     # seq and first header word of a closed rank's lines
LIVENESS_PERIOD = 0.05  # s; a dead peer is seen within this (recovery wants detection ≪ 0.3 s)
IDLE_PERIOD = 1.0
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def segment_size(nranks: int, cell_bytes: int) -> int:
    return cells_offset(nranks) + nranks * 2 * cell_bytes


def cells_offset(nranks: int) -> int:
    return -(-(LINES_OFF + nranks * RANK_STRIDE) // 4096) * 4096


class LL:
    """One rank's end of a communicator's LL segment (every rank of the communicator is
    on this host; the rank is its index here)."""

    def __init__(self, rank: int, segment: seg.Segment, peers: dict[int, PeerInfo],
                 bell: seg.Fifo, peer_bells: dict[int, int], *, spin_us: float,
                 yield_us: float, on_idle=None):
        w = segment.words()
        if w[0] != MAGIC:
            raise RuntimeError(f"shared-memory segment {segment.name} is not an LL segment")
        self.rank, self.seg, self.peers = rank, segment, peers
        self.n, self.cell_bytes = int(w[1]), int(w[2])
        self.cells_off = cells_offset(self.n)
        self.W = memoryview(segment.mm).cast("Q")
        self.bell, self.peer_bells = bell, peer_bells
        self.spin, self.yield_s = spin_us * 1e-6, yield_us * 1e-6
        self.on_idle = on_idle
        self.seq = int(self.W[self.seq_word(rank, 0)])  # a fresh segment: 0
        self.closed = False
        self.prepared: dict[tuple, object] = {}
        base = LINES_OFF // 8
        stride = RANK_STRIDE // 8
        # word indices: my lines by parity, the peers' (rank, seq word) by parity, and the
        # peers' sleep words, so the hot path does no arithmetic
        self.my_seq = (self.seq_word(rank, 0), self.seq_word(rank, 1))
        self.peer_seq = tuple(tuple((r, self.seq_word(r, p)) for r in range(self.n)
                                    if r != rank) for p in (0, 1))
        state = 2 * LINE // 8  # the state line's first word, from a rank's first
        self.peer_sleep = tuple((r, base + r * stride + state + SLEEP) for r in range(self.n)
                                if r != rank)
        self.my_state = base + rank * stride + state
        self.peer_state = tuple((r, base + r * stride + state) for r in range(self.n)
                                if r != rank)
        self.synced = self.seq  # every peer has posted at least this call
        self.written: list = [None, None]  # the header whose constant words each line holds

    # ---- layout ---------------------------------------------------------------------

    @staticmethod
    def seq_word(rank: int, parity: int) -> int:
        return (LINES_OFF + rank * RANK_STRIDE + parity * LINE) // 8

    def area(self, rank: int, parity: int, nbytes: int) -> tuple[int, int]:
        """(byte offset, stride between ranks) of a contribution of ``nbytes``."""
        if nbytes <= INLINE:
            return LINES_OFF + rank * RANK_STRIDE + parity * LINE + HEAD, RANK_STRIDE
        if nbytes > self.cell_bytes:
            raise ValueError(f"LL: {nbytes} bytes exceed the cell size {self.cell_bytes}")
        return self.cells_off + (rank * 2 + parity) * self.cell_bytes, 2 * self.cell_bytes

    def view(self, rank: int, parity: int, dtype: np.dtype, count: int) -> np.ndarray:
        """Rank ``rank``'s parity-``parity`` contribution of ``count`` × ``dtype``."""
        off, _ = self.area(rank, parity, count * dtype.itemsize)
        return np.ndarray((count,), dtype, buffer=self.seg.mm, offset=off)

    def rows(self, parity: int, dtype: np.dtype, count: int, skip: int = 0,
             nbytes: int | None = None) -> np.ndarray:
        """Every rank's contribution as one (n, count) view (row r = rank r), starting
        ``skip`` elements into contributions of ``nbytes`` (default: count elements)."""
        size = count * dtype.itemsize if nbytes is None else nbytes
        off, stride = self.area(0, parity, size)
        return np.ndarray((self.n, count), dtype, buffer=self.seg.mm,
                          offset=off + skip * dtype.itemsize, strides=(stride, dtype.itemsize))

    # ---- one synchronisation ----------------------------------------------------------

    def parity(self, timeout: float, what) -> int:
        """The parity the next call writes. Writing it is safe once every peer has
        finished the call that last used it (two calls ago): immediate after an LL call
        (its wait saw everyone post); after Simple calls, which announce without waiting,
        it may have to wait for the slowest peer to catch up."""
        s = self.seq + 1
        if self.synced < s - 1:
            W = self.W
            for r, k in self.peer_state:
                lines = self.peer_seq[0][self._idx(r)][1], self.peer_seq[1][self._idx(r)][1]

                def done(a=lines[0], b=lines[1], k=k) -> bool:
                    return max(W[a], W[b], W[k + ANN_SEQ]) >= s - 1
                if not done():
                    self._wait(r, done, s - 1, timeout, what, None)
            self.synced = s - 1
        return s & 1

    def _idx(self, r: int) -> int:
        return r if r < self.rank else r - 1

    @staticmethod
    def _state(rank: int) -> int:
        """The first word of ``rank``'s state line."""
        return (LINES_OFF + rank * RANK_STRIDE + 2 * LINE) // 8

    def sync(self, head: tuple[int, int, int], timeout: float, what) -> int:
        """Publish this rank's call (its data is already in parity ``seq+1 & 1``, see
        :meth:`parity`) with ``head`` (:meth:`WireHeader.call_words` with sequence number
        0: the line's carries ``seq``), wait for every rank's, compare their headers.
        Returns the parity to read."""
        return self.collect(self.post(head), timeout, what)

    def post(self, head: tuple[int, int, int]) -> tuple[int, int, int]:
        """The first half of :meth:`sync`: publish this rank's call and wake sleeping
        peers, without waiting; :meth:`collect` with what it returns waits. Work done in
        between overlaps the wait (the single-copy all-gather's own block)."""
        W = self.W
        s = self.seq + 1
        p = s & 1
        i = self.my_seq[p]
        h0, h1, h2 = head[0], head[1] | (s & SEQ_MASK), head[2]
        if self.written[p] is not head:  # the same call's header stays in the line
            W[i + 1] = h0
            W[i + 3] = h2
            self.written[p] = head
        W[i + 2] = h1
        if not _TSO:
            seg.fence()
        W[i] = s
        self.seq = s
        if self.peer_sleep:
            seg.fence()  # our seq before their sleep flags (Dekker with _sleep)
            for r, j in self.peer_sleep:
                if W[j]:
                    seg.ring_bell(self.peer_bells[r])
        return h0, h1, h2

    def collect(self, mine: tuple[int, int, int], timeout: float, what) -> int:
        """The second half of :meth:`sync`: wait for every rank's post of our call and
        compare its header words with ``mine`` (:meth:`post`'s). Returns the parity."""
        W, s = self.W, self.seq
        p = s & 1
        h0, h1, h2 = mine
        for r, j in self.peer_seq[p]:
            if W[j] < s:
                self._wait(r, lambda j=j: W[j] >= s, s, timeout, what, (h0, h1, h2))
            if W[j + 1] != h0 or W[j + 2] != h1 or W[j + 3] != h2:
                if W[j] == POISON:
                    self._check_closed(r, s, what)
                raise MismatchError(self._mismatch(r, (h0, h1, h2), W[j + 1:j + 4], s, what))
        self.synced = s
        return p

    def announce(self, head: tuple[int, int, int]) -> None:
        """A call that runs on Simple takes its sequence number too and shows it in the
        state line (not in the parity lines, which only LL calls write), so a rank that
        chose LL for the same call — it disagrees on the size — gets a MismatchError
        instead of waiting forever; see also :meth:`check_announced`."""
        W = self.W
        s = self.seq + 1
        k = self.my_state + ANN_HEAD
        W[k], W[k + 1], W[k + 2] = head[0], head[1] | (s & SEQ_MASK), head[2]
        if not _TSO:
            seg.fence()
        W[self.my_state + ANN_SEQ] = s
        self.seq = s
        if self.n == 1:  # no peer to wait for: LL's next call is free to write (a
            self.synced = s  # rank alone never runs parity(), so it would never catch up)
        seg.fence()
        for r, j in self.peer_sleep:
            if W[j]:
                seg.ring_bell(self.peer_bells[r])

    def check_announced(self, what) -> None:
        """While a Simple call waits: raise MismatchError if a peer runs our latest
        call (which we announced) on LL."""
        W, s = self.W, self.seq
        if s == 0 or W[self.my_state + ANN_SEQ] != s:
            return
        k = self.my_state + ANN_HEAD
        mine = W[k:k + 3]
        for r, j in self.peer_seq[s & 1]:
            if W[j] == s and W[j + 1:j + 4] != mine:
                raise MismatchError(self._mismatch(r, mine, W[j + 1:j + 4], s, what))

    def _mismatch(self, peer: int, mine, theirs, s: int, what) -> str:
        """The MismatchError text for two headers (call words) that differ."""
        a, b = WireHeader.from_call_words(mine), WireHeader.from_call_words(theirs)
        diffs = a.describe_difference(b, self.rank, peer)
        return (f"rank {self.rank} and rank {peer} disagree on {what()} (call {s}): "
                + "; ".join(diffs) + " (ranks must call the same collectives in the same "
                "order with matching count, dtype, op and root)")

    # ---- waiting ----------------------------------------------------------------------

    def _wait(self, peer: int, done, s: int, timeout: float, what, mine,
              busy: bool = True) -> None:
        """Until ``done()`` (``peer`` has reached call ``s``): spin, yield, then sleep
        (``busy=False``: sleep at once, the kernel has spun and yielded).
        ``mine``: our header words when ``s`` is an LL call — a peer that announced ``s``
        or later on Simple runs another call (MismatchError)."""
        clock = time.perf_counter
        start = clock()
        if busy and self.spin > 0:
            end = start + self.spin
            while not done():
                if clock() > end:
                    break
            else:
                return
        if busy and self.yield_s > 0:
            end = start + self.yield_s
            yld = os.sched_yield
            while not done():
                yld()
                if clock() > end:
                    break
            else:
                return
        deadline = time.monotonic() + timeout
        next_idle = time.monotonic() + IDLE_PERIOD
        W = self.W
        state = self._state(peer)
        while not done():
            if mine is not None and W[state + ANN_SEQ] >= s:
                ann = int(W[state + ANN_SEQ])
                theirs = W[state + ANN_HEAD:state + ANN_HEAD + 3] if ann == s else \
                    WireHeader.from_call_words(mine)._replace(
                        seq=ann & SEQ_MASK, flags=PROTO_SIMPLE).call_words()
                raise MismatchError(self._mismatch(peer, mine, theirs, s, what))
            self._check(peer, done, s, what)
            now = time.monotonic()
            if now > deadline:
                raise CollectiveTimeout(f"rank {self.rank}: {what()} (LL call {s}) timed "
                                        f"out after {timeout:g} s waiting for rank {peer}")
            if self.on_idle is not None and now > next_idle:
                next_idle = now + IDLE_PERIOD
                self.on_idle()
            self._sleep(done, min(LIVENESS_PERIOD, max(0.0, deadline - now)))

    def _sleep(self, done, seconds: float) -> None:
        W = self.W
        W[self.my_state + SLEEP] = 1
        seg.fence()  # our flag before their seq (Dekker with sync)
        try:
            if done():
                return
            p = select.poll()
            p.register(self.bell.fd, select.POLLIN)
            try:
                if p.poll(int(seconds * 1000) + 1):
                    self.bell.drain()
            except InterruptedError:
                pass
        finally:
            W[self.my_state + SLEEP] = 0

    def _check(self, peer: int, done, s: int, what) -> None:
        """Raise PeerError if ``peer`` (not yet at ``s``) closed or died, or if this rank
        or any other closed (hung up: a revoke), since every rank's part is needed."""
        if self.closed or self.W[self.my_state + CLOSED]:
            raise PeerError(peer, f"rank {self.rank}: LL closed during {what()}")
        for r, k in self.peer_state:  # one that closed without posting call s
            if r != peer and self.W[k + CLOSED] and not \
                    s <= self.W[self.seq_word(r, s & 1)] < POISON:
                self._check_closed(r, s, what)
        state = self._state(peer)
        info = self.peers[peer]
        how = None
        if self.W[state + CLOSED]:
            how = "closed its communicator"
        elif not seg.alive(info.pid, info.start):
            how = f"died (pid {info.pid} is gone)"
        if how is not None and not done():
            raise PeerError(peer, f"rank {peer} {how} while rank {self.rank} waited for it "
                                  f"in {what()} (LL call {s})")

    def _check_closed(self, peer: int, s: int, what) -> None:
        """``peer`` closed (a revoke poisons its lines) without its part of call ``s``."""
        raise PeerError(peer, f"rank {peer} closed its communicator while rank {self.rank} "
                              f"ran {what()} (LL call {s})")

    # ---- shutdown ---------------------------------------------------------------------

    def hang_up(self) -> None:
        """A revoke: show the peers we closed (a rank waiting for us fails at once) and
        poison our lines, so a peer that reads them later sees none of our calls
        complete (its header check fails, then :meth:`_check_closed` names us); release
        nothing, so any thread may call it. Not done by :meth:`close`: a peer may still
        be reading our last call's line then."""
        if self.closed or os.getpid() != self.peers[self.rank].pid:
            return
        W = self.W
        for i in self.my_seq:
            W[i + 1] = POISON
            seg.fence()
            W[i] = POISON
        self._say_closed()

    def _say_closed(self) -> None:
        try:
            self.W[self.my_state + CLOSED] = 1
            seg.fence()
            for fd in self.peer_bells.values():
                seg.ring_bell(fd)
            seg.ring_bell(self.bell.fd)
        except (ValueError, OSError):
            pass

    def close(self) -> None:
        """Tell the peers (a rank waiting for us fails at once) and drop our names."""
        if self.closed:
            return
        if os.getpid() != self.peers[self.rank].pid:
            self.closed = True
            return  # a forked child: not its communicator
        self._say_closed()
        self.closed = True
        seg.close_fds(self.peer_bells.values())
        self.peer_bells = {}
        self.bell.close()
        if self.seg.linked:
            self.seg.unlink()


def _init(nranks: int, cell_bytes: int):
    def init(a: np.ndarray) -> None:
        w = a[:64].view(np.uint64)
        w[0], w[1], w[2] = MAGIC, nranks, cell_bytes
    return init


def open_ll(store, prefix: str, rank: int, nranks: int, timeout: float, *,
            cell_bytes: int, spin_us: float, yield_us: float, on_idle=None) -> LL:
    """Collective over all ``nranks`` ranks (all on this host): rank 0 creates the segment,
    every rank makes its doorbell and publishes its pid through ``store``, maps the
    segment and the peers' doorbells, and once all have (a store barrier) the names are
    unlinked. ``cell_bytes`` is rank 0's (read back from the segment by everyone)."""
    seg.clean_stale()
    nonce = store.compare_set(f"{prefix}/ll/nonce", None, secrets.token_hex(4).encode())
    tag = "ll" + nonce.decode()
    pid = os.getpid()
    me = PeerInfo(rank, pid, seg.start_time(pid), seg.pid_namespace())
    bell = seg.Fifo(seg.rank_name(tag, "bell", rank, pid, me.ns))
    segment = None
    fds: dict[int, int] = {}
    try:
        if rank == 0:
            cell = -(-max(cell_bytes, 4096) // 4096) * 4096
            name = seg.rank_name(tag, "seg", 0, pid, me.ns)
            segment = seg.Segment.create_or_attach(name, segment_size(nranks, cell),
                                                   _init(nranks, cell))
            store.set(f"{prefix}/ll/seg", name.encode())
        store.set(f"{prefix}/ll/info/{rank}", f"{pid},{me.start},{me.ns}".encode())
        peers = {rank: me}
        for r in range(nranks):
            if r != rank:
                p, st, ns = store.get(f"{prefix}/ll/info/{r}", timeout=timeout).decode().split(",")
                peers[r] = PeerInfo(r, int(p), None if st == "None" else int(st), ns)
        if segment is None:
            name = store.get(f"{prefix}/ll/seg", timeout=timeout).decode()
            segment = seg.Segment.attach(name)
            if segment is None:
                raise RuntimeError(f"rank {rank}: cannot open the LL segment {name} in "
                                   f"{seg.SHM_DIR} (a different /dev/shm?)")
        for r, info in peers.items():
            if r != rank:
                fds[r] = seg.open_bell(seg.rank_name(tag, "bell", r, info.pid, info.ns))
        store.set(f"{prefix}/ll/ready/{rank}", b"1")
        store.wait([f"{prefix}/ll/ready/{r}" for r in range(nranks)], timeout=timeout)
        bell.unlink()
        if segment.created:
            segment.unlink()
        return LL(rank, segment, peers, bell, fds, spin_us=spin_us, yield_us=yield_us,
                  on_idle=on_idle)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        bell.close()
        if segment is not None and segment.linked:
            segment.unlink()
        raise
