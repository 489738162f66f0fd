"""Who drives the executor: the thread that waits, or the communicator's worker thread.

The executor makes progress only while some thread calls :meth:`Executor.drive`; exactly
one thread holds that *driver* role at a time, under one condition variable that also
guards the executor's state. A synchronous call drives until its own batch is done;
async work nobody waits on is driven by a worker thread started on first use; a thread
that finds another driving waits on the condition instead (the driver notifies when
batches complete). :meth:`Progress.drive_until` is the one loop that does this.

A thread that waits for async work (:meth:`Progress.help`, a Work's ``help``) takes the
driver role from the worker instead of sleeping until the worker has finished the work:
the worker gives it up at its next round (it is interrupted if asleep in the
transports) and resumes once nobody wants it. The message that completes the work then
wakes only the waiting thread, not the worker and then the waiter; with more ranks than
cores each of those wake-ups is a trip through the scheduler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ringtree.runtime import at_exit
from ringtree.runtime.batch import Batch
from ringtree.runtime.executor import Executor


class Progress:
    """The driver role, the worker thread and the lock around one executor."""

    def __init__(self, executor: Executor, name: str):
        self.executor = executor
        self.name = name
        self.cv = threading.Condition()                 # guards the executor's state
        self.driver: threading.Thread | None = None     # the thread making progress now
        self.worker: threading.Thread | None = None     # drives async work nobody waits on
        self.gone: threading.Thread | None = None       # the worker last let go (exit joins it)
        self.wanted = 0                                 # threads in help(): the worker yields

    def submit(self, calls: list, timeout: float, on_done: Callable[[Batch], None],
               *, background: bool, before: Callable[[], None] | None = None) -> Batch:
        """Queue ``calls`` as one batch (after ``before()``, under the lock);
        ``background``: make sure the worker drives it."""
        with self.cv:
            if before is not None:
                before()
            batch = self.executor.submit(calls, timeout, on_done)
            if background:
                self._start_worker()
                self.cv.notify_all()
        return batch

    def probe(self, channel: int, peers: list[int], test, timeout: float,
              on_done: Callable[[Batch], None]) -> Batch:
        """A receive from any source, driven by the worker (:meth:`Executor.probe`)."""
        with self.cv:
            batch = self.executor.probe(channel, peers, test, timeout, on_done)
            self._start_worker()
            self.cv.notify_all()
        return batch

    def wait(self, batch: Batch) -> None:
        """Block until ``batch`` completes, driving progress on this thread."""
        self.help(batch)
        if batch.error is not None:
            raise batch.error

    def synchronize(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted has completed; False if ``timeout`` passed."""
        end = None if timeout is None else time.monotonic() + timeout
        executor = self.executor
        return self.drive_until(lambda: not executor.busy,
                                None if end is None else lambda: time.monotonic() >= end)

    def drive_until(self, done: Callable[[], bool],
                    give_up: Callable[[], bool] | None = None) -> bool:
        """Drive (or wait for the driving thread) until ``done()``; False if ``give_up()``
        came first. The lock is released while the driver sleeps in the transports."""
        stop = done if give_up is None else (lambda: done() or give_up())
        with self.cv:
            while not done():
                if give_up is not None and give_up():
                    return False
                if self.driver is None:
                    self._drive(stop)
                else:
                    self.cv.wait(0.1)
        return True

    def help(self, batch: Batch) -> None:
        """Return once ``batch`` has completed, driving the executor on this thread (the
        worker, if it drives now, hands the role over); errors stay in the batch."""
        with self.cv:
            if batch.done:
                return
            self.wanted += 1
            try:
                while not batch.done:
                    if self.driver is None:
                        self._drive(lambda: batch.done)
                    else:
                        if self.driver is self.worker:
                            self.executor.fabric.interrupt()
                        self.cv.wait(0.1)
            finally:
                self.wanted -= 1
                self.cv.notify_all()  # the worker may go on with what is left

    def cancel(self, err: BaseException) -> None:
        """Fail everything in flight with ``err`` (an abort: nothing is recorded)."""
        with self.cv:
            self.executor.cancel(err)
            self.cv.notify_all()

    def stop(self) -> None:
        """Let the worker thread exit (it finishes the round it is in)."""
        with self.cv:
            if self.worker is not None:
                self.gone = self.worker
            self.worker = None
            self.cv.notify_all()

    def release_thread(self) -> threading.Thread | None:
        """:func:`ringtree.runtime.at_exit.register`'s hook: stop the worker and return it,
        or the one an earlier :meth:`stop` let go (a communicator closed before exit), which
        may still be returning."""
        self.stop()
        return self.gone

    def _drive(self, until: Callable[[], bool]) -> None:
        self.driver = threading.current_thread()
        try:
            self.executor.drive(until, self.cv)
        finally:
            self.driver = None
            self.cv.notify_all()

    def _start_worker(self) -> None:
        if self.worker is None:
            self.worker = threading.Thread(target=self._work_loop, daemon=True, name=self.name)
            self.worker.start()
            at_exit.register(self)

    def _work_loop(self) -> None:
        """Drive the executor whenever it has work and no caller is driving it."""
        me, executor = threading.current_thread(), self.executor
        with self.cv:
            while self.worker is me:
                if executor.busy and self.driver is None and not self.wanted:
                    try:
                        self._drive(lambda: not executor.busy or self.worker is not me or
                                    self.wanted > 0)
                    except BaseException as e:  # noqa: BLE001 - an unexpected failure:
                        executor.cancel(e)      # every Work in flight raises it
                else:
                    self.cv.wait(0.5)
