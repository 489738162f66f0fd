"""ringtree's daemon threads that run collectives or poll the store (the LL thread, the
progress worker, the doctor's answering thread) are let go and joined at interpreter exit
(ringtree.runtime.at_exit), so finalization never ends one inside native code: under
torch.distributed the doctor's thread polls torch's TCPStore, and ended inside that call
it aborted the process ("terminate called without an active exception")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from ringtree.testing import raise_first, run_ranks


def test_collective_threads_return_before_the_interpreter_finalizes():
    code = textwrap.dedent("""
        import atexit, threading
        import numpy as np
        import ringtree
        import ringtree.runtime.at_exit as ae

        comm = ringtree.init(rank=0, world_size=1)
        comm.all_reduce(np.ones(8, np.float32), async_op=True).wait()

        def mine():
            return [t.name for t in threading.enumerate()
                    if t.name.startswith(("ringtree-ll", "ringtree-rank", "ringtree-doctor"))]

        # atexit runs last-registered first: report, ringtree's hook, report again
        atexit.unregister(ae._release_all)
        atexit.register(lambda: print("after", mine()))
        atexit.register(ae._release_all)
        atexit.register(lambda: print("before", mine()))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert "ringtree-doctor" in lines["before"], p.stdout   # the threads were running
    assert lines["after"] == "[]", p.stdout       # and had returned after the hook


def _close_then_release(comm) -> tuple[bool, bool]:
    comm.all_reduce(np.ones(8, np.float32), async_op=True).wait()        # the LL thread
    comm.all_reduce(np.ones(1 << 20, np.float32), async_op=True, algo="ring").wait()  # worker
    ll, worker = comm.ll._thread, comm.progress.worker
    comm.close()
    return (ll is not None and comm.ll.release_thread() is ll,
            worker is not None and comm.progress.release_thread() is worker)


def test_threads_a_close_let_go_are_still_joined_at_exit():
    """comm.close() lets the LL thread and the progress worker go without waiting; one may
    still be returning from its last call (its frame holding the call's arrays) when the
    interpreter exits, so the exit hook must still get them from their owners."""
    for r, got in enumerate(raise_first(run_ranks(_close_then_release, 2, timeout=120))):
        assert got == (True, True), f"rank {r}: (LL thread, worker) joined at exit: {got}"
