"""The launcher's child processes: their setup, signals to their groups, and waiting.

As mpirun and torchrun do, each rank runs in its own process group (so a signal reaches
what it started too) and dies with the launcher (``PR_SET_PDEATHSIG``). The launcher
routes SIGINT/SIGTERM/SIGUSR1 into a list it handles in its loop, and sleeps on the
signal wake-up pipe, which SIGCHLD also writes, so it wakes when a rank exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

FORWARDED = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1


def child_setup(parent_pid: int, cpu: int | None = None) -> Callable[[], None]:
    """Runs in each rank between fork and exec: own process group, die with the launcher,
    pinned to ``cpu`` (``--bind-to core``)."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup() -> None:
        os.setpgid(0, 0)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent_pid:  # the launcher died before prctl took effect
                os._exit(1)

    return setup


def signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    """Signal each process's group (the rank and anything it started)."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)


def sleep_on(wait_fd: int | None, seconds: float) -> None:
    """Block until a child exits or a signal arrives (both write to wait_fd), or timeout."""
    if wait_fd is None:  # not the main thread: no signal wakeups, poll gently
        time.sleep(min(seconds, 0.1))
        return
    ready, _, _ = select.select([wait_fd], [], [], seconds)
    if ready:
        with contextlib.suppress(BlockingIOError):
            while os.read(wait_fd, 512):
                pass


@contextlib.contextmanager
def routed_signals(pending: list[int]) -> Iterator[int | None]:
    """Append SIGINT/SIGTERM/SIGUSR1 to ``pending``; yields the descriptor that SIGCHLD
    (and those) write to, for :func:`sleep_on` (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old = {s: signal.getsignal(s) for s in (*FORWARDED, signal.SIGUSR1, signal.SIGCHLD)}
    try:
        for s in (*FORWARDED, signal.SIGUSR1):
            signal.signal(s, lambda signum, _frame: pending.append(signum))
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        yield r
    finally:
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        os.close(r)
        os.close(w)

