"""process_vm_readv against copies through a shared segment, one process reading another's
buffer: the measurements behind the single-copy all-gather's crossover
(``ringtree/runtime/protocols/ll_direct.py``).

For each size: a child process holds a buffer and waits; the parent reads it with
``process_vm_readv`` (one iovec, or split into 64 KiB iovecs in one call) into a
destination it reuses (warm) or allocates fresh for each read (cold: the destination's
pages are faulted in by the read), against NumPy copying the same bytes from a shared
segment (what one of the staged path's two copies costs). Medians of ``--reps`` reads,
µs and GB/s. Run pinned to one core (``taskset -c 0``) or not; say how loaded the host was.

    python benchmarks/cma_copy.py --sizes 32K,64K,256K,1M,4M,16M,32M
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time

import numpy as np

from ringtree.transports import shm_cma as cma


def size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def median_us(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="32K,64K,256K,1M,4M,16M,32M")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    sizes = [size(s) for s in a.sizes.split(",")]
    big = max(sizes)
    shared = mmap.mmap(-1, big)
    flags = mmap.mmap(-1, 4096)
    words = np.frombuffer(flags, np.uint64, 2)
    src = np.ones(big, np.uint8)  # the child's copy after fork: same address
    cma.allow_readers()
    child = os.fork()
    if child == 0:
        src[:] = 7  # its own pages, touched
        words[0] = 1
        while words[1] == 0:
            time.sleep(0.01)
        os._exit(0)
    while words[0] == 0:
        time.sleep(0.01)
    base = cma.address(src)
    seg = np.frombuffer(shared, np.uint8)
    seg[:] = 1
    print(f"{'bytes':>10} {'cma warm':>10} {'GB/s':>6} {'64K iov':>10} {'cma cold':>10} "
          f"{'shm copy':>10} {'GB/s':>6}")
    for n in sizes:
        dst = np.zeros(n, np.uint8)
        warm = median_us(lambda d=dst, n=n: cma.read_into(child, d, base, n), a.reps)
        assert dst[0] == 7 and dst[-1] == 7
        spans = [(cma.address(dst) + o, base + o, min(64 << 10, n - o))
                 for o in range(0, n, 64 << 10)]
        iov = median_us(lambda s=spans: cma.read_spans(child, s), a.reps)
        cold = median_us(lambda n=n: cma.read_into(child, np.empty(n, np.uint8), base, n),
                         max(3, a.reps // 3))
        copy = median_us(lambda d=dst, n=n: np.copyto(d, seg[:n]), a.reps)
        print(f"{n:>10} {warm:>10.1f} {n / warm / 1e3:>6.1f} {iov:>10.1f} {cold:>10.1f} "
              f"{copy:>10.1f} {n / copy / 1e3:>6.1f}")
    words[1] = 1
    os.waitpid(child, 0)


if __name__ == "__main__":
    main()
