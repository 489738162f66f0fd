"""How a waiting rank should wait: sched_yield polling against sleeping on the doorbell.

For 2, 4 and 8 ranks on this host, a float32 all-reduce of 8 bytes, repeated, through
(a) the LL protocol and (b) the shm transport's slot rings (the Simple path), with two
waiting policies:

- ``bell``: spin for 50 µs when every rank has a core (none when they outnumber the
  cores), then sleep in ``poll(2)`` on the doorbell until a peer rings it;
- ``yield``: the same spin, then up to 2 ms of polls separated by ``os.sched_yield``,
  then the doorbell.

Per case: the median over repetitions of the slowest rank's time per call, and the CPU
time (user + system) a rank spends per call — the cost of waiting to everyone else.

    python benchmarks/ll_wait.py                  # 2, 4, 8 ranks, both paths (~1 min)
    python benchmarks/ll_wait.py --ranks 8 --reps 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from ringtree.dtypes import DType
from ringtree.ops import resolve
from ringtree.testing import raise_first, run_ranks

POLICIES = {"bell": 0.0, "yield": 2000.0}


def _spin(n: int) -> float:
    return 0.0 if n > (os.cpu_count() or 1) else 50.0


def _time(call, barrier, iters: int, reps: int) -> tuple[list[float], float]:
    for _ in range(min(iters, 100)):
        call()
    times, cpu = [], 0.0
    for _ in range(reps):
        barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(iters):
            call()
        times.append((time.perf_counter() - t0) / iters)
        cpu += (time.process_time() - c0) / iters
    return times, cpu / reps


def rank_ll(comm, yield_us: float, iters: int, reps: int):
    from ringtree.runtime.protocols.ll import LLCollectives
    from ringtree.transports.shm_ll import open_ll

    ll = open_ll(comm.store, comm.prefix + "/bench", comm.rank, comm.size, 60.0,
                 cell_bytes=4096, spin_us=_spin(comm.size), yield_us=yield_us)
    c = LLCollectives(ll, 60.0)
    x = np.zeros(2, np.float32)
    red = resolve("sum", DType.FLOAT32)
    res = _time(lambda: c.all_reduce(x, DType.FLOAT32, red), c.barrier, iters, reps)
    c.barrier()
    ll.close()
    return res


def rank_simple(comm, iters: int, reps: int):
    x = np.zeros(2, np.float32)
    return _time(lambda: comm.all_reduce(x), comm.barrier, iters, reps)


def measure(path: str, n: int, policy: str, iters: int, reps: int) -> tuple[float, float]:
    y = POLICIES[policy]
    if path == "LL":
        res = run_ranks(rank_ll, n, y, iters, reps, timeout=600)
    else:
        env = {"RINGTREE_SHM_YIELD_US": y, "RINGTREE_SHM_SPIN_US": _spin(n),
               "RINGTREE_PROTO": "Simple"}
        res = run_ranks(rank_simple, n, iters, reps, timeout=600, env=env)
    raise_first(res)
    slowest = [max(t) for t in zip(*[r[0] for r in res])]
    return statistics.median(slowest), statistics.mean(r[1] for r in res)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--paths", nargs="+", default=["LL", "Simple"], choices=["LL", "Simple"])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"# 8 B float32 all-reduce, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; median of {args.reps} reps of {args.iters} calls\n")
    print("| path | ranks | bell µs/call | yield µs/call | bell/yield | bell CPU µs/call "
          "| yield CPU µs/call |")
    print("|---|---|---|---|---|---|---|")
    for path in args.paths:
        for n in args.ranks:
            iters = max(200, args.iters // max(1, n // 2))
            (tb, cb), (ty, cy) = (measure(path, n, p, iters, args.reps) for p in POLICIES)
            print(f"| {path} | {n} | {tb * 1e6:.1f} | {ty * 1e6:.1f} | {tb / ty:.2f}× | "
                  f"{cb * 1e6:.1f} | {cy * 1e6:.1f} |", flush=True)
    print(f"\n# load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
