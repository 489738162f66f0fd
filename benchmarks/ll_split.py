"""LL's split all-reduce (reduce-scatter then all-gather through the segment,
``runtime/protocols/ll_split.py``) against LL's fold round and Simple's ring, alternated.

For each rank count, a float32 in-place all-reduce (``comm.all_reduce(x)``: the hot path)
of each size, each variant a fresh ``ringtree run`` job (pinned when the ranks fit the
cores): ``split`` (the library as it is), ``fold`` (the split switched off in the job:
every part one fold round), both with ``RINGTREE_PROTO=LL``, and ``ring``
(``algo="ring"``, Simple). Variants alternate run
by run (A B C A B C ...), so all see the same machine; prints the median over runs of
the slowest rank's µs per call, and fold ÷ split and ring ÷ split (above 1: the split is
faster). Where the split loses to the fold round sets ``ll_split.SPLIT_MIN``; where LL
loses to the ring, ``THRESHOLDS`` in ``tuning/proto.py``.

    python benchmarks/ll_split.py --ranks 2 --sizes 256K 1M 4M 16M 64M --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from ringtree.perf.flags import parse_size

# split and fold alternated within one job, a block of calls each, on the communicator's
# own LL segment (two prepared ops of the same shape): finer alternation than jobs
PAIRED = r"""
import json, sys, time
import numpy as np
import ringtree
from ringtree.dtypes import DType
from ringtree.ops import resolve
from ringtree.runtime.protocols import ll_split
from ringtree.ir.program import Collective
from ringtree.runtime.protocols.ll import LLCollectives
sizes, rounds = [int(s) for s in sys.argv[1].split(",")], int(sys.argv[2])
c = ringtree.init()
dt, red = DType.FLOAT32, resolve("sum", DType.FLOAT32)
res = {}
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32)
    ops = {}
    for v, least, part in (("split", 0, 1 << 20), ("fold", 1 << 62, 1 << 20),
                           ("256K", 0, 256 << 10), ("512K", 0, 512 << 10)):
        ll_split.SPLIT_MIN, ll_split.PART = least, part
        ops[v] = LLCollectives(c.ll.ll, 60.0).op(Collective.ALL_REDUCE, dt, x.size, red)
    iters = max(3, min(50, (16 << 20) // nbytes))
    got = {v: [] for v in ops}
    for _ in range(rounds + 1):
        for v, op in ops.items():
            c.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                op.run(x, x, red, 60.0)
            got[v].append((time.perf_counter() - t0) / iters * 1e6)
    took = np.array([float(np.median(got[v][1:])) for v in ops])
    c.all_reduce(took, op="max")
    res[nbytes] = dict(zip(ops, took.tolist()))
if c.rank == 0:
    print("RESULT", json.dumps(res), flush=True)
c.close()
"""

WORKER = r"""
import json, sys, time
import numpy as np
import ringtree
from ringtree.runtime.protocols import ll_split
variant, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
if variant == "fold":
    ll_split.SPLIT_MIN = 1 << 62
c = ringtree.init()
algo = "ring" if variant == "ring" else None
res = {}
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32)
    iters = max(5, min(200, (64 << 20) // nbytes))
    for _ in range(3):
        c.all_reduce(x, algo=algo)
    c.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        c.all_reduce(x, algo=algo)
    took = np.array([(time.perf_counter() - t0) / iters * 1e6])
    c.all_reduce(took, op="max")
    res[nbytes] = float(took[0])
if c.rank == 0:
    print("RESULT", json.dumps(res), flush=True)
c.close()
"""
VARIANTS = ("split", "fold", "ring")


def job(n: int, variant: str, sizes: list[int], rounds: int = 0) -> dict:
    """One ``ringtree run`` of the worker (``paired``: :data:`PAIRED` with ``rounds``):
    {bytes: µs per call, slowest rank (paired: per variant)}."""
    launcher = os.path.join(os.path.dirname(sys.executable), "ringtree")
    cmd = [launcher, "run", "-n", str(n), sys.executable, "-c"]
    cmd += [PAIRED, ",".join(map(str, sizes)), str(rounds)] if variant == "paired" else \
        [WORKER, variant, ",".join(map(str, sizes))]
    env = dict(os.environ)
    if variant != "ring":  # LL at every size, whatever THRESHOLDS say
        env["RINGTREE_PROTO"] = "LL"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    raise RuntimeError(f"{variant} on {n} ranks failed:\n{done.stdout[-2000:]}"
                       f"{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes", nargs="+", default=["256K", "1M", "4M", "16M", "64M"])
    p.add_argument("--runs", type=int, default=5, help="jobs of each variant, alternated")
    a = p.parse_args(argv)
    sizes = [parse_size(s, "--sizes") for s in a.sizes]
    with open("/proc/loadavg") as f:
        print("load at the start:", f.read().split()[0])
    for n in a.ranks:
        us: dict[str, dict[int, list[float]]] = {v: {} for v in VARIANTS}
        for _ in range(a.runs):
            for v in VARIANTS:
                for size, t in job(n, v, sizes).items():
                    us[v].setdefault(size, []).append(t)
        print(f"\n{n} ranks, float32 all-reduce in place, µs per call (median of {a.runs} "
              "alternated jobs)")
        print(f"{'bytes':>10} {'split':>10} {'fold':>10} {'ring':>10} {'fold÷split':>11} "
              f"{'ring÷split':>11}")
        for size in sizes:
            m = {v: statistics.median(us[v][size]) for v in VARIANTS}
            print(f"{size:>10} {m['split']:>10.1f} {m['fold']:>10.1f} {m['ring']:>10.1f} "
                  f"{m['fold'] / m['split']:>11.2f} {m['ring'] / m['split']:>11.2f}")
    with open("/proc/loadavg") as f:
        print("\nload at the end:", f.read().split()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
