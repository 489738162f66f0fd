"""LL's compiled round against its Python steps, through the communicator a user calls.

For each rank count, a float32 all-reduce in place (``comm.all_reduce(x)``, the hot
path) of each size, run by ``ringtree run`` (pinned when the ranks fit the cores) with
``RINGTREE_LL_NATIVE=1`` and ``=0`` alternated run by run (A B A B ...), so both see the
same machine. Prints per case the median over runs of the slowest rank's µs per call and
the ratio Python ÷ kernel (above 1: the kernel is faster), and the Python-level function
calls per call on rank 0 (cProfile, a separate short run: what the kernel removed,
whatever the load).

    python benchmarks/ll_native.py                          # 2 and 4 ranks (~1 min)
    python benchmarks/ll_native.py --ranks 2 --sizes 8 64K 1M 16M --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from ringtree.perf.flags import parse_size

WORKER = r"""
import cProfile, json, sys, time
import numpy as np
import ringtree
c = ringtree.init()
sizes, profile = [int(s) for s in sys.argv[1].split(",")], sys.argv[2] == "1"
out = {}
for nbytes in sizes:
    x = np.ones(max(1, nbytes // 4), np.float32)
    iters = max(5, min(2000, (16 << 20) // max(nbytes, 1)))
    for _ in range(max(3, iters // 10)):
        c.all_reduce(x)
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            c.all_reduce(x)
        pr.disable()
        import pstats
        calls = sum(v[1] for v in pstats.Stats(pr).stats.values()) / 200
        out[nbytes] = calls
        continue
    c.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        c.all_reduce(x)
    dt = (time.perf_counter() - t) / iters
    worst = np.array([dt])
    c.all_reduce(worst, op="max")
    out[nbytes] = float(worst[0]) * 1e6
if c.rank == 0:
    print("RESULT", json.dumps(out), flush=True)
c.close()
"""


def run(n: int, sizes: list[int], native: bool, profile: bool) -> dict[int, float]:
    """One ``ringtree run`` of the worker; {size: µs per call (or calls per call)}."""
    env = {**os.environ, "RINGTREE_LL_NATIVE": "1" if native else "0"}
    launcher = os.path.join(os.path.dirname(sys.executable), "ringtree")
    cmd = [launcher, "run", "-n", str(n), sys.executable, "-c", WORKER,
           ",".join(map(str, sizes)), "1" if profile else "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    raise RuntimeError(f"{' '.join(cmd[:4])} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes", nargs="+", default=["8", "64K", "1M", "16M"])
    p.add_argument("--runs", type=int, default=5, help="runs of each variant, alternated")
    a = p.parse_args(argv)
    sizes = [parse_size(s, "--sizes") for s in a.sizes]
    from ringtree.transports import shm_native
    if not shm_native.available():
        print("the kernel is not built here (python setup.py build_ext --inplace)")
        return 1
    for n in a.ranks:
        times: dict[bool, dict[int, list[float]]] = {True: {}, False: {}}
        for _ in range(a.runs):
            for native in (True, False):
                for size, us in run(n, sizes, native, False).items():
                    times[native].setdefault(size, []).append(us)
        calls = {native: run(n, sizes, native, True) for native in (True, False)}
        print(f"\n{n} ranks, float32 all-reduce in place, µs per call (median of {a.runs} "
              "alternated runs; Python calls per call on rank 0)")
        print(f"{'bytes':>10} {'kernel':>10} {'Python':>10} {'ratio':>7} {'calls':>12}")
        for size in sizes:
            k = statistics.median(times[True][size])
            py = statistics.median(times[False][size])
            print(f"{size:>10} {k:>10.1f} {py:>10.1f} {py / k:>7.2f} "
                  f"{calls[True][size]:>5.0f} / {calls[False][size]:<5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
