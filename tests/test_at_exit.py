"""ringtree's daemon threads that run collectives or poll the store (the LL thread, the
progress worker, the doctor's answering thread) are let go and joined at interpreter exit
(ringtree.core.at_exit), so finalization never ends one inside native code: under
torch.distributed the doctor's thread polls torch's TCPStore, and ended inside that call
it aborted the process ("terminate called without an active exception")."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_collective_threads_return_before_the_interpreter_finalizes():
    code = textwrap.dedent("""
        import atexit, threading
        import numpy as np
        import ringtree
        import ringtree.core.at_exit as ae

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
