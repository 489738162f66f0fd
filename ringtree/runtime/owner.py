"""One issuing thread per communicator.

Ranks match collectives by the order they are issued. Two threads issuing on one
communicator interleave differently on every rank, so rank 0's first call may meet rank
1's second: same shape, same dtype — the fingerprint agrees and the sums are silently
wrong. No rule local to one rank can order threads across ranks, so ringtree refuses it:

- the thread that created the communicator owns it (every rank creates it in its own
  main flow, so every rank has the same owner);
- another thread's operation raises ``RuntimeError`` (before anything is sent) while the
  owner is alive, saying what to do: give each thread its own communicator
  (``comm.split`` / ``comm.new_group``, created in the same order on every rank), or hand
  the communicator over with :meth:`bind_thread` in the new thread, at the same point of
  the call sequence on every rank;
- when the owner has exited, the next thread to issue takes over (one thread left).

Waiting on a :class:`~ringtree.work.Work`, ``synchronize`` and the background progress
thread are not operations and may run anywhere. A communicator driven by an external
progress engine (the torch backend, which orders issue itself) is not checked.
"""

from __future__ import annotations

import threading

__all__ = ["ThreadOwner"]


class ThreadOwner:
    """``ident``: the owner's ``threading.get_ident()``, so that a hot path can test
    ``owner.ident == get_ident()`` (one C call) before calling :meth:`check`."""

    __slots__ = ("thread", "ident")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = threading.current_thread()
        self.ident = threading.get_ident()

    def check(self, rank: int) -> None:
        me = threading.current_thread()
        owner = self.thread
        if owner is me:
            return
        if owner is None or not owner.is_alive():
            self.thread, self.ident = me, threading.get_ident()
            return
        raise RuntimeError(
            f"rank {rank}: this communicator is used by thread {owner.name!r} and now by "
            f"{me.name!r}. Collectives match by issue order, which two threads cannot keep "
            "the same on every rank (the results would be silently wrong). Give each thread "
            "its own communicator (comm.split(color) or comm.new_group(ranks), created in "
            "the same order on every rank), or hand it over with comm.bind_thread() in the "
            "new thread at the same point on every rank.")

    def bind(self) -> None:
        self.thread, self.ident = threading.current_thread(), threading.get_ident()
