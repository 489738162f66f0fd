"""The Communicator's machinery: creation, transports, issuing calls, async work, groups,
split, failure propagation and shutdown. The collective methods users call live in
:mod:`ringtree.api` (a mixin), so this file stays about *how*, that one about *what*.

Failure propagation: a rank that hits an error (a peer that died, a mismatch, a timeout)
writes one line to the store under ``<prefix>/abort`` before closing its sockets. Every
other rank notices — through EOF on its sockets, or by looking at the store once a second
while it waits — and raises an error that carries that line, so each rank's message
names the rank that started the failure.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ringtree.bootstrap.rendezvous import meet
from ringtree.core.executor import Executor
from ringtree.core.ir import Collective, Program
from ringtree.core.plan import DEFAULT_SLICE_BYTES, Call, Desc, compile_program
from ringtree.core.tuner import MODELS, choose, parse_algo_spec
from ringtree.errors import CollectiveTimeout, CommAborted, MismatchError, PeerError
from ringtree.schedules import Options, algorithms, generate
from ringtree.settings import as_timeout, env_int, env_timeout
from ringtree.transports.tcp import make_listener
from ringtree.work import Work

P2P_CHANNEL_BASE = 64


@dataclass(frozen=True)
class Peer:
    """What a rank published at rendezvous."""

    rank: int
    host: str
    port: int
    host_id: str


class CommCore:
    """State and machinery shared by every Communicator method."""

    def __init__(self, *, rank: int, size: int, store, prefix: str, secret: bytes,
                 master_addr: str = "127.0.0.1", timeout: float | None = None,
                 server=None, world_ranks: tuple[int, ...] | None = None,
                 local_rank: int | None = None, owns_store: bool = False):
        from ringtree.bootstrap.job import host_identity
        from ringtree.bootstrap.netif import select_address
        from ringtree.transports.assign import build_fabric

        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} out of range for {size} ranks")
        self.rank, self.size = rank, size
        self.store, self.prefix, self.secret = store, prefix, secret
        self._server = server
        self._owns_store = owns_store
        self.world_ranks = world_ranks or tuple(range(size))
        self.timeout = as_timeout(timeout) if timeout is not None else env_timeout(
            "RINGTREE_TIMEOUT", 300.0)
        self.nchannels = max(1, env_int("RINGTREE_NCHANNELS", 1))
        self.slice_bytes = max(4096, env_int("RINGTREE_BUFFSIZE", 4 * DEFAULT_SLICE_BYTES) // 4)
        self.algo_enabled = parse_algo_spec(os.environ.get("RINGTREE_ALGO", ""))
        self.debug = os.environ.get("RINGTREE_DEBUG", "").upper()
        self.comm_id = hashlib.sha256(secret + prefix.encode()).digest()[:16]
        self.seq = 0
        self._p2p_seq: dict[tuple[int, int, str], int] = {}
        self._splits = 0
        self._broken: BaseException | None = None
        self._after_abort: str | None = None  # the first cause, when another rank failed
        self._failing = False
        from ringtree.core.owner import ThreadOwner

        self._owner = ThreadOwner()
        self.store_host_rank: int | None = None  # the rank whose process serves the store
        self._closed = False
        self._plans: dict = {}
        self._choices: dict = {}
        self._group: list[tuple[Call, Work | None, object]] | None = None
        self._group_depth = 0
        self._cv = threading.Condition()       # guards the executor's state
        self._driver: threading.Thread | None = None  # the thread making progress now
        self._worker: threading.Thread | None = None  # drives async work nobody waits on
        # An external progress engine (ringtree.torch) may take over running calls:
        # ``submit(call, result, timeout) -> Work``. None: this class runs them.
        self.submit = None

        host = select_address(None, master_addr)
        listener = make_listener(host)
        self.host_id = host_identity()
        me = f"{host}:{listener.getsockname()[1]}|{self.host_id}"
        peers = []
        init_timeout = env_timeout("RINGTREE_INIT_TIMEOUT", self.timeout)
        for r, rec in enumerate(meet(store, prefix, rank, size, me.encode(), init_timeout)):
            addr, _, hid = rec.decode().partition("|")
            h, _, p = addr.rpartition(":")
            peers.append(Peer(r, h, int(p), hid))
        self.peers = peers
        order: dict[str, int] = {}
        self.nodes = tuple(order.setdefault(p.host_id, len(order)) for p in peers)
        if world_ranks is None and len(set(self.nodes)) > 1:  # a job across hosts
            from ringtree.bootstrap import netcheck

            if netcheck.enabled():
                try:
                    netcheck.check_peers(store, prefix, netcheck.Advert.local(
                        rank, host, listener.getsockname()[1], self.host_id), size,
                        self.timeout)
                except BaseException:
                    listener.close()
                    raise
        self.local_rank = local_rank if local_rank is not None else sum(
            1 for p in peers[:rank] if p.host_id == self.host_id)
        self.fabric = build_fabric(self, listener)
        self.collnet = None  # ringtree.switch.collnet.CollNet with RINGTREE_COLLNET_ENABLE=1
        if os.environ.get("RINGTREE_COLLNET_ENABLE", "0").strip() not in ("", "0"):
            from ringtree.switch.collnet import from_env

            self.collnet = from_env(self)
        self.executor = Executor(rank, self.fabric, on_idle=self._check_abort,
                                 slice_bytes=self.slice_bytes)
        self.executor.on_error = self._on_error
        self.flight = None  # ringtree.prof.flight.FlightRecorder, set by attach()
        from ringtree.prof import attach

        attach(self)  # flight recorder, SIGUSR1 dump, doctor watcher, RINGTREE_PROFILE
        self.topology = None  # ringtree.core.topology.Topology when ranks span hosts
        if len(set(self.nodes)) > 1:
            from ringtree.core.topology import learn

            self.topology = learn(self, MODELS["tcp"].overhead)
            if self.debug in ("INFO", "TRACE") and rank == 0:
                print(f"ringtree: topology: {self.topology.describe()}", flush=True)

    # ---- issuing ----------------------------------------------------------------------

    def _choose_algo(self, coll: Collective, nbytes: int, algo: str | None) -> str:
        if algo is not None:
            return algo.lower()
        key = (coll, nbytes)
        cached = self._choices.get(key)
        if cached is None:
            opts = Options(channels=self.nchannels, nodes=self.nodes)
            model = self._model()
            enabled = self.algo_enabled.get(coll)
            if self.collnet is None:  # CollNet only where a switch was set up, as NCCL
                enabled = {a for a in (enabled or algorithms(coll))
                           if not a.startswith("collnet")}
            cached = choose(coll, nbytes, self.size, enabled, model, opts)
            if self.collnet is not None and cached.startswith("collnet"):
                cached = self.collnet.prefer(coll, nbytes, self.size, enabled, model, opts)
            if self.debug in ("INFO", "TRACE") and self.rank == 0 and len(self._choices) < 64:
                from ringtree.core.tuner import ranking

                rank_text = ", ".join(f"{a} {t * 1e6:,.0f}" for a, t in ranking(
                    coll, nbytes, self.size, self.algo_enabled.get(coll), model, opts)[:4])
                print(f"ringtree: {coll.value} {nbytes} B: chose {cached}; predicted us: "
                      f"{rank_text}", flush=True)
            if len(self._choices) > 4096:
                self._choices.clear()
            self._choices[key] = cached
        return cached

    def _collnet_algo(self, coll: Collective, algo: str, red, dt, nbytes: int,
                      explicit: bool) -> str:
        """``algo`` if the switch can serve this call; else a clear error when the caller
        asked for CollNet, or the best host algorithm when the tuner did (the switch
        reduces SUM, MIN and MAX on SHARP's dtypes only: never a wrong answer)."""
        from ringtree.switch.wire import check_call

        nnodes = len(set(self.nodes))
        if nnodes < 2:
            return algo  # one host: the schedule never reaches a switch
        if self.collnet is None:
            raise ValueError(f"{algo} runs on an in-network aggregation switch: set "
                             "RINGTREE_COLLNET_ENABLE=1 and RINGTREE_COLLNET_SWITCH=ADDR:PORT")
        op = None if red is None or red.user is not None else red.op
        why = check_call(op, dt, nbytes, nnodes)
        if why is None:
            return algo
        if explicit:
            raise ValueError(f"{algo}: {why}")
        host = {a for a in (self.algo_enabled.get(coll) or algorithms(coll))
                if not a.startswith("collnet")}
        return choose(coll, nbytes, self.size, host, self._model(),
                      Options(channels=self.nchannels, nodes=self.nodes))

    def _model(self):
        """The tuner's cost model: per link class when ranks span hosts."""
        if self.topology is None:
            return MODELS[self._link_kind()]
        from ringtree.core.tuner import host_model

        intra = "tcp" if os.environ.get("RINGTREE_TRANSPORT", "auto").strip().lower() \
            not in ("", "auto", "shm") else ("shm_crowded" if self.topology.crowded else "shm")
        return host_model(self.topology, MODELS[intra])

    def _link_kind(self) -> str:
        """The cost model every rank agrees on: shm when the whole job is on one host
        (and shm is not disabled; crowded when ranks outnumber its cores), else tcp."""
        same_host = len(set(self.nodes)) == 1
        if not same_host or os.environ.get("RINGTREE_TRANSPORT", "auto").strip().lower() \
                not in ("", "auto", "shm"):
            return "tcp"
        return "shm_crowded" if self.size > (os.cpu_count() or 1) else "shm"

    def _program(self, coll: Collective, algo: str, root: int) -> Program:
        opts = Options(root=max(root, 0), channels=self.nchannels, nodes=self.nodes)
        prog = generate(coll, algo, self.size, self.rank, opts)
        if self.collnet is not None and prog.meta.get("virtual_programs"):
            self.collnet.ensure(prog)  # join the switch groups this rank talks to
        return prog

    def _plan(self, coll: Collective, algo: str, root: int, in_blocks: tuple[int, ...],
              out_blocks: tuple[int, ...], count: int, itemsize: int, in_place: bool):
        """(Program, compiled steps), cached on cheap keys: hashing a Program (every step
        of every channel) on each call would cost more than a small collective."""
        key = (coll, algo, root, in_blocks, out_blocks, count, itemsize, in_place)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 512:
                self._plans.clear()
            prog = self._program(coll, algo, root)
            if in_place and not prog.in_place_ok:
                return prog, None
            plan = self._plans[key] = (prog, compile_program(
                prog, list(in_blocks), list(out_blocks), count, itemsize, self.slice_bytes,
                in_place))
        return plan

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _desc(self, coll: Collective, count: int, dtype, red, root: int, algo: str) -> Desc:
        return Desc(coll.value, count, dtype.value if dtype else "-", dtype.code if dtype else 0,
                    red.name if red else "-", red.code if red else 0, root, 0, algo,
                    coll.code)  # numbered in _issue, once the call is known to be valid

    def _issue(self, call: Call, async_op: bool, result: object, timeout: float | None):
        """Run now, hand to the progress thread, or add to the open group."""
        self._check_usable()
        timeout = self._precheck(timeout)  # before the call takes a sequence number
        if call.desc.algo != "p2p":
            call.desc.seq = self._next_seq()
            call.prefix = call.desc.prefix()
        if self.flight is not None:
            self.flight.scheduled(call)
        if self.debug in ("INFO", "TRACE") and call.desc.seq <= 10:
            print(f"ringtree rank {self.rank}: {call.desc}", flush=True)
        if self._group is not None:
            work = Work(call.desc.name)
            self._group.append((call, work, result))
            return work if async_op else result
        t = self.timeout if timeout is None else timeout
        if self.submit is not None:
            work = self.submit(call, result, t)
            return work if async_op else work.result()
        work = Work(call.desc.name) if async_op else None
        batch = self._submit([call], [work], [result], t)
        if async_op:
            return work
        self._wait(batch)
        return result

    def _submit(self, calls: list[Call], works: list, results: list, timeout: float):
        """Queue calls as one batch: their steps join the channels in issue order, so
        they may overlap with anything still in flight."""
        self._check_usable()
        fr = self.flight

        def done(batch) -> None:  # runs on the driving thread, under the lock
            if fr is not None:
                fr.finished(calls, batch.error)
            for w, r in zip(works, results):
                if w is not None:
                    w._finish(r, batch.error)

        with self._cv:
            if fr is not None:
                fr.started(calls)
            batch = self.executor.submit(calls, timeout, done)
            if any(w is not None for w in works):
                self._start_worker()
                self._cv.notify_all()
        return batch

    def _wait(self, batch) -> None:
        """Block until ``batch`` completes, driving progress if no other thread is."""
        with self._cv:
            while not batch.done:
                if self._driver is None:
                    self._driver = threading.current_thread()
                    try:
                        self.executor.drive(lambda: batch.done, self._cv)
                    finally:
                        self._driver = None
                        self._cv.notify_all()
                else:
                    self._cv.wait(0.1)
        if batch.error is not None:
            raise batch.error

    def _probe(self, channel: int, peers: list[int], test, work: Work, timeout: float):
        """A receive from any source, first half (:meth:`Executor.probe`): ``work``
        finishes with the first of ``peers`` whose message waits on ``channel``. It does
        so on the driving thread, under the lock: post the receive from another thread."""
        self._check_usable()
        with self._cv:
            batch = self.executor.probe(channel, peers, test, timeout,
                                        lambda b: work._finish(b.probe.peer, b.error))
            self._start_worker()
            self._cv.notify_all()
        return batch

    def _on_error(self, e: BaseException) -> BaseException:
        """The executor failed: record it for every rank and say who started it."""
        if isinstance(e, (PeerError, MismatchError, CollectiveTimeout, CommAborted)):
            return self._fail(e)
        return e

    # ---- async work -------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work_loop, daemon=True,
                                            name=f"ringtree-rank{self.rank}")
            self._worker.start()

    def _work_loop(self) -> None:
        """Drive the executor whenever it has work and no caller is driving it."""
        me = threading.current_thread()
        with self._cv:
            while self._worker is me:
                if self.executor.busy and self._driver is None:
                    self._driver = me
                    try:
                        self.executor.drive(
                            lambda: not self.executor.busy or self._worker is not me, self._cv)
                    except BaseException as e:  # noqa: BLE001 - an unexpected failure:
                        self.executor.cancel(e)  # every Work in flight raises it
                    finally:
                        self._driver = None
                        self._cv.notify_all()
                else:
                    self._cv.wait(0.5)

    def synchronize(self, timeout: float | None = None) -> bool:
        """Wait until every operation issued so far has completed; False if ``timeout``
        seconds passed first (the operations go on)."""
        import time

        end = None if timeout is None else time.monotonic() + timeout

        def over() -> bool:
            return end is not None and time.monotonic() >= end

        with self._cv:
            while self.executor.busy:
                if over():
                    return False
                if self._driver is None:
                    self._driver = threading.current_thread()
                    try:
                        self.executor.drive(lambda: not self.executor.busy or over(), self._cv)
                    finally:
                        self._driver = None
                        self._cv.notify_all()
                else:
                    self._cv.wait(0.1)
        return True

    _drain = synchronize

    def _fail_pending(self, err: BaseException) -> None:
        """Fail every operation in flight with ``err`` (an abort: nothing is recorded)."""
        with self._cv:
            self.executor.cancel(err)
            self._cv.notify_all()

    # ---- groups -----------------------------------------------------------------------

    @contextmanager
    def group(self):
        """Issue the enclosed operations as one (``ncclGroupStart``/``ncclGroupEnd``).

        Operations inside return at once; their results (and Works) are complete when the
        block exits. Sends and receives inside one group cannot deadlock each other.
        """
        self._group_depth += 1
        if self._group_depth == 1:
            self._group = []
        ok = False
        try:
            yield self
            ok = True
        finally:
            self._group_depth -= 1
            if self._group_depth == 0:
                items, self._group = self._group or [], None
                if ok and items:
                    from ringtree.core.aliasing import order_group

                    order_group([c for c, _, _ in items])
                    calls = [c for c, _, _ in items]
                    works = [w for _, w, _ in items]
                    results = [r for _, _, r in items]
                    self._wait(self._submit(calls, works, results, max(self.timeout, 1e-3)))

    # ---- failure ----------------------------------------------------------------------

    def _abort_key(self) -> str:
        return f"{self.prefix}/abort"

    def _check_abort(self) -> None:
        """Called while waiting: raise if another rank has aborted the communicator, or
        if the call we wait in is not the one the other waiting ranks are in."""
        try:
            why = self.store.try_get(self._abort_key())
        except Exception:  # noqa: BLE001 - the store itself may be gone
            return
        if why:
            kind = self.store.try_get(self._abort_key() + "_kind")
            raise (MismatchError if kind == b"mismatch" else CommAborted)(why.decode())
        from ringtree.core.fingerprint import check_stalled

        check_stalled(self)

    def _precheck(self, timeout) -> float | None:
        """Before a call is numbered: the issuing thread, and its timeout."""
        if self.submit is None:
            self._owner.check(self.rank)
        return None if timeout is None else as_timeout(timeout)

    def bind_thread(self) -> None:
        """Make the calling thread the one that issues on this communicator (see
        :mod:`ringtree.core.owner`); call it at the same point on every rank."""
        self._owner.bind()

    def _fail(self, e: BaseException) -> BaseException:
        """Record the failure for everyone, close the sockets, and say who started it.

        The first cause wins: a rank that fails because of another rank's failure (an
        abort line in the store, or a peer that closed and left its reason in shared
        memory) names that cause, never the peer that merely closed on its way out."""
        self._failing = True  # the doctor: this rank is reporting, not stuck
        if isinstance(e, CommAborted):
            err: BaseException = CommAborted(f"rank {self.rank}: communicator aborted by "
                                             f"another rank: {e}")
            return self._broken_by(err, str(e))
        reason = str(e)
        if isinstance(e, PeerError):
            store_ok = True
            try:  # a rank that fails writes why before it closes its sockets
                theirs = self.store.try_get(self._abort_key())
            except Exception:  # noqa: BLE001 - the store may have died with rank 0
                theirs, store_ok = None, False
            first = theirs.decode() if theirs else getattr(e, "cause", None)
            if first and self._abort_kind() == b"mismatch":  # the cause, and its type
                err = MismatchError(f"rank {self.rank}: {first}")
                self._broken = err
                self.fabric.close(first)
                return err
            if first:
                err = CommAborted(f"rank {self.rank}: lost the connection to rank {e.peer}; "
                                  f"the communicator was aborted because {first}")
                err.peer = e.peer  # type: ignore[attr-defined]
                self._record_abort(first)
                return self._broken_by(err, first)
            host = self.store_host_rank
            if not store_ok and host is not None and host != e.peer and host != self.rank:
                reason = (f"rank {host}, which hosts the store, is gone (its store at "
                          f"{self.store!r} is unreachable); seen by rank {self.rank} as: {e}")
                err = PeerError(host, reason)
                self._broken = err
                self.fabric.close(reason)
                return err
            reason = (f"rank {e.peer} died or closed its connection (seen by rank "
                      f"{self.rank}): {e}")
            err = PeerError(e.peer, reason)
        else:
            err = e
        if isinstance(err, CollectiveTimeout):  # a partition? say whom we cannot reach
            from ringtree.bootstrap.netcheck import unreachable_note

            note = unreachable_note([(p.rank, p.host, p.port) for p in self.peers
                                     if p.host_id != self.host_id])
            err = CollectiveTimeout(f"{err}{note}") if note else err
        if isinstance(err, (CollectiveTimeout, PeerError)):  # ask every rank; name the culprit
            from ringtree.prof.watch import with_diagnosis

            err = with_diagnosis(self, err)
            reason = str(err)
        won = self._record_abort(reason)
        if won == reason and isinstance(err, MismatchError):
            try:
                self.store.compare_set(self._abort_key() + "_kind", None, b"mismatch")
            except Exception:  # noqa: BLE001
                pass
        if won is not None and won != reason and isinstance(err, (CollectiveTimeout,
                                                                  PeerError)):
            err = CommAborted(f"rank {self.rank}: the communicator was aborted because "
                              f"{won}\n(this rank then saw: {str(e).splitlines()[0]})")
            return self._broken_by(err, won)
        self._broken = err
        self.fabric.close(reason)
        return err

    def _abort_kind(self) -> bytes | None:
        try:
            return self.store.try_get(self._abort_key() + "_kind")
        except Exception:  # noqa: BLE001 - the store may be gone
            return None

    def _record_abort(self, reason: str) -> str | None:
        """Write the abort line unless one exists; the line that stands (None: no store)."""
        try:
            return self.store.compare_set(self._abort_key(), None, reason.encode()).decode()
        except Exception:  # noqa: BLE001 - the store may be gone
            return None

    def _broken_by(self, err: BaseException, cause: str) -> BaseException:
        """Fail because of another rank's failure ``cause``: leave our state for the
        doctor ("exited after the abort", not "stuck"), pass the cause on as we close."""
        self._broken = err
        self._after_abort = cause
        from ringtree.prof.watch import publish_closed

        publish_closed(self)
        self.fabric.close(cause)
        return err

    def monitored_barrier(self, timeout: float | None = None,
                          wait_all_ranks: bool = True) -> None:
        """Barrier through the store that names the ranks that did not arrive
        (``torch.distributed.monitored_barrier``); see :mod:`ringtree.prof.watch`."""
        from ringtree.prof.watch import monitored_barrier

        monitored_barrier(self, timeout, wait_all_ranks)

    def _check_usable(self) -> None:
        if self._closed:
            raise CommAborted(f"rank {self.rank}: communicator is closed")
        if self._broken is not None:
            raise CommAborted(f"rank {self.rank}: communicator is unusable after an earlier "
                              f"error: {self._broken}")

    # ---- split / close ----------------------------------------------------------------

    def split(self, color: int, key: int | None = None):
        """NCCL ``ncclCommSplit``: ranks with the same ``color`` form a new communicator,
        ordered by ``key`` (then by old rank); ``color < 0`` gets None. Collective."""
        key = self.rank if key is None else int(key)
        mine = np.array([int(color), key], dtype=np.int64)
        table = self.all_gather(mine).reshape(self.size, 2)  # type: ignore[attr-defined]
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

    def new_group(self, ranks: list[int]):
        """Communicator over ``ranks`` (in that order); None on ranks not in it. Collective."""
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < self.size for r in ranks):
            raise ValueError(f"new_group: invalid ranks {ranks} for size {self.size}")
        inside = self.rank in ranks
        return self.split(0 if inside else -1, ranks.index(self.rank) if inside else 0)

    def abort(self) -> None:
        """Tear down at once (``ncclCommAbort``): peers blocked on us get an error."""
        if self._closed:
            return
        try:
            self.store.compare_set(self._abort_key(), None,
                                   f"rank {self.rank} called abort()".encode())
        except Exception:  # noqa: BLE001
            pass
        self._broken = self._broken or CommAborted(f"rank {self.rank} aborted")
        self._fail_pending(self._broken)  # Works in flight raise instead of hanging
        self.fabric.close()
        from ringtree.prof import detach

        detach(self)
        self._closed = True
        self._stop_worker()

    def close(self) -> None:
        """Finish pending work and release sockets; rank 0's store outlives the others."""
        if self._closed:
            return
        try:
            self._drain()
        finally:
            from ringtree.prof import detach

            detach(self)  # last status for the doctor; RINGTREE_PROFILE files
            self._closed = True
            self._stop_worker()
            self.fabric.close()
            if self._owns_store:
                try:
                    self.store.add(f"{self.prefix}/closed", 1)
                    if self._server is not None:
                        self._wait_all_closed()
                except Exception:  # noqa: BLE001 - best effort at shutdown
                    pass
                self.store.close()
            if self._server is not None:
                self._server.close()

    def _wait_all_closed(self) -> None:
        import time

        deadline = time.monotonic() + min(self.timeout, 30.0)
        while time.monotonic() < deadline:
            raw = self.store.try_get(f"{self.prefix}/closed")
            if raw is not None and int(raw) >= self.size:
                return
            time.sleep(0.02)

    def _stop_worker(self) -> None:
        with self._cv:
            self._worker = None
            self._cv.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"<Communicator rank {self.rank}/{self.size} {self.prefix}>"


def new_secret() -> bytes:
    return secrets.token_bytes(16)
