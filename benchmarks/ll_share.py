"""The single-copy all-gather's two choices for large calls
(``ringtree/runtime/protocols/ll_direct.py``), A/B in the same processes, alternated
block by block:

- ``share``: reads shared through piece counters (an early rank writes its input into a
  late rank's output) against every rank reading its own blocks (``Direct.share``);
- ``sleep``: every wait of the communicator sleeping on its doorbell at once
  (``LL.yield_s`` = 0, as ``RINGTREE_LL_YIELD_US=0``) against LL's yield-then-sleep;
- ``spin``: every wait spinning up to 2 ms before it yields (``LL.spin``, as
  ``RINGTREE_LL_SPIN_US=2000``) against LL's default.

For every size, ``--blocks`` alternating blocks of back-to-back calls per variant; the
slowest rank's time per call of each block is kept, the medians and p10 printed with
off ÷ on (> 1: the choice is faster), and the ranks' CPU time per call summed (thread time).
``size`` is the output's bytes, float32, out of place, inputs written. A busy host slows
both alike; say how busy it was.

    python benchmarks/ll_share.py --ranks 2 --what share --sizes 4M,16M,64M
    python benchmarks/ll_share.py --ranks 4 --what sleep --sizes 8M,16M,64M
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ringtree.testing import run_ranks


def size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def _use(comm, what: str, on: bool, waits: tuple[float, float]) -> None:
    ll = comm.ll.ll
    ll.spin, ll.yield_s = waits
    if what == "share":
        comm.ll.direct.share = on
    elif what == "sleep" and on:
        ll.yield_s = 0.0
    elif what == "spin" and on:
        ll.spin = 2e-3
    comm.planner.relayout(comm.planner.nodes)  # forget plans made with the other variant


def _block(comm, x, out, iters: int) -> tuple[float, float]:
    comm.barrier()
    t, c = time.perf_counter(), time.thread_time()
    for _ in range(iters):
        comm.all_gather(x, out=out)
    per = np.array([(time.perf_counter() - t) / iters])
    cpu = (time.thread_time() - c) / iters
    comm.all_reduce(per, "max")
    return float(per[0]), cpu


def measure(comm, what: str, sizes: list[int], blocks: int) -> dict:
    if comm.size <= len(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[comm.rank]})
    assert comm.ll.direct is not None, "the single-copy path is off (RINGTREE_DEBUG=INFO)"
    res, waits = {}, (comm.ll.ll.spin, comm.ll.ll.yield_s)
    for nbytes in sizes:
        per = nbytes // 4 // comm.size
        x = np.arange(per, dtype=np.float32) + comm.rank
        out = np.zeros(per * comm.size, np.float32)
        iters = max(5, min(2000, (1 << 30) // max(nbytes, 1) // 10))
        times: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(blocks):
            for name in ("on", "off"):
                _use(comm, what, name == "on", waits)
                comm.all_gather(x, out=out)
                t, c = _block(comm, x, out, iters)
                times[name].append(t)
                cpu[name].append(c)
        res[nbytes] = {k: (statistics.median(v), sorted(v)[len(v) // 10])
                       for k, v in times.items()}
        res[nbytes]["cpu"] = {k: statistics.median(v) for k, v in cpu.items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--what", choices=["share", "sleep", "spin"], default="share")
    ap.add_argument("--sizes", default="4M,16M,64M")
    ap.add_argument("--blocks", type=int, default=7)
    a = ap.parse_args()
    sizes = [size(s) for s in a.sizes.split(",")]
    print(f"# {a.what}: {a.ranks} ranks, {len(os.sched_getaffinity(0))} CPUs, load "
          f"{os.getloadavg()[0]:.2f} at start; µs per call, medians (p10) of {a.blocks} "
          "blocks")
    res = run_ranks(measure, a.ranks, a.what, sizes, a.blocks, timeout=3600)
    for r in res:
        if isinstance(r, BaseException):
            raise r
    print("| size | on | off | off ÷ on | CPU on | CPU off |\n|---|---|---|---|---|---|")
    for nbytes, t in res[0].items():
        (on, on10), (off, off10) = t["on"], t["off"]
        cpu = {k: sum(r[nbytes]["cpu"][k] for r in res) * 1e6 for k in ("on", "off")}
        print(f"| {nbytes >> 20} MiB | {on * 1e6:,.0f} ({on10 * 1e6:,.0f}) | {off * 1e6:,.0f} "
              f"({off10 * 1e6:,.0f}) | {off / on:.2f} | {cpu['on']:,.0f} | {cpu['off']:,.0f} |")
    print(f"# load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
