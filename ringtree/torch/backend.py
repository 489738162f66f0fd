"""``RingtreeProcessGroup``: a ``torch.distributed`` process group that runs on ringtree.

torch 2.13 accepts a pure-Python ``ProcessGroup`` subclass from a backend creator and
calls its methods — from Python for ``dist.*`` and through the pybind trampoline from C++
(DDP's Reducer, functional collectives). Every operation (:mod:`ringtree.torch.collectives`)
builds the ringtree call on the caller's thread (checks raise at once), submits it to the
communicator's streaming executor (through :class:`~ringtree.torch.engine.ProgressEngine`,
a thin adapter; the core's worker thread drives it until a thread waits on it) and returns
a :class:`~ringtree.torch.work.RingtreeWork` at once; the autograd thread that issues
DDP's bucket all-reduces never waits for communication. A blocking ``dist.*`` call
(``opts.asyncOp`` False) instead runs to completion on its caller's thread (``_now``),
and a single plain tensor's call skips all of this (:mod:`ringtree.torch.fastpath`).
This module holds the group's identity, the plumbing from ringtree Works to torch Works,
its lifetime, and the backend creator torch calls.

Groups: ``init_process_group("ringtree")`` and ``new_group(backend="ringtree")`` both
come through :func:`create_backend`, which builds a ringtree communicator over the store
torch passes (see :mod:`ringtree.torch.store`). A subgroup is thus a communicator of its
members only, made without involving non-members (so ``use_local_synchronization``
works); the group deliberately does not define torch's ``new_group`` delegation hook,
which in 2.13 would also capture ``new_group(backend="gloo")``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch.distributed as dist

import ringtree
from ringtree.errors import CommAborted
from ringtree.torch.collectives import CollectiveOps
from ringtree.torch.engine import ProgressEngine
from ringtree.torch.errors import for_torch
from ringtree.torch.fastpath import FastPath
from ringtree.torch.store import TorchStore, master_address, shared_secret
from ringtree.torch.tensors import run_all
from ringtree.torch.work import RingtreeWork, _seconds

BACKEND = "ringtree"


def _timeout_s(timeout: Any, default: float) -> float:
    t = _seconds(timeout)
    return default if t is None else t


class RingtreeProcessGroup(FastPath, CollectiveOps, dist.ProcessGroup):
    """A ringtree communicator behind torch's ProcessGroup interface (CPU tensors)."""

    def __init__(self, comm: ringtree.Communicator, timeout: float | None = None):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.timeout = float(timeout if timeout is not None else comm.timeout)
        self.engine = ProgressEngine(comm)
        self._lock = threading.RLock()
        # Futures are completed here, not on the driving thread: ``then`` callbacks may
        # block on further collectives (PowerSGD waits inside one). Threads are added only
        # while all existing ones are blocked, so the cap is a deadlock guard, not a cost.
        self._completer = ThreadPoolExecutor(max_workers=64,
                                             thread_name_prefix="ringtree-complete")
        self._group_name = ""
        self._group_desc = ""
        self._coalescing: list[RingtreeWork] | None = None
        self._closed = False

    @classmethod
    def from_store(cls, store, rank: int, size: int, timeout: float, *,
                   global_ranks: Sequence[int] | None = None) -> RingtreeProcessGroup:
        """Rendezvous over a c10d ``Store`` and return the group."""
        from ringtree.settings import current

        if current().explicit("RINGTREE_TIMEOUT"):
            timeout = current().timeout
        ts = TorchStore(store, timeout=timeout)
        secret = shared_secret(ts, rank)
        comm = ringtree.Communicator(
            rank=rank, size=size, store=ts, prefix="ringtree", secret=secret,
            master_addr=master_address(store), timeout=timeout,
            world_ranks=tuple(global_ranks) if global_ranks else None)
        return cls(comm, timeout)

    # ---- identity ------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - the trampoline's name
        return BACKEND

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    _set_group_name = setGroupName
    _set_group_desc = setGroupDesc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def _get_sequence_number_for_group(self) -> int:
        return self.comm.seq

    def _set_sequence_number_for_group(self) -> None:
        """ringtree numbers every collective itself."""

    def set_timeout(self, timeout: Any) -> None:
        self.timeout = _timeout_s(timeout, self.timeout)

    def __repr__(self) -> str:
        return (f"<RingtreeProcessGroup {self._group_name or '?'} rank {self.rank()}/"
                f"{self.size()}>")

    # ---- plumbing ------------------------------------------------------------------------

    def _tmo(self, opts: Any) -> float:
        return _timeout_s(getattr(opts, "timeout", None), self.timeout)

    def _launch(self, name: str, value: Any, issue: Callable[[], list],
                finishes: Sequence[Callable[[], None] | None] = (),
                timeout: float | None = None) -> RingtreeWork:
        """Issue ringtree operations (``issue`` returns their Works) as one torch Work;
        ``timeout`` (the group's by default) is what a timeout error reports."""
        work = RingtreeWork(name, value, self._dispatch)
        work._timeout_s = self.timeout if timeout is None else timeout
        with self._lock:
            if self._closed:
                raise CommAborted(f"ringtree process group {self._group_name!r} is shut down")
            parts = issue()
            if self._coalescing is not None:
                self._coalescing.append(work)
        work._parts = [p for p in parts if getattr(p, "help", None) is not None]
        self._when_all(work, parts, list(finishes))
        return work

    def _now(self, name: str, value: Any, run: Callable[[], object],
             finishes: Sequence[Callable[[], None] | None] = (),
             timeout: float | None = None) -> RingtreeWork:
        """A blocking call (torch's ``opts.asyncOp`` is False: its caller waits at once):
        run it to completion on this thread, in this group's issue order, and return its
        finished Work. Nothing is handed to another thread, so nothing has to wake one."""
        work = RingtreeWork(name, value, self._dispatch)
        work._timeout_s = self.timeout if timeout is None else timeout
        err = None
        with self._lock:
            if self._closed:
                raise CommAborted(f"ringtree process group {self._group_name!r} is shut down")
            try:
                run()
            except BaseException as e:  # noqa: BLE001 - the Work carries it
                err = e
        self._finish(work, list(finishes), err)
        return work

    def _blocking(self, opts: Any) -> bool:
        """Is the caller about to wait (``dist.*(async_op=False)``), outside coalescing?"""
        return not getattr(opts, "asyncOp", True) and self._coalescing is None

    def _when_all(self, work: RingtreeWork, parts: list, finishes: list) -> None:
        left = [len(parts)]
        errors: list[BaseException] = []
        guard = threading.Lock()

        def one_done(part) -> None:
            with guard:
                left[0] -= 1
                if part.exception() is not None:
                    errors.append(part.exception())
                last = left[0] == 0
            if last:
                self._finish(work, finishes, errors[0] if errors else None)

        if not parts:
            self._finish(work, finishes, None)
        for p in parts:
            p.add_done_callback(one_done)

    def _finish(self, work: RingtreeWork, finishes: list, err: BaseException | None) -> None:
        if err is None:
            try:
                run_all(finishes)
            except BaseException as e:  # noqa: BLE001
                err = e
        work._mark(None if err is None else
                   for_torch(err, self.rank(), work.name, work._timeout_s or self.timeout))

    def _dispatch(self, fn: Callable[[], None]) -> None:
        """Run a future's completion (and so its callbacks) on the completion pool."""
        try:
            self._completer.submit(fn)
        except RuntimeError:  # the pool is already shut down
            fn()

    # ---- lifetime ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish pending work (up to the group's timeout), then release the sockets."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.engine.stop(timeout=min(self.timeout, 60.0))
        finally:
            self.comm.close()
            self._release()

    def _release(self) -> None:
        self._drop_views()
        self._completer.shutdown(wait=False)
        self.comm.store.close()  # let torch's store (and its server socket) go

    def abort(self) -> None:
        """Fail everything pending and tear down at once; peers blocked on us get an error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.engine.abort(CommAborted(f"rank {self.rank()}: process group "
                                      f"{self._group_name!r} aborted"))
        self.comm.abort()
        try:  # let a call in flight fail first: it reads the abort line from the store
            self.engine.drain(min(self.timeout, 5.0))
        except Exception:  # noqa: BLE001 - an aborted communicator may refuse to wait
            pass
        self._release()

    # ---- failures: torch's get_error, and shrink_group (see ringtree.torch.shrink) ---------

    def get_error(self):
        """torch's ``ErrorType`` of this group's first failure (``SUCCESS``: none)."""
        from ringtree.torch.shrink import error_type

        return error_type(self.comm)

    @property
    def supports_shrinking(self) -> bool:
        return True

    def shrink(self, ranks_to_exclude: Sequence[int], shrink_flags: int = 0,
               opts: Any = None) -> RingtreeProcessGroup:
        """The group without ``ranks_to_exclude`` (``ncclCommShrink``'s contract: only the
        ranks that stay call it; ``SHRINK_ABORT`` fails this group's pending work first).
        ringtree revokes this group in every case, so a rank blocked on a dead one is
        released; this group is unusable afterwards."""
        with self._lock:
            if self._closed:
                raise CommAborted(f"ringtree process group {self._group_name!r} is shut down")
            self._closed = True
        if shrink_flags:
            self.engine.abort(CommAborted(f"rank {self.rank()}: process group "
                                          f"{self._group_name!r} shrinks (SHRINK_ABORT)"))
        child = self.comm.shrink(exclude=list(ranks_to_exclude))
        self._drop_views()
        self._completer.shutdown(wait=False)  # the store is the child's now: keep it open
        return type(self)(child, self.timeout)

    def _wait_for_pending_works(self) -> None:
        self.engine.drain(self.timeout)


def create_backend(dist_opts, backend_options=None) -> RingtreeProcessGroup:
    """The creator torch calls (``extended_api=True``): one group per call."""
    timeout = dist_opts.timeout
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    ranks = list(dist_opts.global_ranks_in_group or [])
    return RingtreeProcessGroup.from_store(dist_opts.store, dist_opts.group_rank,
                                           dist_opts.group_size, seconds,
                                           global_ranks=ranks or None)


def register() -> None:
    """Register backend ``"ringtree"`` for CPU tensors (idempotent; every process must
    do it before ``init_process_group`` — importing :mod:`ringtree.torch` does)."""
    dist.Backend.register_backend(BACKEND, create_backend, extended_api=True,
                                  devices=["cpu"])
