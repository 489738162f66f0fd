"""The README's simulator command, one algorithm at a time: wall, CPU and peak RSS.

    python benchmarks/sim_readme.py                      # every all-reduce algorithm
    python benchmarks/sim_readme.py --algos ring,tree --nodes 128 --timeout 330

runs ``ringtree sim all_reduce --topology dgx_h100_sharp --nodes N --algo A -b 8 -e 1G -v``
for each algorithm A in its own process (the default channels and model, as a user gets
them) and prints one line per algorithm: wall time, CPU time (user + system of the
process), peak resident memory, the events the simulator reports and the ranks it
simulated, or that it stopped at the timeout. The sum of the walls is what the one
``--algo all`` command costs (it runs the algorithms one after another).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time


def one(algo: str, nodes: int, timeout: float, topology: str) -> str:
    cmd = [sys.executable, "-m", "ringtree.cli", "sim", "all_reduce", "--topology", topology,
           "--nodes", str(nodes), "--algo", algo, "-b", "8", "-e", "1G", "-v"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{algo:20s} stopped after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    said = [ln for ln in p.stdout.splitlines() if "skipped" in ln]
    info = [ln for ln in p.stderr.splitlines() if ln.startswith(f"# {algo}:")]
    peak = [ln.rsplit("peak memory", 1)[1].strip() for ln in p.stderr.splitlines()
            if "peak memory" in ln]
    tail = said[0][2:] if said else info[0][2:] if info else p.stderr.strip()[-120:]
    return (f"{algo:20s} wall {wall:7.2f} s  cpu {cpu:7.2f} s  peak RSS "
            f"{peak[0] if peak else '?':>8}  {tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", default="", help="comma-separated (default: every one)")
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--topology", default="dgx_h100_sharp")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    from ringtree.schedules import algorithms

    algos = args.algos.split(",") if args.algos else algorithms("all_reduce")
    with open("/proc/loadavg") as f:
        print(f"# load average: {f.read().strip()}  ({os.cpu_count()} cores)")
    for a in algos:
        print(one(a, args.nodes, args.timeout, args.topology), flush=True)
    with open("/proc/loadavg") as f:
        print(f"# load average at the end: {f.read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
