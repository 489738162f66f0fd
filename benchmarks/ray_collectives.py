"""Ray collectives: ringtree's backend (``RINGTREE``) against Ray's own gloo group
(``GLOO``), on the same actors, at 8 B, 1 MiB and 16 MiB.

Both groups are made inside the same N actors of a local Ray cluster, so the processes,
placement and data are identical; only the backend differs. Operations: ``allreduce``
(float32, in place) and ``reducescatter`` (N input blocks of size/N bytes each; Ray's
gloo group runs it as N all-reduces of the blocks, ringtree as one reduce-scatter).

Method (nccl-tests style): after ``warmup`` calls, each repetition is ``barrier; t0;
iters × op; t1`` on every rank; a repetition's time is the slowest rank's (t1−t0)/iters;
the table shows the median over ``--reps`` repetitions and the ratio gloo / ringtree
(> 1: ringtree is faster). A final call with rank-dependent values checks both results.

    python benchmarks/ray_collectives.py                 # 2 actors
    python benchmarks/ray_collectives.py --actors 4 --reps 7 --json ray.json

Needs ``pip install 'ringtree[ray]'`` and torch (Ray's gloo group runs on
torch.distributed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

SIZES = (8, 1 << 20, 16 << 20)


def _actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class Bench:
        def __init__(self, rank: int, size: int):
            import ray.util.collective as col

            import ringtree.ray  # noqa: F401 - registers RINGTREE in this actor

            self.col, self.rank, self.size = col, rank, size
            col.init_collective_group(size, rank, backend="GLOO", group_name="default")
            col.init_collective_group(size, rank, backend="RINGTREE", group_name="rt")

        def run(self, group: str, op: str, nbytes: int, iters: int, reps: int,
                warmup: int) -> list[float]:
            col, n = self.col, self.size
            if op == "allreduce":
                x = np.zeros(max(1, nbytes // 4), np.float32)

                def call() -> None:
                    col.allreduce(x, group_name=group)
            else:
                blocks = [np.zeros(max(1, nbytes // 4 // n), np.float32) for _ in range(n)]
                out = np.zeros_like(blocks[0])

                def call() -> None:
                    col.reducescatter(out, blocks, group_name=group)
            for _ in range(warmup):
                call()
            times = []
            for _ in range(reps):
                col.barrier(group_name=group)
                t0 = time.perf_counter()
                for _ in range(iters):
                    call()
                times.append((time.perf_counter() - t0) / iters)
            return times

        def check(self, group: str) -> bool:
            col, r, n = self.col, self.rank, self.size
            x = np.full(1000, float(r + 1), np.float32)
            col.allreduce(x, group_name=group)
            blocks = [np.full(10, float(100 * r + k), np.float32) for k in range(n)]
            out = np.zeros(10, np.float32)
            col.reducescatter(out, blocks, group_name=group)
            return bool(np.all(x == n * (n + 1) / 2)
                        and np.all(out == sum(100 * k + r for k in range(n))))

    return Bench


def _iters(nbytes: int) -> int:
    return 200 if nbytes <= 4096 else 20 if nbytes <= (1 << 20) else 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ops", nargs="+", default=["allreduce", "reducescatter"])
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    import ray

    ray.init(num_cpus=max(2, a.actors), include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        bench = _actor_class()
        actors = [bench.remote(r, a.actors) for r in range(a.actors)]
        ok = {g: all(ray.get([x.check.remote(g) for x in actors])) for g in ("rt", "default")}
        if not all(ok.values()):
            raise SystemExit(f"wrong results: {ok}")
        rows = []
        for op in a.ops:
            for nbytes in SIZES:
                med = {}
                for group in ("rt", "default"):
                    per_rank = ray.get([x.run.remote(group, op, nbytes, _iters(nbytes), a.reps,
                                                     a.warmup) for x in actors])
                    med[group] = statistics.median(max(t) for t in zip(*per_rank))
                rows.append({"op": op, "bytes": nbytes, "ringtree_s": med["rt"],
                             "gloo_s": med["default"], "ratio": med["default"] / med["rt"]})
                print(f"{op:14s} {nbytes:>9d} B  ringtree {med['rt'] * 1e6:10.1f} us  "
                      f"gloo {med['default'] * 1e6:10.1f} us  gloo/ringtree "
                      f"{rows[-1]['ratio']:5.2f}x", flush=True)
        load = open("/proc/loadavg").read().strip() if os.path.exists("/proc/loadavg") else ""
        print(f"actors {a.actors}, reps {a.reps}; loadavg {load}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"actors": a.actors, "loadavg": load, "rows": rows}, f, indent=1)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
