"""Kill/replace cycles: does recovering again and again leave anything behind?

``python benchmarks/recovery.py --cycles 50 [--ranks 3]`` runs one job under
``ringtree run -n N --max-restarts CYCLES``. In cycle ``c`` rank ``1 + c mod (N-1)``
SIGKILLs itself after an all-reduce; the survivors' next all-reduce fails naming it, they
call ``comm.replace()``, the launcher starts a newcomer with that rank (``RINGTREE_JOIN=1``)
and ``ringtree.init`` seats it; rank 0 broadcasts the cycle number and every rank checks
an all-reduce (exact sums) on the new communicator. Rank 0 never dies: it counts its file
descriptors, threads named ``ringtree-*`` and shared-memory names carrying its pid after
cycle 1 and after the last cycle (after ``gc.collect()``; a closed communicator's
descriptors go when the collector frees its reference cycles). Every process of the job
writes its pid to a scratch directory; after the launcher exits the driver checks that
none of them is still running and that no ``/dev/shm`` name carries any of their pids.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

SHM_DIR = "/dev/shm"


def held() -> dict:
    """This process's descriptors, ringtree threads and shared-memory names."""
    gc.collect()
    time.sleep(0.6)  # a worker let go exits at its next wake-up (0.5 s)
    gc.collect()
    mine = f"-p{os.getpid()}-"
    return {"fds": len(os.listdir(f"/proc/{os.getpid()}/fd")),
            "threads": sorted(t.name for t in threading.enumerate()
                              if t.name.startswith("ringtree-")),
            "shm": sorted(n for n in os.listdir(SHM_DIR) if mine in n)}


def worker(cycles: int, out: str) -> None:
    """One rank of the cycling job (run by ``ringtree run``)."""
    import ringtree

    with open(os.path.join(out, f"pid-{os.getpid()}"), "w"):
        pass
    comm = ringtree.init()
    c, seen, x = 0, {}, None
    while True:
        cnum = np.array([c], np.int64)
        comm.broadcast(cnum, root=0)  # a newcomer learns the cycle from rank 0
        c = int(cnum[0])
        x = np.full(1 << 16, comm.rank + 1.0, np.float32)
        comm.all_reduce(x)
        if x.min() != x.max() or x[0] != comm.size * (comm.size + 1) / 2:
            raise AssertionError(f"rank {comm.rank}: cycle {c}: wrong sum {x[0]}")
        if comm.rank == 0 and c in (1, cycles):
            seen[c] = held()
        if c == cycles:
            break
        if comm.rank == 1 + c % (comm.size - 1):
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(x, timeout=120)
        except ringtree.RingtreeError:
            pass
        comm = comm.replace()
        c += 1
    comm.close()
    if comm.rank == 0:
        with open(os.path.join(out, "rank0.json"), "w") as f:
            json.dump({"cycles": c, "size": comm.size, "sum": float(x[0]), "held": seen}, f)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def drive(cycles: int, ranks: int, timeout: float = 3600.0) -> dict:
    """Run the job and report what is left behind (see the module docstring)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", str(ranks),
               "--max-restarts", str(cycles), sys.executable, os.path.abspath(__file__),
               str(cycles), out]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        seconds = time.monotonic() - t0
        pids = [int(n[4:]) for n in os.listdir(out) if n.startswith("pid-")]
        time.sleep(0.5)
        running = [p for p in pids if _alive(p)]
        names = [n for n in os.listdir(SHM_DIR) if any(f"-p{p}-" in n for p in pids)]
        try:
            with open(os.path.join(out, "rank0.json")) as f:
                rank0 = json.load(f)
        except OSError:
            rank0 = None
    first, last = (rank0 or {}).get("held", {}).get("1"), (rank0 or {}).get("held", {}).get(
        str(cycles))
    return {"cycles": cycles, "ranks": ranks, "exit": proc.returncode, "seconds": seconds,
            "processes": len(pids), "still_running": running, "shm_left": names,
            "rank0": rank0, "fds_growth": (last["fds"] - first["fds"]) if first and last
            else None, "stderr_tail": proc.stderr[-2000:] if rank0 is None else ""}


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2])
