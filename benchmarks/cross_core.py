"""How fast one core reads what another core has just written: the floor under every
shared-memory collective, which the private add/copy limit of ``cpu_peers.py`` does not
pay.

Two processes pinned to two cores share one segment. Each round both write their own
S-byte buffer in it (as a rank's input or result is written before a collective reads
it), meet at a barrier, then both copy S bytes into a private buffer at once, timed:

- ``own``: each copies the buffer it wrote itself (the lines are in its own cache);
- ``peer``: each copies the buffer the other core wrote (the lines come from the other
  core's cache, or from memory once S outgrows it);
- ``peer add``: each adds the other's buffer into a private one (``np.add(a, peer,
  out=a)``, the reduce step).

A 2-rank all-reduce of S bytes must bring S bytes across per rank (the peer's half of
the input, then the peer's half of the result) and add S/2, so ``peer`` at S is close to
the least any shared-memory algorithm can take with both cores busy, whatever copies
it saves. Medians of ``--reps`` rounds, µs and GB/s per core; the machine's load changes
every number: compare columns of one run only.

    python benchmarks/cross_core.py --sizes 64K,256K,1M,4M,16M,64M
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from ringtree.perf.flags import parse_size

MODES = ("own", "peer", "peer add")


def _side(me: int, seg: mmap.mmap, sizes: list[int], reps: int, barrier, out) -> None:
    """One core's part: per size and mode, ``reps`` timed rounds; its times to ``out``."""
    if len(os.sched_getaffinity(0)) > 1 and os.cpu_count() and os.cpu_count() >= 2:
        os.sched_setaffinity(0, {me})
    whole = np.frombuffer(seg, dtype=np.float32)
    times: dict = {}
    for nbytes in sizes:
        count = nbytes // 4
        mine, peer = whole[me * count:(me + 1) * count], whole[(1 - me) * count:(2 - me) * count]
        private = np.ones(count, np.float32)
        for mode in MODES:
            src = mine if mode == "own" else peer
            got = []
            for r in range(reps + 1):
                mine[...] = r  # written by this core just before the read
                barrier.wait()
                t = time.perf_counter()
                if mode == "peer add":
                    np.add(private, src, out=private)
                else:
                    np.copyto(private, src)
                got.append(time.perf_counter() - t)
                barrier.wait()
            times[(nbytes, mode)] = got[1:]  # the first round faults pages in
    out.put((me, times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    sizes = [parse_size(s, "--sizes") for s in args.sizes.split(",")]
    seg = mmap.mmap(-1, 2 * max(sizes))
    barrier, out = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=_side, args=(me, seg, sizes, args.reps, barrier, out))
             for me in (0, 1)]
    for p in procs:
        p.start()
    results = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; µs per core (GB/s), "
          f"the slower core's median of {args.reps}")
    print("| size | " + " | ".join(MODES) + " | peer ÷ own |")
    print("|---|" + "---|" * (len(MODES) + 1))
    for nbytes in sizes:
        med = {m: max(statistics.median(results[me][(nbytes, m)]) for me in (0, 1))
               for m in MODES}
        cells = [f"{med[m] * 1e6:,.1f} ({nbytes / med[m] / 1e9:.1f})" for m in MODES]
        print(f"| {nbytes:,} | " + " | ".join(cells) + f" | {med['peer'] / med['own']:.2f} |")


if __name__ == "__main__":
    main()
