"""Where LL stops paying: LL against Simple (the executor's schedules) per collective and size.

For each rank count and collective, times calls of each size through the LL protocol
(``ringtree.runtime.protocols.ll``, cells large enough for every size) and through the
communicator with ``RINGTREE_PROTO=Simple``, alternating the two in every repetition so
both see the same machine. Prints the median time per call (slowest rank), the ratio
Simple/LL (> 1: LL faster) and the largest size where LL still wins — the numbers behind
:data:`ringtree.tuning.proto.THRESHOLDS`.

    python benchmarks/ll_threshold.py                       # 2 and 4 ranks (~2 min)
    python benchmarks/ll_threshold.py --ranks 2 --colls all_reduce --reps 9
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

COLLS = ["all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather"]
SIZES = [8, 512, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
CELL = 1 << 20


def _calls(comm, ll, coll: str, nbytes: int):
    """(LL call, Simple call) moving ``nbytes`` in total."""
    n, f32 = comm.size, DType.FLOAT32
    red = resolve("sum", f32)
    count = max(1, nbytes // 4)
    if coll in ("reduce_scatter", "all_gather"):
        count = max(1, count // n)
    x = np.zeros(count * n if coll == "reduce_scatter" else count, np.float32)
    out = np.zeros(count * n if coll == "all_gather" else count, np.float32)
    if coll == "all_reduce":
        return (lambda: ll.all_reduce(x, f32, red)), (lambda: comm.all_reduce(x))
    if coll == "reduce":
        return (lambda: ll.reduce(x, f32, red, 0)), (lambda: comm.reduce(x, 0))
    if coll == "broadcast":
        return (lambda: ll.broadcast(x, f32, 0)), (lambda: comm.broadcast(x, 0))
    if coll == "all_gather":
        return (lambda: ll.all_gather(x, f32, out)), (lambda: comm.all_gather(x, out=out))
    return (lambda: ll.reduce_scatter(x, f32, red, out)), \
        (lambda: comm.reduce_scatter(x, out=out))


def rank(comm, colls: list[str], sizes: list[int], reps: int):
    from ringtree.runtime.protocols.ll import LLCollectives
    from ringtree.transports.shm_ll import open_ll

    crowded = comm.size > (os.cpu_count() or 1)
    ll = LLCollectives(open_ll(comm.store, comm.prefix + "/thr", comm.rank, comm.size, 60.0,
                               cell_bytes=CELL, spin_us=0.0 if crowded else 50.0,
                               yield_us=2000.0), 60.0)
    res = {}
    for coll in colls:
        for nbytes in sizes:
            fl, fs = _calls(comm, ll, coll, nbytes)
            iters = max(5, min(300, (8 << 20) // max(nbytes, 1)))
            for f in (fl, fs, fl, fs):
                f()
            tl, ts = [], []
            for _ in range(reps):
                for f, out in ((fl, tl), (fs, ts)):
                    ll.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        f()
                    out.append((time.perf_counter() - t0) / iters)
            res[(coll, nbytes)] = (tl, ts)
    ll.barrier()
    ll.ll.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--colls", nargs="+", default=COLLS, choices=COLLS)
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"# float32, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; median of "
          f"{args.reps} reps, slowest rank; µs per call; ratio = Simple / LL\n")
    for n in args.ranks:
        res = raise_first(run_ranks(rank, n, args.colls, args.sizes, args.reps,
                                    timeout=1800, env={"RINGTREE_PROTO": "Simple"}))
        print(f"### {n} ranks\n")
        print("| collective | " + " | ".join(f"{s} B" for s in args.sizes) +
              " | LL wins up to |")
        print("|---" * (len(args.sizes) + 2) + "|")
        for coll in args.colls:
            cells, best = [], 0
            for s in args.sizes:
                tl = statistics.median(max(r[(coll, s)][0][k] for r in res)
                                       for k in range(args.reps))
                ts = statistics.median(max(r[(coll, s)][1][k] for r in res)
                                       for k in range(args.reps))
                cells.append(f"{tl * 1e6:.1f} / {ts * 1e6:.1f} ({ts / tl:.1f}×)")
                if ts > tl and best == args.sizes.index(s):
                    best += 1
            upto = f"{args.sizes[best - 1]} B" if best else "—"
            print(f"| {coll} | " + " | ".join(cells) + f" | {upto} |", flush=True)
        print()
    print(f"# cells: LL µs / Simple µs (Simple/LL). Load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
