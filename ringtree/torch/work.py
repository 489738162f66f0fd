"""``torch.distributed.Work`` for ringtree operations.

What torch and DDP need from a Work, and how this one provides it:

- ``get_future()`` returns a ``torch.futures.Future`` whose value is the list of output
  tensors (DDP copies the reduced bucket out of it; a future resolving to None crashes
  ``loss.backward()``). The future is completed on a small completion pool, never on the
  thread that moves bytes, so callbacks chained with ``then`` — DDP's, or a comm hook's
  that blocks on another collective (PowerSGD does) — can neither stall the engine nor
  deadlock it.
- Errors reach C++ callers as real future errors: a Python future's ``set_exception``
  only stores the exception as a value for C++ readers, so the future handed out is a
  ``then`` of a private one, and the callback re-raises the error.
- ``wait(timeout)`` raises the operation's error (ringtree's timeout, dead peer, mismatch)
  — ``_create_work_from_future`` would return True even when the future failed.
  ``is_completed()`` and ``is_success()`` tell the truth without blocking.
- ``_source_rank()`` gives the sender of a receive from any source.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ringtree.torch.errors import TorchCollectiveTimeout, for_torch
from ringtree.work import Work


def _unwrap(fut: torch.futures.Future) -> Any:
    ok, value = fut.value()
    if not ok:
        raise value
    return value


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    return None if timeout <= 0 else timeout


class RingtreeWork(Work, dist.Work):
    """The handle torch gets back from every ringtree process-group operation: a
    :class:`ringtree.work.Work` (completion, callbacks, result) that torch can hold."""

    def __init__(self, name: str, value: Any,
                 dispatch: Callable[[Callable[[], None]], None] | None = None):
        dist.Work.__init__(self)
        Work.__init__(self, name)
        self._result = value
        self._source = -1
        self._timeout_s: float | None = None
        # The future exists only once asked for (a plain ``wait()`` never pays for it);
        # ``dispatch`` runs its completion elsewhere than on the driving thread.
        self._dispatch = dispatch
        self._inner: torch.futures.Future | None = None
        self._future: torch.futures.Future | None = None
        self._parts: list = []  # the ringtree Works behind this one (their ``help``)

    # ---- completion (called by the process group) -------------------------------------

    def _mark(self, error: BaseException | None) -> None:
        """The operation is over: waiters wake now; a future, if any, follows."""
        self._finish(self._result, error)

    def _finished(self) -> Callable[[], None] | None:
        if self._inner is None:
            return None
        if self._dispatch is not None:
            dispatch = self._dispatch
            return lambda: dispatch(self._resolve)
        return self._resolve

    def _resolve(self) -> None:
        assert self._inner is not None
        if self._error is None:
            self._inner.set_result((True, self._result))
        else:
            self._inner.set_result((False, self._error))

    # ---- torch.distributed.Work --------------------------------------------------------

    def wait(self, timeout: Any = None) -> bool:
        t = _seconds(timeout)
        if t is None and not self._event.is_set():
            for part in self._parts:  # run queued LL calls here instead of sleeping
                if part.help is not None:
                    part.help()
        if not self._event.wait(t):
            raise TorchCollectiveTimeout(f"Timed out waiting {int(round((t or 0) * 1000))}ms "
                                         f"for {self.name} to complete (it goes on)")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._inner = torch.futures.Future()
                self._future = self._inner.then(_unwrap)
                done = self._event.is_set()
            else:
                return self._future
        if done:  # nobody can have chained a callback yet: complete it here
            self._resolve()
        return self._future

    def synchronize(self) -> None:
        """CPU work has no stream to join."""

    def _source_rank(self) -> int:
        return self._source

    def source_rank(self) -> int:
        return self._source

    def __repr__(self) -> str:
        state = "done" if self._event.is_set() else "pending"
        return f"<RingtreeWork {self.name} {state}>"


class _Collective(dist.Work):
    """What :class:`DoneWork` and :class:`PendingWork` share: a collective's Work on CPU."""

    __slots__ = ()

    def synchronize(self) -> None:
        """CPU work has no stream to join."""

    def _source_rank(self) -> int:
        return -1

    def source_rank(self) -> int:
        return -1


class DoneWork(_Collective):
    """The Work of a blocking call that has already succeeded (:mod:`ringtree.torch.fastpath`):
    no event, lock or future until one is asked for; a failed call gets a RingtreeWork."""

    def __init__(self, value: Any):
        dist.Work.__init__(self)
        self._result = value

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def __repr__(self) -> str:
        return "<RingtreeWork done>"


class PendingWork(_Collective):
    """The Work of an async call issued straight to the communicator
    (:mod:`ringtree.torch.fastpath`): the communicator's own :class:`ringtree.work.Work`
    (``part``) is its whole state, so nothing is chained on its completion (no callback,
    event or lock of this one) unless a future is asked for. The tensors are the call's own
    memory (no staging), so the result needs no copying back. Errors reach torch's caller
    as :func:`~ringtree.torch.errors.for_torch` words them, from ``wait()``."""

    __slots__ = ("_part", "_result", "_group", "_name", "_timeout_s", "_future", "_torch")

    def __init__(self, part: Work, value: Any, group: Any, name: str, timeout_s: float):
        dist.Work.__init__(self)
        self._part, self._result, self._group = part, value, group
        self._name, self._timeout_s = name, timeout_s
        self._future: torch.futures.Future | None = None
        self._torch: BaseException | None = None  # the error in torch's words, made once

    def _error(self) -> BaseException | None:
        e = self._part._error
        if e is not None and self._torch is None:
            self._torch = for_torch(e, self._group.rank(), self._name, self._timeout_s)
        return self._torch

    def wait(self, timeout: Any = None) -> bool:
        part = self._part
        t = _seconds(timeout)
        if t is None:
            if part.help is not None and not part._event.is_set():
                part.help()  # run the queued LL call on this thread
            part._event.wait()
        elif not part._event.wait(t):
            raise TorchCollectiveTimeout(f"Timed out waiting {int(round(t * 1000))}ms "
                                         f"for {self._name} to complete (it goes on)")
        if part._error is not None:
            raise self._error()
        return True

    def is_completed(self) -> bool:
        return self._part._event.is_set()

    def is_success(self) -> bool:
        return self._part._event.is_set() and self._part._error is None

    def exception(self) -> BaseException | None:
        return self._error()

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        """Completed on the group's completion pool (its callbacks may block on further
        collectives); an error is a real future error, as :class:`RingtreeWork`'s."""
        with _FUTURES:
            if self._future is not None:
                return self._future
            inner: torch.futures.Future = torch.futures.Future()
            self._future = inner.then(_unwrap)

        def resolve() -> None:
            err = self._error()
            inner.set_result((True, self._result) if err is None else (False, err))

        if self._part._event.is_set():  # nobody can have chained a callback yet
            resolve()
        else:
            self._part.add_done_callback(lambda _: self._group._dispatch(resolve))
        return self._future

    def __repr__(self) -> str:
        state = "done" if self._part._event.is_set() else "pending"
        return f"<RingtreeWork {self._name} {state}>"


_FUTURES = threading.Lock()  # makes a PendingWork's future once, whichever thread asks
