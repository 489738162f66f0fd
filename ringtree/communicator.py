"""The Communicator (``ncclComm_t``): a group of ranks that run collectives together.

The collective methods (:mod:`ringtree.collectives`) validate their arguments into a
frozen call spec (:mod:`ringtree.api`) or take the one-entry hot path; the planner
(:mod:`ringtree.runtime.planner`) turns the spec into a ready-to-run call, and the
communicator issues it — now, into an open :meth:`group`, or as async work — to the
executor (:mod:`ringtree.runtime.executor`), driven by :mod:`ringtree.runtime.progress`. Around that it owns the lifecycle: creation
(rendezvous and transports), ``split``/``new_group``, failure and shutdown.

Failure propagation (the first rank that sees an error records it in the store for every
rank) is :mod:`ringtree.failure`.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager

import numpy as np

from ringtree import failure
from ringtree.bootstrap.netcheck import check_listener
from ringtree.bootstrap.rendezvous import Peer, meet
from ringtree.collectives import Collectives
from ringtree.errors import CommAborted, CommRevoked
from ringtree.prof import attach, detach
from ringtree.resilience.methods import Resilient
from ringtree.runtime.aliasing import run_group
from ringtree.runtime.executor import Executor
from ringtree.runtime.owner import ThreadOwner
from ringtree.runtime.plan import Call
from ringtree.runtime.planner import CallSpec, Planner, link_kind
from ringtree.runtime.progress import Progress
from ringtree.runtime.protocols import ll_reg
from ringtree.runtime.protocols.ll_runner import LLRunner
from ringtree.settings import as_timeout, current
from ringtree.transports.tcp import make_listener
from ringtree.tuning.links import tune_for
from ringtree.tuning.proto import parse_proto_spec
from ringtree.tuning.tuner import parse_algo_spec
from ringtree.work import Work


class Communicator(Collectives, Resilient):
    """A group of ranks that run collectives together (``ncclComm_t``).

    Collectives take ``torch.distributed`` names and semantics. With ``async_op=True``
    they return a :class:`~ringtree.work.Work`; ``algo=`` picks the algorithm of one call;
    ``timeout=`` its deadline in seconds (default ``RINGTREE_TIMEOUT``).
    """

    def __init__(self, *, rank: int, size: int, store, prefix: str, secret: bytes,
                 master_addr: str = "127.0.0.1", timeout: float | None = None,
                 server=None, world_ranks: tuple[int, ...] | None = None,
                 local_rank: int | None = None, owns_store: bool = False):
        from ringtree.bootstrap.job import host_identity
        from ringtree.bootstrap.netif import select_address
        from ringtree.transports.assign import build_fabric
        from ringtree.transports.base import Setup

        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} out of range for {size} ranks")
        self.rank, self.size = rank, size
        self.store, self.prefix, self.secret = store, prefix, secret
        self._server, self._owns_store = server, owns_store
        self.world_ranks = world_ranks or tuple(range(size))
        self.settings = s = current()
        self.timeout = as_timeout(timeout) if timeout is not None else s.timeout
        self.nchannels = max(1, s.nchannels)
        self.slice_bytes = max(4096, s.buffsize // 4)
        self.algo_enabled = parse_algo_spec(s.algo)
        self.debug = s.debug
        self.comm_id = hashlib.sha256(secret + prefix.encode()).digest()[:16]
        self.seq = 0
        self._p2p_seq: dict[tuple[int, int, str | None], int] = {}
        self._splits = 0
        self.health = failure.Health()  # written only by ringtree.failure
        self._owner = ThreadOwner()
        self.store_host_rank: int | None = None  # the rank whose process serves the store
        self._closed = False
        # True: a hot entry asks _hot_blocked() before it runs; every writer of a state
        # that keeps the hot entries out sets it after the state (failure, group, close,
        # the executor's batches and observer, LL calls queued)
        self._hot_off = True
        self._group: list[tuple[Call, Work | None, object]] | None = None
        self._group_depth = 0
        self._monitored = 0  # monitored barriers so far (their keys in the store)
        # True: async calls are driven by the worker thread unless their waiter drives
        # them, and any thread may issue (the torch backend, whose autograd threads do).
        self.background = False

        host = select_address(s.socket_ifname, master_addr)
        listener = make_listener(host)
        self.host_id = host_identity()
        me = f"{host}:{listener.getsockname()[1]}|{self.host_id}"
        self.peers = [Peer.parse(r, rec) for r, rec in enumerate(
            meet(store, prefix, rank, size, me.encode(), s.init_timeout or self.timeout))]
        order: dict[str, int] = {}
        self.nodes = tuple(order.setdefault(p.host_id, len(order)) for p in self.peers)
        if world_ranks is None and len(set(self.nodes)) > 1:  # a job across hosts
            check_listener(store, prefix, rank, size, host, listener, self.host_id, self.timeout)
        self.local_rank = local_rank if local_rank is not None else sum(
            1 for p in self.peers[:rank] if p.host_id == self.host_id)
        self.planner = Planner(rank, size, self.nodes, nchannels=self.nchannels,
                               slice_bytes=self.slice_bytes, algo_enabled=self.algo_enabled,
                               link=link_kind(self.nodes, s.transport), transport=s.transport,
                               debug=self.debug)
        self.fabric = build_fabric(Setup(rank, tuple(self.peers), store, prefix, secret,
                                         self.comm_id, self.slice_bytes, self.timeout, s),
                                   listener)
        self.collnet = None  # ringtree.switch.collnet.CollNet with RINGTREE_COLLNET_ENABLE=1
        if s.collnet_enable:
            from ringtree.switch.collnet import from_env

            self.collnet = self.planner.collnet = from_env(self)
        self.proto_enabled = parse_proto_spec(s.proto)
        self.ll = LLRunner.for_comm(self)
        self.planner.ll, self.planner.proto_enabled = self.ll, self.proto_enabled
        self.executor = Executor(rank, self.fabric, on_idle=self._idle)
        self.executor.on_error = self._on_error
        self.executor.on_busy = self._shut_hot
        self.progress = Progress(self.executor, f"ringtree-rank{rank}")
        self.flight = None  # ringtree.prof.flight.FlightRecorder, set by attach()
        attach(self)  # flight recorder, SIGUSR1 dump, doctor watcher, RINGTREE_PROFILE
        self.topology = tune_for(self)  # measured paths when ranks span hosts, else None

    def _idle(self) -> None:
        """The executor waits: has another rank aborted, or does one run another call?"""
        self._check_abort()
        if self.ll is not None:
            self.ll.check()

    def _shut_hot(self) -> None:
        """A state that keeps the hot entries out may have been set: the next one asks."""
        self._hot_off = True

    def _hot_blocked(self) -> bool:
        """Whether a hot entry must leave this call to the general path: a group open,
        broken, closed, async LL calls pending, async Simple work in flight (memory
        order), an active profiler. ``_hot_off`` is set to the answer, cleared *before*
        the states are read: a writer that sets a state after they were read sets it
        again, so it is never left False with a state set."""
        self._hot_off = False
        ex, ll = self.executor, self.ll
        if self._group is not None or self.health.broken is not None or self._closed or \
                ex.busy or ex.observer.active or ll is not None and ll.pending:
            self._hot_off = True
        return self._hot_off

    # ---- issuing ------------------------------------------------------------------------

    def _run(self, spec: CallSpec, async_op: bool, timeout: float | None):
        """Plan ``spec`` and run it now, hand it to the worker, or add it to the group."""
        self._check_usable()
        timeout = self._precheck(timeout)  # before the call takes a sequence number
        t = self.timeout if timeout is None else timeout
        online = self.planner.online
        if online is not None:  # measuring a choice (in plan) spends the call's deadline
            start = time.monotonic()
            online.deadline = start + t
        # may run tuning calls: before this call's number; a group's calls run on Simple
        plan = self.planner.plan(spec) if self._group is None else \
            self.planner.plan(spec, grouped=True)
        if online is not None:
            t = max(t - (time.monotonic() - start), 1e-3)
        if spec.coll is None:  # send/recv: numbered per (peer, tag, direction)
            key = (spec.root, spec.tag, spec.algo)
            seq = self._p2p_seq[key] = self._p2p_seq.get(key, 0) + 1
        else:
            seq = self.seq = self.seq + 1
        if plan.ll_op is not None:
            return self.ll.run(self, plan.ll_op, spec, seq, async_op, timeout)
        if plan.announce is not None:
            self.ll.announce(plan.announce)
        call = plan.bind(spec, seq, self.size)
        if self.flight is not None:
            self.flight.scheduled(call)
        if self.debug in ("INFO", "TRACE") and call.desc.seq <= 10:
            print(f"ringtree rank {self.rank}: {call.desc}", flush=True)
        result = spec.result
        if self._group is not None:
            work = Work(call.desc.name)
            self._group.append((call, work, result))
            return work if async_op else result
        if async_op:
            work = Work(call.desc.name)
            batch = self._submit([call], [work], [result], t)
            work.help = lambda: self.progress.help(batch)  # a waiter drives it itself
            return work
        self.progress.wait(self._submit([call], [None], [result], t))  # on this thread
        return result

    def _submit(self, calls: list[Call], works: list, results: list, timeout: float):
        """Queue calls as one batch: their steps join the channels in issue order, so
        they may overlap with anything still in flight."""
        self._check_usable()
        fr = self.flight

        def done(batch) -> None:  # runs on the driving thread, under the lock
            for c in calls:
                if c.plan is not None:
                    c.plan.busy = False  # its scratch and staging buffers are free again
            if fr is not None:
                fr.finished(calls, batch.error)
            for w, r in zip(works, results):
                if w is not None:
                    w._finish(r, batch.error)

        return self.progress.submit(calls, timeout, done,
                                    background=any(w is not None for w in works),
                                    before=None if fr is None else lambda: fr.started(calls))

    def _probe(self, channel: int, peers: list[int], test, work: Work, timeout: float):
        """A receive from any source, first half (:meth:`Executor.probe`): ``work``
        finishes with the first of ``peers`` whose message waits on ``channel``. It does
        so on the driving thread, under the lock: post the receive from another thread."""
        self._check_usable()
        return self.progress.probe(channel, peers, test, timeout,
                                   lambda b: work._finish(b.probe.peer, b.error))

    def synchronize(self, timeout: float | None = None) -> bool:
        """Wait until every operation issued so far has completed; False if ``timeout``
        seconds passed first (the operations go on)."""
        if self.ll is not None:
            self.ll.drain()
        return self.progress.synchronize(timeout)

    def _fail_pending(self, err: BaseException) -> None:
        """Fail every operation in flight with ``err`` (an abort: nothing is recorded)."""
        self.progress.cancel(err)

    @contextmanager
    def ungrouped(self):
        """Issue calls now, ahead of an open :meth:`group` (the online choice measures
        candidates at the first call of a size, which may be inside a group)."""
        group, self._group = self._group, None
        try:
            yield self
        finally:
            self._group = group
            self._hot_off = True

    @contextmanager
    def group(self):
        """Issue the enclosed operations as one (``ncclGroupStart``/``ncclGroupEnd``).

        Operations inside return at once; their results (and Works) are complete when the
        block exits. Sends and receives inside one group cannot deadlock each other.
        """
        self._group_depth += 1
        if self._group_depth == 1:
            self._group = []
            self._hot_off = True
        ok = False
        try:
            yield self
            ok = True
        finally:
            self._group_depth -= 1
            if self._group_depth == 0:
                items, self._group = self._group or [], None
                if ok and items:
                    run_group(items, self._submit, self.progress.wait, max(self.timeout, 1e-3))

    # ---- failure ------------------------------------------------------------------------

    def _on_error(self, e: BaseException) -> BaseException:
        """The executor failed: record it for every rank (:func:`ringtree.failure.on_error`)."""
        return failure.on_error(self, e)

    def _check_abort(self) -> None:
        """Called while waiting: raise if another rank has aborted the communicator."""
        failure.check_abort(self)

    def _precheck(self, timeout) -> float | None:
        """Before a call is numbered: the issuing thread, and its timeout."""
        if not self.background:
            self._owner.check(self.rank)
        return None if timeout is None else as_timeout(timeout)

    def bind_thread(self) -> None:
        """Make the calling thread the one that issues on this communicator (see
        :mod:`ringtree.runtime.owner`); call it at the same point on every rank."""
        self._owner.bind()

    def monitored_barrier(self, timeout: float | None = None,
                          wait_all_ranks: bool = True) -> None:
        """Barrier through the store that names the ranks that did not arrive
        (``torch.distributed.monitored_barrier``); see :mod:`ringtree.prof.watch`."""
        from ringtree.prof.watch import monitored_barrier

        self._monitored += 1
        monitored_barrier(self, self._monitored, timeout, wait_all_ranks)

    def _check_usable(self) -> None:
        if self._closed:
            raise CommAborted(f"rank {self.rank}: communicator is closed")
        broken = self.health.broken
        if broken is not None:
            raise (CommRevoked if isinstance(broken, CommRevoked) else CommAborted)(
                f"rank {self.rank}: communicator is unusable after an earlier error: {broken}")

    # ---- split / close ------------------------------------------------------------------

    def split(self, color: int, key: int | None = None) -> Communicator | None:
        """NCCL ``ncclCommSplit``: ranks with the same ``color`` form a new communicator,
        ordered by ``key`` (then by old rank); ``color < 0`` gets None. Collective."""
        key = self.rank if key is None else int(key)
        table = self.all_gather(np.array([int(color), key], dtype=np.int64))
        table = table.reshape(self.size, 2)
        self._splits += 1
        if color < 0:
            return None
        members = sorted((int(table[r, 1]), r) for r in range(self.size)
                         if table[r, 0] == color)
        ranks = [r for _, r in members]
        prefix = f"{self.prefix}/s{self._splits}c{int(color)}"
        return type(self)(rank=ranks.index(self.rank), size=len(ranks), store=self.store,
                          prefix=prefix, secret=self.secret, timeout=self.timeout,
                          master_addr=self.peers[self.rank].host,
                          world_ranks=tuple(self.world_ranks[r] for r in ranks))

    def new_group(self, ranks: list[int]) -> Communicator | None:
        """Communicator over ``ranks`` (in that order); None on ranks not in it. Collective."""
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < self.size for r in ranks):
            raise ValueError(f"new_group: invalid ranks {ranks} for size {self.size}")
        inside = self.rank in ranks
        return self.split(0 if inside else -1, ranks.index(self.rank) if inside else 0)

    def empty(self, shape, dtype="float32") -> np.ndarray:
        """An uninitialised NumPy array in this rank's registered memory (NCCL's
        ``ncclMemAlloc``): collectives whose every rank passes such buffers read the
        peers' data where it lies (:mod:`ringtree.runtime.protocols.ll_reg`). Not
        collective. Ranks that do not all share a host get a plain NumPy array."""
        reg = ll_reg.of(self)
        if reg is None:
            return np.empty(shape, np.dtype(dtype))
        return reg.arena.empty(shape, dtype)

    def zeros(self, shape, dtype="float32") -> np.ndarray:
        """:meth:`empty`, filled with zeros."""
        x = self.empty(shape, dtype)
        x[...] = 0
        return x

    def abort(self) -> None:
        """Tear down at once (``ncclCommAbort``): peers blocked on us get an error."""
        if self._closed:
            return
        err = failure.aborted_here(self, f"rank {self.rank} called abort()")
        self._fail_pending(err)  # Works in flight raise instead of hanging
        self.fabric.close()
        detach(self)
        self._closed = True
        self._hot_off = True
        self.progress.stop()

    def close(self) -> None:
        """Finish pending work and release sockets; rank 0's store outlives the others."""
        if self._closed:
            return
        try:
            self.synchronize()
        finally:
            detach(self)  # last status for the doctor; RINGTREE_PROFILE files
            self._closed = True
            self._hot_off = True
            self.progress.stop()
            self.fabric.close()
            if self._owns_store:
                try:
                    self.store.set(failure.closed_key(self, self.rank), b"1")
                    if self._server is not None:  # the others' closes, but the dead's
                        failure.await_closes(self, min(self.timeout, 30.0))
                except Exception:  # noqa: BLE001 - best effort at shutdown
                    pass
                self.store.close()
            if self._server is not None:
                self._server.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"<Communicator rank {self.rank}/{self.size} {self.prefix}>"

