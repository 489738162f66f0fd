"""``-T``: nccl-tests' per-wait timeout for ``ringtree perf``."""

from __future__ import annotations

import contextlib
import os
import threading
import time


class Watchdog:
    """``-T``: a wait that takes longer than the timeout ends the process, like
    nccl-tests' ``testStreamSynchronize`` (ringtree ops also get ``timeout=``)."""

    def __init__(self, seconds: int, host: str):
        self.seconds, self.host = seconds, host
        self.deadline: float | None = None
        if seconds > 0:
            threading.Thread(target=self._watch, daemon=True, name="perf-watchdog").start()

    @contextlib.contextmanager
    def guard(self):
        if self.seconds <= 0:
            yield
            return
        self.deadline = time.monotonic() + self.seconds
        try:
            yield
        finally:
            self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            d = self.deadline
            if d is not None and time.monotonic() > d:
                # nccl-tests prints __FILE__ here; the entry point's path keeps the
                # message what it has always been
                print(f"{self.host}: Test timeout ({self.seconds}s) ringtree/perf/cli.py",
                      flush=True)
                os._exit(1)
