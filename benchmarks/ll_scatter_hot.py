"""The reduce-scatter's one C entry (``Round.shot``, ``LLRunner.scatter_now``) against
the path it replaced (``LLRunner.blocks_now``: ``run_arrays``, the runner, the flight
recorder's Python entry, ``Round.scatter``), alternated in one ``ringtree run`` job;
``--coll broadcast``: ``Round.bshot`` against ``LLRunner.broadcast_blocks``; ``--coll
reduce``: ``Round.rhot`` (``LLRunner.reduce_now``) against the general path every reduce
took before it (``api.for_reduce``, the planner, ``LLRunner.run``), a sum to rank 0 into
a separate ``out``.

Float32 sums into a separate ``out``; for each input size, blocks of calls of each path
alternate (old, new, old, new ...) after a barrier, every call timed alone with
``perf_counter_ns``; prints per path the median and the 10th percentile of the
per-call times of the slowest rank (means of blocks carry the 2-20 ms preemptions of a
loaded host), and new ÷ old, with the load average at the start and the end.

    python benchmarks/ll_scatter_hot.py --ranks 2 --sizes 8K 64K 256K 1M
    python benchmarks/ll_scatter_hot.py --coll broadcast --ranks 2 4 --sizes 8K 64K 256K
    python benchmarks/ll_scatter_hot.py --coll reduce --ranks 2 --sizes 8 8K 64K 256K
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ringtree.perf.flags import parse_size

JOB = r"""
import json, sys, time
import numpy as np
import ringtree
from ringtree import api
from ringtree.ir.program import Collective
from ringtree.runtime.protocols.ll_entry import REDUCE
from ringtree.runtime.protocols.ll_runner import MISS
sizes, blocks, calls = [int(s) for s in sys.argv[1].split(",")], int(sys.argv[2]), int(sys.argv[3])
bcast, red = sys.argv[4] == "broadcast", sys.argv[4] == "reduce"
c = ringtree.init()
clock, RS = time.perf_counter_ns, Collective.REDUCE_SCATTER
res = {}
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32) * (c.rank + 1)
    out = np.empty(x.size // c.size, np.float32)
    if red:  # to rank 0, into out
        out = np.empty_like(x)
        old = lambda: c._run(api.for_reduce(c, x, 0, "sum", out, None), False, None)
        new = lambda: c.reduce(x, 0, "sum", out=out)
    elif bcast:  # in place from rank 0
        old = lambda: c.ll.broadcast_blocks(c, x, 0, None)
        new = lambda: c.broadcast(x, root=0)
    else:
        old = lambda: c.ll.blocks_now(c, RS, x, out, "sum", None)
        new = lambda: c.reduce_scatter(x, "sum", out=out)
    new()  # planned (the general path), then the old path's answer tells if it is on LL
    if red:
        new()  # the second call keeps the shape (planner.ready) and takes the C entry
    if c.planner.ready.get(REDUCE) is None if red else old() is MISS:
        res[nbytes] = None
        continue
    new(), old(), new()
    fr = c.flight
    before = int(fr.native[0]) if fr else 0  # entries the kernel made
    t = {"old": [], "new": []}
    for _ in range(blocks):
        for name, f in (("old", old), ("new", new)):
            c.barrier()
            for _ in range(calls):
                t0 = clock()
                f()
                t[name].append(clock() - t0)
    q = np.array([np.percentile(t[v], p) / 1e3 for v in ("old", "new") for p in (50, 10)])
    hot = int(fr.native[0]) - before if fr else -1
    c.all_reduce(q, op="max")
    res[nbytes] = q.tolist() + [hot]
if c.rank == 0:
    print("RESULT", json.dumps(res), flush=True)
c.close()
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2])
    p.add_argument("--sizes", nargs="+", default=["8K", "64K", "256K", "1M"])
    p.add_argument("--blocks", type=int, default=15, help="blocks of each path, alternated")
    p.add_argument("--calls", type=int, default=60, help="calls per block")
    p.add_argument("--coll", choices=("reduce_scatter", "broadcast", "reduce"), default="reduce_scatter")
    a = p.parse_args(argv)
    sizes = [parse_size(s, "--sizes") for s in a.sizes]
    with open("/proc/loadavg") as f:
        print("load at the start:", f.read().split()[0])
    launcher = os.path.join(os.path.dirname(sys.executable), "ringtree")
    for n in a.ranks:
        cmd = [launcher, "run", "-n", str(n), sys.executable, "-c", JOB,
               ",".join(map(str, sizes)), str(a.blocks), str(a.calls), a.coll]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"{n} ranks failed:\n{done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")
        what = {"broadcast": "in-place broadcast from rank 0", "reduce": "sum reduce to "
                "rank 0 into out"}.get(a.coll, "sum reduce-scatter into out")
        print(f"\n{n} ranks, float32 {what}, µs per call (slowest "
              "rank's median and p10; 'C entries': calls the kernel recorded, "
              f"of {a.blocks * a.calls} new ones)")
        print(f"{'input':>9} {'old med':>9} {'new med':>9} {'old p10':>9} {'new p10':>9} "
              f"{'new÷old':>8} {'C entries':>10}")
        for size, row in json.loads(lines[0][7:]).items():
            if row is None:
                print(f"{size:>9}  not on LL here (the general path): not compared")
                continue
            om, o10, nm, n10, hot = row
            print(f"{size:>9} {om:>9.2f} {nm:>9.2f} {o10:>9.2f} {n10:>9.2f} "
                  f"{nm / om:>8.2f} {hot:>10}")
    with open("/proc/loadavg") as f:
        print("\nload at the end:", f.read().split()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
