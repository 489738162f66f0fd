"""Rank 0's terminal for ``ringtree perf``: whole-line stdout and a stderr progress bar."""

from __future__ import annotations

import sys
import time


class Progress:
    """A progress bar on stderr for long sweeps: tqdm if installed, else a tiny one.
    It appears after ``delay`` seconds and is erased before each table line."""

    def __init__(self, total: int | None, desc: str, stream=None, delay: float = 2.0):
        self.stream = stream or sys.stderr
        self.total, self.desc, self.delay = total, desc, delay
        self.n, self.start, self.shown, self._tqdm = 0, time.monotonic(), False, None
        try:
            from tqdm import tqdm

            self._tqdm = tqdm(total=total, desc=desc, file=self.stream, delay=delay,
                              leave=False, unit="row", dynamic_ncols=True)
        except Exception:  # noqa: BLE001 - optional dependency, any version
            self._tqdm = None

    def update(self, k: int = 1) -> None:
        self.n += k
        if self._tqdm is not None:
            self._tqdm.update(k)
        else:
            self.refresh()

    def clear(self) -> None:
        if not self.shown:
            return
        if self._tqdm is not None:
            self._tqdm.clear()
        else:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def refresh(self) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.delay:
            return
        self.shown = True
        if self._tqdm is not None:
            self._tqdm.refresh()
            return
        if self.total:
            frac = min(1.0, self.n / self.total)
            bar = "#" * int(frac * 20)
            eta = elapsed / frac - elapsed if frac > 0 else 0.0
            text = (f"{self.desc} {frac:4.0%}|{bar:<20}| {self.n}/{self.total} "
                    f"[{elapsed:.0f}s<{eta:.0f}s]")
        else:
            text = f"{self.desc} {self.n} rows [{elapsed:.0f}s]"
        self.stream.write("\r\033[K" + text)
        self.stream.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self.clear()


class Printer:
    """Rank 0's stdout, written a whole line at a time (nccl-tests runs line-buffered)."""

    def __init__(self, enabled: bool, out=None):
        self.enabled = enabled
        self.out = out or sys.stdout
        self.partial = ""
        self.progress: Progress | None = None

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        self.partial += text
        if "\n" in self.partial:
            done, _, self.partial = self.partial.rpartition("\n")
            if self.progress is not None:
                self.progress.clear()
            self.out.write(done + "\n")
            self.out.flush()
            if self.progress is not None:
                self.progress.refresh()

    def line(self, text: str = "") -> None:
        self.write(text + "\n")

    def lines(self, texts) -> None:
        for t in texts:
            self.line(t)
