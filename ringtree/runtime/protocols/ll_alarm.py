"""The LL thread's alarm: a one-shot timer it sleeps on, armed without waking it.

An async LL call is queued for the communicator's LL thread, and a thread that waits on
its Work runs the queue itself (:meth:`~.ll_runner.LLRunner.help`). Woken at every
submission, the LL thread mostly found the call already taken: on a rank's own core it
then took the GIL from the submitter in the middle of its round and handed it back, two
trips through the scheduler for nothing. On the AMD EPYC Zen 3 host, 2 ranks pinned, an
8-byte ``comm.all_reduce(x, async_op=True).wait()`` took 60-73 µs with the thread woken
and 27-39 µs with the waiter alone (``docs/design-notes.md``, "The general path's
argument checks, and what an async call costs").

So a submission arms this alarm instead (``timerfd_settime(2)``: a system call, nobody
woken) and the thread sleeps in ``poll(2)`` on it, the GIL released; a call nobody waits
for is taken by the thread once the alarm rings, at most ``RINGTREE_LL_ASYNC_US``
(:data:`GRACE`) after it was queued (MPI's nonblocking collectives progress only inside
MPI calls; here they progress on their own, a grace period late). Arming reprograms a
timer, ~15 µs on this (virtual) host, so only the first call since the thread last woke
arms it: a loop of calls and waits wakes the thread once per grace period. Once the
thread has taken a call that nobody waited for, calls overlap with other work and each
submission wakes it at once, until a thread waits for a call that is not done
(:mod:`ll_async`). Linux timerfds through ``ctypes`` (Python exposes them from 3.13 only):
where they are missing, :func:`make` returns None and the thread is woken at every
submission, as before.
"""

from __future__ import annotations

import ctypes
import os
import select

__all__ = ["GRACE", "Alarm", "make"]

CLOCK_MONOTONIC = 1
# seconds a queued async call waits at most for a thread to wait on it before the LL
# thread takes it (RINGTREE_LL_ASYNC_US). 2 ranks pinned, an 8-byte async all-reduce
# waited at once, alternated: 100 µs 69-86 µs a call (an arm and a wake-up every other
# call), 500 µs 39-47, 1 ms 38-44, the thread woken at every call 58-80
GRACE = 500e-6


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _spec(seconds: float) -> _Itimerspec:
    """A one-shot expiry ``seconds`` from when it is set."""
    ns = round(seconds * 1e9)
    return _Itimerspec(_Timespec(0, 0), _Timespec(ns // 1_000_000_000, ns % 1_000_000_000))


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    create, settime = libc.timerfd_create, libc.timerfd_settime
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return create, settime


class Alarm:
    """A one-shot timer (a Linux timerfd) that one thread sleeps on (:meth:`wait`) and
    others arm (or move) without waking it until it expires, or ring at once."""

    def __init__(self, seconds: float):
        create, self._settime = _libc()
        fd = create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"timerfd_create: {os.strerror(e)}")
        self.fd = fd
        self._on, self._now = _spec(seconds), _spec(1e-9)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def _set(self, spec: _Itimerspec) -> None:
        if self._settime(self.fd, 0, ctypes.byref(spec), None) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"timerfd_settime: {os.strerror(e)}")

    def arm(self) -> None:
        """Ring once, the grace period from now (a pending expiry moves)."""
        self._set(self._on)

    def ring(self) -> None:
        """Wake the sleeper now."""
        self._set(self._now)

    def wait(self, timeout: float) -> bool:
        """Sleep until the alarm rings or ``timeout`` seconds pass (GIL released); whether
        it rang."""
        if not self._poll.poll(timeout * 1e3):
            return False
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        """Only by the thread that sleeps on it: a descriptor closed under ``poll`` or
        ``read`` could be another file's by the time they ran."""
        os.close(self.fd)


def make(seconds: float) -> Alarm | None:
    """An :class:`Alarm` of ``seconds``, or None without timerfds (or with no grace)."""
    if seconds <= 0:
        return None
    try:
        return Alarm(seconds)
    except (OSError, AttributeError):
        return None
