"""Async LL calls: queued in issue order, run by the thread that waits for them or by the
communicator's LL thread.

An async call (``comm.all_reduce(x, async_op=True)``) on the LL protocol is queued, and
its Work's ``wait`` first runs the queue up to that call itself (:meth:`AsyncCalls.help`):
a waiter would only sleep until the LL thread had, and that hand-off is two trips
through the scheduler, most of a small call's time when ranks outnumber cores. Anything
else that takes a sequence number (a blocking LL call, a Simple call's announcement, the
measuring of :mod:`ll_stores` and :mod:`ll_crossover`) first runs what is queued
(:meth:`AsyncCalls.drain`). A call nobody waits for runs on the LL thread, which sleeps
on an alarm (:mod:`ll_alarm`) that a submission arms without waking it, and is woken at
each submission instead while calls overlap with other work (the alarm rang before
anyone waited for the last one). Mixed into
:class:`~ringtree.runtime.protocols.ll_runner.LLRunner`, whose ``pending`` (queued or
running calls) its hot paths read as a plain attribute.
"""

from __future__ import annotations

import threading
from collections import deque

from ringtree.runtime import at_exit
from ringtree.runtime.protocols import ll_alarm, ll_entry
from ringtree.work import Work

__all__ = ["AsyncCalls"]


class AsyncCalls:
    """The async queue of an LL runner (which provides ``run_arrays``)."""

    def _init_async(self) -> None:
        self.pending = 0  # calls queued or running
        self._running = False    # a queued call is being run (by the LL thread or a waiter)
        self._queue: deque = deque()
        # the queue's lock, taken as it is where nobody waits (a Condition's own `with`
        # is a Python frame: ~0.2 µs of a small async call, three times a call)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._helpers = 0  # threads in help() asleep on _cv until a running call ends
        self._thread: threading.Thread | None = None
        # what wakes the LL thread for a queued call nobody waits on (ll_alarm), made with
        # the thread; None: every submission notifies it (no timerfd, RINGTREE_LL_ASYNC_US=0)
        self.grace = ll_alarm.GRACE
        self._alarm: ll_alarm.Alarm | None = None
        self._armed = False  # it will ring (the LL thread has not woken on it since armed)
        # wake the LL thread at each submission: it took a call when the alarm rang (nobody
        # waited within the grace: calls overlap with work), until a thread waits for a
        # call that is not done (help: calls and waits follow each other, the alarm)
        self._eager = False
        self._on_cv = False  # the LL thread sleeps on _cv (a notify wakes it), not the alarm
        self._gone: threading.Thread | None = None  # the thread last let go (exit joins it)

    def submit(self, comm, op, inp, out, red, result, post, seq: int,
               timeout: float | None, entry: tuple | None = None) -> Work:
        """Queue call ``seq`` (``entry``: its C entry and completion for
        :func:`~.ll_entry.run_queued`, else it runs through ``run_arrays``)."""
        work = Work(op.name)
        work.help = lambda: self.help(work)
        with self._lock:
            self._queue.append((comm, op, inp, out, red, result, post, seq, timeout, entry,
                                work))
            self.pending += 1
            comm._hot_off = True
            if self._thread is None:
                self._alarm = alarm = ll_alarm.make(self.grace)
                self._thread = threading.Thread(target=self._loop, args=(alarm,), daemon=True,
                                                name=f"ringtree-ll-rank{comm.rank}")
                self._thread.start()
                at_exit.register(self)
            # the thread's deadline: the grace after the first call since it last woke
            # (later calls are taken no later than that). Arming is a system call that
            # reprograms a timer, ~15 µs in a VM, so it is not moved or disarmed per call:
            # a loop of calls and waits wakes the thread once per grace period
            if self._alarm is None or self._on_cv:
                self._cv.notify_all()
            elif not self._armed:
                self._alarm.arm()
                self._armed = True
        return work

    def drain(self) -> None:
        """Finish every async LL call issued so far, running the queued ones on this
        thread (in issue order, one at a time with the LL thread)."""
        self.help(None)

    def help(self, work: Work | None) -> None:
        """Run the queued calls up to and including ``work``'s (None: all) on this thread,
        in issue order and one at a time with the LL thread; return once ``work``'s call
        has been taken from the queue (by this thread or the LL thread), or, for None,
        once every call has finished."""
        self._eager = False
        while True:
            with self._lock:
                while self._running:
                    self._helpers += 1
                    try:
                        self._cv.wait(0.1)
                    finally:
                        self._helpers -= 1
                q = self._queue
                if work is None and not q or work is not None and not (
                        q and q[0][-1] is work or any(item[-1] is work for item in q)):
                    return
                item = q.popleft()
                self._running = True
            self._run_queued(item)
            if work is not None and item[-1] is work:
                return

    def _loop(self, alarm: ll_alarm.Alarm | None) -> None:
        rang = False
        try:
            while True:
                with self._cv:
                    while not self._queue or self._running:
                        if self._thread is not threading.current_thread():
                            return
                        if alarm is None or self._queue or self._eager:
                            self._on_cv = True  # woken by a call that ends, or (eager) by
                            self._cv.wait(0.5)  # the next submission
                            self._on_cv = False
                            continue
                        self._cv.release()  # asleep without the lock or the GIL
                        try:
                            rang = alarm.wait(0.5)
                        finally:
                            self._cv.acquire()
                        if rang and self._alarm is alarm:
                            self._armed = False
                    item = self._queue.popleft()
                    self._running = True
                    self._eager, rang = self._eager or rang, False
                self._run_queued(item)
        finally:
            if alarm is not None:
                alarm.close()

    def _run_queued(self, item: tuple) -> None:
        comm, op, inp, out, red, result, post, seq, timeout, entry, work = item
        try:
            if not (entry and ll_entry.run_queued(self, comm, op, *entry, inp, out, seq,
                                                  timeout)):
                self.run_arrays(comm, op, inp, out, red, result, post, seq, False, timeout)
            err = None
        except BaseException as e:  # noqa: BLE001 - the Work raises it
            err = e
        with self._lock:
            self.pending -= 1
            self._running = False
            if self._helpers or self._on_cv:
                self._cv.notify_all()
        work._finish(None if err is not None else result, err)

    def _let_go(self) -> None:
        with self._cv:
            if self._thread is not None:
                self._gone = self._thread
            self._thread = None
            if self._alarm is not None:  # the thread closes it once it is awake
                self._alarm.ring()
                self._alarm, self._armed = None, False
            self._cv.notify_all()

    def release_thread(self) -> threading.Thread | None:
        """:func:`ringtree.runtime.at_exit.register`'s hook: let the LL thread go and return
        it, or the one :meth:`close` let go, which may still be returning from its last
        call: its frame holds the call's arrays, and an array over a torch tensor freed
        after the interpreter began to finalize aborted the process ("terminate called
        without an active exception", torchrun's DDP example under load, about one run in
        thirty)."""
        self._let_go()
        return self._gone
