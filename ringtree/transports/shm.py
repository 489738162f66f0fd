"""Shared-memory transport for ranks on one host: slot rings in ``/dev/shm``.

Layout (NCCL's shm/p2p connection, DeepSpeed's flag discipline):

- One *ring* per (sender, receiver, channel), created lazily by whichever side needs it
  first (:mod:`shm_segment`): a control page and ``nslots`` slots of the executor's slice
  size. The control page holds two monotonic int64 counters on their own cache lines,
  ``head`` (slots published, written only by the sender) and ``tail`` (slots released,
  written only by the receiver), and a 64-byte descriptor per slot (header and length).
- Send: wait for ``head - tail < nslots``, copy header and payload into slot ``head %
  nslots`` (larger messages: consecutive slots), *then* publish ``head + 1`` (x86-64 keeps
  the store order). A send is complete once copied (eager).
- Receive: when ``head`` moves, compare the slot's header with the expected one (a
  mismatch fails with :class:`HeaderMismatch` before a payload byte is copied), copy the
  payload out, advance ``tail``; or hand the slot to a reduction
  (:meth:`ShmTransport.irecv_view`), which releases it afterwards: no staging copy.
- Direct (``RINGTREE_SHM_DIRECT_MIN``; on by default for messages ≥ 1 MiB only when the
  host's ranks outnumber its cores): the slot carries the address of the sender's buffer,
  the receiver reads it in place with ``process_vm_readv`` (:mod:`shm_cma`), and the send
  completes when the tail passes its slot.
- Waiting: spin on the counters for ``spin_us`` (not at all when the CPUs are
  oversubscribed), then sleep in ``poll(2)`` on this rank's doorbell, a named pipe. Before
  sleeping a rank sets the ring's *waits* flag and its *sleeping* word, fences, and
  re-checks its rings; a peer that moves a counter fences, reads both, and writes one byte
  to the pipe only if both are set (Dekker: no wake-up is lost, a busy exchange costs no
  system call).
- Failure: a rank that closes sets its ``closed`` word and rings its peers; a peer that
  sees it first finishes what the closer had done (data it left, a direct send it read),
  then fails the rest with :class:`PeerError` naming the rank; while sleeping a rank
  checks every 0.05 s that the peers it waits for are alive (pid and start time).
- Clean-up: names are unlinked once both sides mapped them; crashed jobs' leftovers go in
  :func:`shm_segment.clean_stale` and :meth:`ShmTransport.close`.
"""

from __future__ import annotations

import atexit
import os
import select
import time
import weakref

import numpy as np

from ringtree.errors import PeerError
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_segment as seg
from ringtree.transports.base import Request, Transport
from ringtree.transports.shm_ring import (
    HEAD,
    MAGIC,
    MAX_SLOTS,
    RECV_WAITS,
    SEND_WAITS,
    Ring,
    RingFailure,
    ViewRequest,
    init_ring,
    ring_size,
)
from ringtree.transports.shm_segment import PeerInfo

# Doorbell words: [0] magic, [1] pid, [PROBE_AT] address of PROBE_LEN bytes at [PROBE]
# (a peer that can read them there can read our memory directly), then one cache line
# each for SLEEP (we sleep on our pipe: ring it) and CLOSED, then from READS a bitmap of
# one byte per rank at byte READS: 1 if we can read that rank's memory (ranks < READS_MAX).
PROBE_AT, PROBE, PROBE_LEN = 3, 4, 16
SLEEP, CLOSED = 8, 16
READS, READS_MAX = 192, 1024
# Why we closed, when another rank's failure made us (written before CLOSED): the length
# in word REASON_LEN, the UTF-8 text from byte REASON_AT. A peer that sees us close names
# that first cause instead of us.
REASON_LEN, REASON_AT, REASON_MAX = 256, 2056, 2000
LIVENESS_PERIOD = 0.05  # s; a dead peer is seen within this (recovery wants detection ≪ 0.3 s)


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for t in list(_LIVE):
        try:
            t.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class ShmTransport(Transport):
    name = "shm"
    nap = LIVENESS_PERIOD  # between naps, check that the peers are alive

    def __init__(self, rank: int, tag: str, me: PeerInfo, peers: dict[int, PeerInfo], *,
                 slot_bytes: int, nslots: int, spin_us: float, cores: int,
                 direct_min: int = 0, yield_us: float = 0.0):
        self.rank, self.tag, self.me, self.peers = rank, tag, me, peers
        self.slot_bytes = -(-slot_bytes // 4096) * 4096
        self.nslots = max(2, min(nslots, MAX_SLOTS))
        self.spin = spin_us * 1e-6
        self.yield_s = yield_us * 1e-6
        self.cores = cores
        self._busy_until = 0.0     # /proc/loadavg said: more runnable tasks than cores
        self._next_load = 0.0
        self.send_rings: dict[tuple[int, int], Ring] = {}
        self.recv_rings: dict[tuple[int, int], Ring] = {}
        self.active: set[Ring] = set()
        self.closed = False
        self.failed: dict[int, PeerError] = {}
        self._next_check = 0.0
        seg.install_sigterm(_LIVE)
        self.bell = seg.Fifo(seg.rank_name(tag, "bell", rank, me.pid, me.ns))
        self.doorbell = seg.Segment.create_or_attach(
            seg.rank_name(tag, "db", rank, me.pid, me.ns), 4096)
        self.my_words = self.doorbell.words()
        self.my_words[0], self.my_words[1] = MAGIC, me.pid
        # Direct sends (the receiver reads our buffer) of messages >= direct_min bytes, to
        # peers that showed they can read us (direct[peer], known after setup).
        self.direct_min = direct_min if direct_min > 0 and cma.supported() else 0
        self.direct: dict[int, bool] = {}
        self._probe = np.frombuffer(os.urandom(PROBE_LEN), np.int64).copy()
        if cma.supported():
            cma.allow_readers()
            self.my_words[PROBE_AT] = cma.address(self._probe)
            for i, v in enumerate(self._probe):
                self.my_words[PROBE + i] = int(v)
        self.peer_dbs: dict[int, seg.Segment] = {}
        self.peer_words: dict[int, memoryview] = {}
        self.peer_bells: dict[int, int] = {}
        self.poller = select.poll()
        self.poller.register(self.bell.fd, select.POLLIN)
        _LIVE.add(self)

    # ---- setup ------------------------------------------------------------------------

    def attach_peers(self) -> None:
        """Map every peer's doorbell (they must exist: called after the peers published)."""
        for r, p in self.peers.items():
            db = seg.Segment.attach(seg.rank_name(self.tag, "db", r, p.pid, p.ns))
            if db is None:
                raise RuntimeError(f"rank {self.rank}: cannot open rank {r}'s shared memory "
                                   f"in {seg.SHM_DIR} (different /dev/shm? set "
                                   f"RINGTREE_TRANSPORT=tcp)")
            self.peer_dbs[r] = db
            self.peer_words[r] = w = db.words()
            self.peer_bells[r] = seg.open_bell(seg.rank_name(self.tag, "bell", r, p.pid, p.ns))
            expect = np.array(w[PROBE:PROBE + PROBE_LEN // 8], np.int64).tobytes()
            if r < READS_MAX and w[PROBE_AT] and p.ns == self.me.ns and \
                    cma.probe(p.pid, w[PROBE_AT], expect):
                self.doorbell.array[READS + r] = 1

    def finish_setup(self) -> None:
        """Every peer has probed us: send directly to those that can read us."""
        me = self.rank
        for r, db in self.peer_dbs.items():
            self.direct[r] = bool(self.direct_min and me < READS_MAX
                                  and db.array[READS + me])

    def unlink_names(self) -> None:
        """Every peer has mapped our doorbell: its names can go."""
        self.finish_setup()
        self.doorbell.unlink()
        self.bell.unlink()

    def _ring_name(self, src: int, dst: int, channel: int) -> str:
        ps, pd = (self.me if r == self.rank else self.peers[r] for r in (src, dst))
        return seg.ring_name(self.tag, src, dst, channel, ps.pid, pd.pid, self.me.ns)

    def _ring(self, peer: int, channel: int, sending: bool) -> Ring:
        rings = self.send_rings if sending else self.recv_rings
        r = rings.get((peer, channel))
        if r is None:
            if peer not in self.peers:
                raise ValueError(f"rank {peer} is not reachable over shared memory")
            src, dst = (self.rank, peer) if sending else (peer, self.rank)
            name = self._ring_name(src, dst, channel)
            s = seg.Segment.create_or_attach(name, ring_size(self.nslots, self.slot_bytes),
                                             init_ring(self.nslots, self.slot_bytes))
            if not s.created:
                s.unlink()  # both sides have it mapped now
            r = rings[(peer, channel)] = Ring(peer, channel, sending, s)
            err = self.failed.get(peer)
            if err is not None:
                r.dead = err
        return r

    # ---- the Transport interface ------------------------------------------------------

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        req = Request(peer, channel, header, payload.reshape(-1).view(np.uint8), True)
        return self._post(req, sending=True)

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        req = Request(peer, channel, header, into.reshape(-1).view(np.uint8), False)
        return self._post_recv(req)

    def irecv_view(self, peer: int, channel: int, header: bytes, nbytes: int) -> ViewRequest:
        """Receive a message of ``nbytes`` ≤ ``slot_bytes`` without copying: when done,
        ``req.buf`` is the slot (uint8). Call :meth:`release` when finished with it."""
        req = ViewRequest(peer, channel, header, _EMPTY, False)
        req.seq = nbytes  # the size until it arrives, then the slot's sequence number
        req.ring = None
        self._post_recv(req)
        return req

    def has_message(self, peer: int, channel: int) -> bool:
        """A message from ``peer`` waits on ``channel`` and no receive is posted for it
        (what a receive-from-any-source probes)."""
        r = self._ring(peer, channel, False)
        return not r.q and r.dead is None and int(r.ctrl[HEAD]) > r.count

    def can_view(self, peer: int, nbytes: int) -> bool:
        return peer in self.peers and nbytes <= self.slot_bytes

    def release(self, req: ViewRequest) -> None:
        r = req.ring
        if r is not None and r.release(req):
            self._wake(r, SEND_WAITS)

    def _post_recv(self, req: Request) -> Request:
        return self._post(req, sending=False)

    def _post(self, req: Request, sending: bool) -> Request:
        """Queue ``req`` on its ring and move what can move now."""
        if self.closed:
            req.fail(self._closed_error(req.peer))
            return req
        r = self._ring(req.peer, req.channel, sending)
        if r.dead is not None:
            req.fail(r.dead)
            return req
        r.q.append(req)
        if len(r.q) == 1:
            (self._push if sending else self._pull)(r)
        if (r.busy if sending else r.q):
            self.active.add(r)
        return req

    def poll(self) -> bool:
        moved = False
        for r in list(self.active):
            if r.busy:
                moved |= self._push(r) if r.sending else self._pull(r)
            if not r.busy:
                self.active.discard(r)
        return moved

    def pending(self) -> bool:
        return bool(self.active)

    def wait(self, timeout: float) -> None:
        if self.spin_phase():
            return
        if self.prepare_sleep():
            try:
                woke = self.poller.poll(max(0, int(min(timeout, LIVENESS_PERIOD) * 1000)))
            except InterruptedError:
                woke = [()]
            self.finish_sleep(bool(woke))

    # ---- waiting in two phases: spin, then sleep on the doorbell ------------------------

    def spin_phase(self) -> bool:
        """Poll until something moves (True) or the budget is over (False).

        First a pure spin of ``spin_us``, unless the CPUs are oversubscribed — by this
        host's ranks, or by anything else (``/proc/loadavg`` runnable count, sampled every
        50 ms): then the peer we wait for needs our core more than we do. Then, for
        ``yield_us``, polls separated by ``os.sched_yield`` (vLLM's shm queue, Open MPI):
        a waiting rank hands its core to whichever rank is runnable and looks again as
        soon as the scheduler comes back to it, with no system call on the publishing
        side (``benchmarks/ll_wait.py`` measures both against sleeping at once).
        """
        poll, clock = self.poll, time.perf_counter
        start = clock()
        if self.spin > 0 and not self._crowded():
            end = start + self.spin
            while clock() < end:
                if poll():
                    return True
        if self.yield_s > 0:
            end = start + self.yield_s
            yld = os.sched_yield
            while clock() < end:
                if poll():
                    return True
                yld()
        return False

    def _crowded(self) -> bool:
        now = time.monotonic()
        if now >= self._next_load:
            self._next_load = now + 0.05
            try:
                with open("/proc/loadavg", "rb") as f:
                    runnable = int(f.read().split()[3].split(b"/")[0])
            except (OSError, ValueError, IndexError):
                runnable = 0
            if runnable > self.cores:
                self._busy_until = now + 0.2
        return now < self._busy_until

    def prepare_sleep(self) -> bool:
        """Announce that we sleep; False (and not sleeping) if progress is possible now."""
        if self.closed:
            return False
        self.my_words[SLEEP] = 1
        seg.fence()
        if self.poll() or self._check_peers(time.monotonic() >= self._next_check):
            self.my_words[SLEEP] = 0
            return False
        return True

    def finish_sleep(self, rung: bool = True) -> None:
        self.my_words[SLEEP] = 0
        if rung:
            self.bell.drain()
        self._check_peers(time.monotonic() >= self._next_check)

    def wait_fds(self) -> list[tuple[int, int]]:
        return [(self.bell.fd, select.POLLIN)] if self.bell.fd >= 0 else []

    def _wake(self, r: Ring, flag: int) -> None:
        """We moved ``r``'s head or tail: ring the peer's bell if it waits for that and
        sleeps. The fence orders our counter store before these loads (Dekker with
        :meth:`prepare_sleep`, which stores flags, fences, then re-reads counters)."""
        seg.fence()
        if r.ctrl[flag] and self.peer_words[r.peer][SLEEP]:
            seg.ring_bell(self.peer_bells[r.peer])

    # ---- failures -----------------------------------------------------------------------

    def _check_peers(self, liveness: bool) -> bool:
        """Fail rings of peers that closed (always) or died (if ``liveness``)."""
        if liveness:
            self._next_check = time.monotonic() + LIVENESS_PERIOD
        hit = False
        for r in list(self.active):
            if not r.busy or r.dead is not None:
                continue
            p = r.peer
            how, cause = None, None
            if self.peer_words[p][CLOSED]:
                how = "closed its connection"
                cause = self._reason_of(p)
            elif liveness and seg.gone(self.peers[p], self.me):
                how = f"died (pid {self.peers[p].pid} is gone)"
            if how is None:
                continue
            if self._finished_before(r):
                continue
            self._fail_peer(p, PeerError(p, f"rank {p} {how} (shm channel {r.channel})", cause))
            hit = True
        return hit

    def dead_peers(self) -> set[int]:
        return {r for r, p in self.peers.items() if seg.gone(p, self.me)}

    def _finished_before(self, r: Ring) -> bool:
        """A peer that closed may have done its part of ``r`` first: left data for us, or
        read a direct send of ours (complete once its tail moves) before it closed."""
        if r.sending:
            self._push(r)
            return not r.busy
        return self._pull(r) and not r.q

    def leave_reason(self, text: str) -> None:
        """Say why we are about to close (another rank's failure), for the peers to read."""
        seg.write_reason(self.doorbell.array, self.my_words, REASON_LEN, REASON_AT,
                         REASON_MAX, text)

    def _reason_of(self, peer: int) -> str | None:
        return seg.read_reason(self.peer_dbs[peer].array, self.peer_words[peer], REASON_LEN,
                               REASON_AT, REASON_MAX)

    def _fail_peer(self, peer: int, err: PeerError) -> None:
        self.failed[peer] = err
        for rings in (self.send_rings, self.recv_rings):
            for (p, _), r in rings.items():
                if p == peer:
                    self._die(r, err)

    def _die(self, r: Ring, err: BaseException) -> None:
        r.dead = err
        while r.q:
            r.q.popleft().fail(err)
        while r.acks:
            r.acks.popleft()[1].fail(err)
        self.active.discard(r)

    # ---- data movement ------------------------------------------------------------------

    def _push(self, r: Ring) -> bool:
        moved = r.push(self.direct_min if self.direct.get(r.peer) else 0)
        if moved:
            self._wake(r, RECV_WAITS)
        return moved

    def _pull(self, r: Ring) -> bool:
        try:
            moved, tail_moved = r.pull(self.peers[r.peer].pid)
        except RingFailure as e:
            if e.peer_wide:
                self._fail_peer(r.peer, e.err)
            else:
                self._die(r, e.err)
            return True
        if tail_moved:
            self._wake(r, SEND_WAITS)
        return moved

    # ---- shutdown -----------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _LIVE.discard(self)
        if os.getpid() != self.me.pid:
            return  # a forked child (a data loader, say): the communicator is not its own
        self.hang_up()
        for r in list(self.active):  # what was still in flight can never finish now
            self._die(r, self._closed_error(r.peer))
        seg.close_fds(self.peer_bells.values())
        self.peer_bells = {}
        self.bell.close()
        self.doorbell.unlink()
        seg.remove_names(self.tag, self.me.pid)

    def hang_up(self) -> None:
        """Show the peers we closed (their waits fail at once) and release nothing."""
        try:
            self.my_words[CLOSED] = 1
            for p in self.peer_words:
                self._wake_always(p)
            seg.ring_bell(self.bell.fd)  # a thread sleeping in this transport: wake up
        except (ValueError, OSError):
            pass

    def _closed_error(self, peer: int) -> PeerError:
        return PeerError(peer, f"rank {self.rank} closed its shared-memory transport "
                               f"(communicator closed or aborted) with work to rank {peer} "
                               f"pending")

    def _wake_always(self, peer: int) -> None:
        fd = self.peer_bells.get(peer)
        if fd is not None:
            seg.ring_bell(fd)


_EMPTY = np.empty(0, dtype=np.uint8)
