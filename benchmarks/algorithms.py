"""All-reduce time of every algorithm at a few sizes, on this machine.

    ringtree run -n 4 python benchmarks/algorithms.py [--sizes 8,64K,1M,16M] [--reps 7]

Each (algorithm, size) is timed in rounds interleaved across algorithms (so machine noise
hits all of them alike); a round is the mean of several back-to-back calls; the table
shows the median round in microseconds and, per size, marks the fastest. The tuner's own
choice is the ``auto`` row. Rank 0 prints; ``--json FILE`` saves the raw rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import ringtree
from ringtree.schedules import algorithms
from ringtree.schedules.stats import schedule_stats

SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * SUFFIX[text[-1]] if text[-1] in SUFFIX else int(text)


def runnable(n: int, comm) -> list[str]:
    out = []
    for a in algorithms("all_reduce"):
        try:
            schedule_stats(ringtree.ir.program.Collective.ALL_REDUCE, a, n,
                           ringtree.schedules.Options(nodes=comm.nodes))
        except ValueError:
            continue
        out.append(a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,64K,1M,16M")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    comm = ringtree.init()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    algos = [*runnable(comm.size, comm), "auto"]
    rounds: dict[tuple[str, int], list[float]] = {}
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), dtype=np.float32)
        calls = 50 if nbytes <= 64 << 10 else 10 if nbytes <= 1 << 20 else 3
        for a in algos:  # warm-up: plans, connections, buffers
            comm.all_reduce(x, algo=None if a == "auto" else a)
        for _ in range(args.reps):
            for a in algos:
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    comm.all_reduce(x, algo=None if a == "auto" else a)
                dt = (time.perf_counter() - t0) / calls
                worst = comm.all_reduce(np.array([dt]), "max")[0]
                rounds.setdefault((a, nbytes), []).append(float(worst))
    if comm.rank == 0:
        chosen = {nb: comm.planner.choose(ringtree.ir.program.Collective.ALL_REDUCE, nb)
                  for nb in sizes}
        med = {k: statistics.median(v) * 1e6 for k, v in rounds.items()}
        head = "algorithm".ljust(20) + "".join(f"{_fmt(nb):>12}" for nb in sizes)
        print(f"all_reduce, {comm.size} ranks, "
              f"{'+'.join(sorted({t.name for t in comm.fabric.transports}))}, "
              f"median of {args.reps} rounds, us")
        print(head)
        for a in algos:
            cells = []
            for nb in sizes:
                best = min(med[(b, nb)] for b in algos if b != "auto")
                mark = "*" if a != "auto" and med[(a, nb)] == best else " "
                cells.append(f"{med[(a, nb)]:>11.1f}{mark}")
            print(a.ljust(20) + "".join(cells))
        print("auto = " + ", ".join(f"{_fmt(nb)}: {chosen[nb]}" for nb in sizes))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({f"{a}@{nb}": v for (a, nb), v in rounds.items()}, f)
    comm.close()


def _fmt(nb: int) -> str:
    for s, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nb >= m and nb % m == 0:
            return f"{nb // m}{s}"
    return f"{nb}B"


if __name__ == "__main__":
    main()
