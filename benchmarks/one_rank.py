"""One rank's collectives: µs per call of every collective the hot paths take, in place
and into ``out``, float32 sum, for the ringtree that ``PYTHONPATH`` imports.

    python benchmarks/one_rank.py [--sizes 8 64K 1M] [--calls 20000] [--reps 5]

Prints one line per collective and size: the median of ``--reps`` repetitions of
``--calls`` back-to-back calls (each repetition timed alone). To compare two trees, run it
with one ``PYTHONPATH`` and then the other, alternated several times (the machine's load
changes between runs: compare only alternated runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from ringtree.perf.flags import parse_size
from ringtree.testing import run_ranks


def _calls(comm, n: int) -> list:
    x, out = np.ones(n, np.float32), np.zeros(n, np.float32)
    return [("all_reduce", lambda: comm.all_reduce(x)),
            ("all_reduce out", lambda: comm.all_reduce(x, out=out)),
            ("reduce", lambda: comm.reduce(x, 0)),
            ("reduce out", lambda: comm.reduce(x, 0, out=out)),
            ("broadcast", lambda: comm.broadcast(x, 0)),
            ("all_gather out", lambda: comm.all_gather(x, out=out)),
            ("reduce_scatter out", lambda: comm.reduce_scatter(x, out=out))]


def measure(comm, sizes: list[int], calls: int, reps: int) -> dict:
    res = {}
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        k = max(50, calls * 64 // max(64, nbytes))  # fewer calls of large buffers
        for name, call in _calls(comm, n):
            for _ in range(5):
                call()
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                for _ in range(k):
                    call()
                times.append((time.perf_counter() - t) / k * 1e6)
            res[f"{name} {nbytes}"] = statistics.median(times)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["8", "64K", "1M"])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    res = run_ranks(measure, 1, [parse_size(s, "--sizes") for s in a.sizes], a.calls, a.reps,
                    timeout=600)[0]
    if isinstance(res, BaseException):
        raise res
    if a.json:
        print(json.dumps(res))
        return
    for key, us in res.items():
        print(f"{key:>32}  {us:8.2f} µs")


if __name__ == "__main__":
    main()
