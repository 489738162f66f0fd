"""ringtree's own threads stop before the interpreter finalizes.

The progress worker and the LL thread are daemon threads, so a program never waits for
them. But a daemon thread still alive when the interpreter finalizes is ended where it
stands the next time it takes the GIL; if that is inside native C++ code (a torch op
on the reduction path, a torch future's completion), the forced unwind meets a
``noexcept`` frame and the whole process aborts with "terminate called without an
active exception" (SIGABRT) after the program has finished. So at exit each registered
owner is asked to let its thread go, and the threads are given a moment to return: a
thread idle in a wait returns at once, so the allowance only matters for one still inside
a native call (a store poll through torch's TCPStore, say), which on a machine running
more ranks than it has cores can take seconds to come back.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Protocol

__all__ = ["register"]

JOIN_S = 10.0  # how long exit waits, in all, for the threads to return


class ThreadOwner(Protocol):
    def release_thread(self) -> threading.Thread | None:
        """Ask the owned thread to return; give it back (None if there is none)."""


_OWNERS: weakref.WeakSet = weakref.WeakSet()


def register(owner: ThreadOwner) -> None:
    """Stop ``owner``'s thread at interpreter exit (held weakly: no lifetime change)."""
    _OWNERS.add(owner)


@atexit.register
def _release_all() -> None:
    me = threading.current_thread()
    threads = [t for t in (o.release_thread() for o in list(_OWNERS))
               if t is not None and t is not me]
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
