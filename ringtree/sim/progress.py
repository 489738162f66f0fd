"""Progress of long simulations on stderr (only when it is a terminal), and peak memory."""

from __future__ import annotations

import resource
import sys
import time

from ringtree import sim


def peak_rss_mib() -> float:
    """Peak resident memory of this process or of the largest of its finished worker
    processes, MiB (Linux reports KiB)."""
    return max(resource.getrusage(who).ru_maxrss
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024


def cpu_seconds() -> float:
    """User and system time of this process and its finished worker processes."""
    return sum(u.ru_utime + u.ru_stime for u in
               map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


class Progress:
    """``[=====>    ] 12/28 ring 1048576 B  3.1 M events/s`` redrawn at most 10×/s.

    Also installs itself as the running simulation's progress callback, so a single
    long run moves the events-per-second figure too.
    """

    def __init__(self, total: int, stream=None) -> None:
        self.total, self.n, self.events, self.cur = total, 0, 0, 0
        self.stream = stream or sys.stderr
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = self.last = time.perf_counter()
        self.text = ""

    def __enter__(self) -> Progress:
        if self.on:
            self.token = sim._progress.set(self.tick)
        return self

    def __exit__(self, *exc) -> None:
        if self.on:
            sim._progress.reset(self.token)
            self.stream.write("\r\033[K")
            self.stream.flush()

    def label(self, text: str) -> None:
        self.text = text
        self.cur = 0
        self._draw(force=True)

    def tick(self, events: int) -> None:
        self.cur = events
        self._draw()

    def done_one(self, events: int) -> None:
        self.n += 1
        self.events += events
        self.cur = 0
        self._draw(force=True)

    def skip(self, k: int) -> None:
        self.n += k

    def _draw(self, force: bool = False) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        if not force and now - self.last < 0.1:
            return
        self.last = now
        width = 24
        fill = int(width * self.n / max(1, self.total))
        rate = (self.events + self.cur) / max(now - self.t0, 1e-9)
        self.stream.write(f"\r\033[K[{'=' * fill}{'>' if fill < width else ''}"
                          f"{' ' * max(0, width - fill - 1)}] {self.n}/{self.total} "
                          f"{self.text}  {rate / 1e6:.2f} M events/s")
        self.stream.flush()
