"""The streamed copy (``shm_cma.stream``: the single-copy all-gather's own block, LL's
copies into the segment) at every distance of its destination above its source modulo
4 KiB, against NumPy's copy: the measurement behind ``transports/_stream.h``'s guard
against 4 KiB aliasing (docs/design-notes.md, "Streamed copies and 4 KiB aliasing").

A load whose low 12 address bits match a pending store's waits for it; streamed stores
stay pending long, so a destination just above the source (16, 32, 48 bytes mod 4096)
made every load wait. For each distance: the best and the median of ``--reps`` copies,
in µs, the streamed copy and NumPy's alternated. Run pinned (``taskset -c 0``) and say
how loaded the host was.

    python benchmarks/stream_alias.py --sizes 256K,8M --distances 0,16,32,48,64,128,2048
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ringtree.perf.flags import parse_size
from ringtree.transports import shm_cma as cma


def at_distance(src: np.ndarray, room: np.ndarray, n: int, near: int) -> np.ndarray:
    """``n`` bytes of ``room`` starting ``near`` bytes above ``src`` modulo 4 KiB."""
    lo = (cma.address(src) + near - cma.address(room)) % 4096
    return room[lo:lo + n]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256K,8M")
    ap.add_argument("--distances", default="0,16,32,48,64,128,256,2048,4080")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    sizes = [parse_size(s, "--sizes") for s in a.sizes.split(",")]
    near = [int(d) % 4096 for d in a.distances.split(",")]
    print(f"streamed copy compiled: {cma.compiled() and hasattr(cma, 'stream')}")
    print(f"{'bytes':>10} {'distance':>8} {'stream best':>12} {'median':>8} "
          f"{'numpy best':>11} {'median':>8}")
    for n in sizes:
        src = np.full(n, 7, np.uint8)
        room = np.ones(n + 4096, np.uint8)
        for d in near:
            dst = at_distance(src, room, n, d)
            ts: dict[str, list[float]] = {"stream": [], "numpy": []}
            for _ in range(a.reps):
                t = time.perf_counter()
                cma.stream(dst, src)
                ts["stream"].append(time.perf_counter() - t)
                t = time.perf_counter()
                np.copyto(dst, src)
                ts["numpy"].append(time.perf_counter() - t)
            s, c = ts["stream"], ts["numpy"]
            print(f"{n:>10} {d:>8} {min(s) * 1e6:>12.1f} {statistics.median(s) * 1e6:>8.1f} "
                  f"{min(c) * 1e6:>11.1f} {statistics.median(c) * 1e6:>8.1f}")


if __name__ == "__main__":
    main()
