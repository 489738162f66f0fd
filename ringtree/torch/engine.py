"""The torch backend's progress: a thin adapter over the core's streaming executor.

Every async call a process group issues is submitted to the communicator's executor in
background mode (``Communicator.background``) and driven by the core's worker thread, so
the thread that issues it (autograd's, for DDP's buckets) never waits for communication;
a thread that waits on its Work drives it itself (``Progress.help``), and a blocking call
(torch's ``opts.asyncOp`` False) runs on its caller's thread. The executor does the
scheduling: in-order issue per channel, sends to a peer posted in
program order, several calls in flight at once (an ``isend`` and the ``irecv`` after it
progress together), memory order between calls, deadlines, and failure (recorded for
every rank, then every pending call fails).

Here only what torch adds:

- *Latency*: the worker sleeps in the transports at most :data:`WAIT_CAP` while calls
  are in flight, so calls issued meanwhile start promptly (the transports offer no
  wake-up descriptor yet).
- *Receive from any source*: a probe (:meth:`~ringtree.runtime.executor.Executor.probe`) peeks
  each peer's connection on the tag's channel; for the first peer with a message waiting,
  ``on_match`` posts an ordinary receive. It runs on a thread of its own, never on the
  driving thread: it takes the process group's lock, which a thread holding that lock
  while it submits could otherwise deadlock against.
- The Works completed here finish on the driving thread (under the communicator's lock):
  their callbacks must not block. The process group resolves torch futures on its
  completion pool, so user callbacks run there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ringtree.errors import CommAborted
from ringtree.work import Work

WAIT_CAP = 0.002


class ProgressEngine:
    """Puts a communicator in background mode (``comm.background``: every call runs on
    the core's worker, any thread may issue) and adds receives from any source."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank
        comm.executor.wait_cap = min(comm.executor.wait_cap, WAIT_CAP)
        comm.background = True

    def probe(self, channel: int, peers: list[int], on_match: Callable[[int], None],
              timeout: float) -> Work:
        """Wait for a message from any of ``peers`` on ``channel``; call ``on_match(peer)``
        (on a thread of its own) for the first one found, which must post the receive.
        The Work finishes with the peer once ``on_match`` has returned."""
        work = Work("recv_anysource")
        found = Work("probe")

        def matched(w: Work) -> None:  # on the driving thread, under the lock
            if w.exception() is not None:
                work._finish(None, w.exception())
                return
            peer = w._result

            def post() -> None:
                err = None
                try:
                    on_match(peer)
                except BaseException as e:  # noqa: BLE001 - the Work carries it
                    err = e
                work._finish(peer, err)

            threading.Thread(target=post, name=f"ringtree-anysource-rank{self.rank}",
                             daemon=True).start()

        found.add_done_callback(matched)
        fabric = self.comm.fabric
        try:
            self.comm._probe(channel, peers, fabric.has_message, found, timeout)
        except BaseException as e:  # noqa: BLE001 - unusable communicator
            work._finish(None, e)
        return work

    def pending(self) -> bool:
        """Is anything submitted still in flight?"""
        return self.comm.executor.busy

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted call has finished; False on timeout."""
        return self.comm.synchronize(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish what is in flight (up to ``timeout``, then fail it)."""
        if not self.drain(timeout):
            self.abort(CommAborted(f"rank {self.rank}: shut down with operations still "
                                   f"pending after {timeout:g} s"))

    def abort(self, err: BaseException) -> None:
        """Fail everything pending with ``err``."""
        self.comm._fail_pending(err)
