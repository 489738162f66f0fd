"""Single-copy all-gather, reduce-scatter and broadcast
(``ringtree/runtime/protocols/ll_direct.py``) and all-reduce (``ll_direct_fold.py``)
against the shared segment's paths, in the same processes, alternated block by block.

Each rank pins itself to CPU ``rank`` when the ranks fit the CPUs; for every size, the
two paths run ``--blocks`` alternating blocks of back-to-back calls (direct, staged,
direct, …), switched by dropping the communicator's plans; the slowest rank's time per
call of each block is kept and the medians printed, with staged ÷ direct (> 1: the
single copy is faster). ``size`` is the larger buffer's bytes, float32 sum, out of place
(all-reduce: in place, as ``comm.all_reduce(x)``; "staged" is the path the call takes
without the single copy: the split through the segment, or the ring above
``THRESHOLDS``; a third arm, ``ring``, forces the ring at every size; all-gather and
broadcast add ``unbounced``: the single copy reading straight into the output instead of
through an L2 scratch, ``shm_cma.read_spans``). A busy host
slows every arm alike; say how busy it was.

    python benchmarks/ll_direct.py --ranks 2 --sizes 64K,256K,1M,4M,16M,64M
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

import numpy as np

from ringtree.testing import run_ranks


def size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def _use(comm, direct, bounce=None) -> None:
    comm.ll.direct = direct
    if direct is not None:  # the "unbounced" arm: peers read straight into the output
        direct.scratch = bounce
    comm.planner.relayout(comm.planner.nodes)  # forget plans made with the other path


def _block(comm, call, iters: int) -> float:
    comm.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    per = np.array([(time.perf_counter() - t) / iters])
    comm.all_reduce(per, "max")
    return float(per[0])


def measure(comm, colls: list[str], sizes: list[int], blocks: int) -> dict:
    if comm.size <= len(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[comm.rank]})
    direct = comm.ll.direct
    assert direct is not None, "the single-copy path is off here (RINGTREE_DEBUG=INFO: why)"
    direct.min_bytes = 1
    bounce = direct.scratch
    res = {}
    for coll in colls:
        for nbytes in sizes:
            per = nbytes // 4 // comm.size
            small = np.ones(per, np.float32)
            big = np.ones(per * comm.size, np.float32)
            arms = (("direct", direct), ("staged", None))
            if coll == "all_reduce":  # zeros: in place, the sums stay what they were
                big[...] = 0

                def call(big=big, **algo):
                    comm.all_reduce(big, **algo)
                arms += (("ring", None),)
            elif coll == "all_gather":
                def call(small=small, big=big):
                    comm.all_gather(small, out=big)
                arms += (("unbounced", direct),)
            elif coll == "broadcast":  # of the larger buffer, from rank 0
                def call(big=big):
                    comm.broadcast(big, 0)
                arms += (("unbounced", direct),)
            else:
                def call(small=small, big=big):
                    comm.reduce_scatter(big, out=small)
            iters = max(3, min(2000, (200 << 20) // max(nbytes, 1) // 10))
            times: dict[str, list[float]] = {name: [] for name, _ in arms}
            for _ in range(blocks):
                for name, d in arms:
                    _use(comm, d, None if name == "unbounced" else bounce)
                    run = partial(call, algo="ring") if name == "ring" else call
                    run()
                    times[name].append(_block(comm, run, iters))
            res[(coll, nbytes)] = {k: statistics.median(v) for k, v in times.items()}
    _use(comm, direct, bounce)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    ap.add_argument("--colls", default="all_gather,reduce_scatter,broadcast")
    ap.add_argument("--blocks", type=int, default=5)
    a = ap.parse_args()
    sizes = [size(s) for s in a.sizes.split(",")]
    print(f"# {a.ranks} ranks, {len(os.sched_getaffinity(0))} CPUs, load "
          f"{os.getloadavg()[0]:.2f} at start; µs per call, medians of {a.blocks} blocks")
    res = run_ranks(measure, a.ranks, a.colls.split(","), sizes, a.blocks, timeout=3600)[0]
    if isinstance(res, BaseException):
        raise res
    print("| collective | size | direct | staged | staged ÷ direct | ring | ring ÷ direct "
          "| unbounced | unbounced ÷ direct |\n|---|---|---|---|---|---|---|---|---|")
    for (coll, nbytes), t in res.items():
        extra = [f"{t[k] * 1e6:,.1f} | {t[k] / t['direct']:.2f}" if k in t else "- | -"
                 for k in ("ring", "unbounced")]
        print(f"| {coll} | {nbytes} | {t['direct'] * 1e6:,.1f} | {t['staged'] * 1e6:,.1f} "
              f"| {t['staged'] / t['direct']:.2f} | {' | '.join(extra)} |")
    print(f"# load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
