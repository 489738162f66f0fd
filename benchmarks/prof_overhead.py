"""What profiling costs: all-reduce latency with the recorder off vs on (and the flight
recorder off vs on), 8 B and 16 MiB, on N local ranks.

    python benchmarks/prof_overhead.py [-n 4] [--algo ring] [--rounds 8]

Modes are interleaved round by round (off, fr, prof, prof, fr, off, ...) so that load from
other processes on the machine hits them alike; each mode's time is the median over rounds
of the mean time per call, taken on the slowest rank. Targets (issue 8): ≤ 5 % at 16 MiB,
≤ 20 % at 8 B. Measured, not asserted.

- ``none``: no flight recorder, no profiler (the floor);
- ``fr``:   flight recorder only — the default state of every communicator;
- ``prof``: flight recorder + event recorder (``RINGTREE_PROFILE`` / ``profile()``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ringtree.prof.recorder import ProfileObserver, Recorder
from ringtree.testing import raise_first, run_ranks

SIZES = (8, 16 << 20)


def _bench(comm, algo: str | None, rounds: int, iters8: int, iters_big: int) -> dict:
    fr = comm.flight
    rec = Recorder()
    modes = {"none": (None, None), "fr": (fr, None), "prof": (fr, ProfileObserver(rec))}
    out: dict = {}
    for nbytes in SIZES:
        x = np.ones(max(1, nbytes // 4), np.float32)
        iters = iters8 if nbytes <= 1024 else iters_big
        for _ in range(3):
            comm.all_reduce(x, algo=algo)
        times: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        order = list(modes)
        for k in range(rounds):
            for m in (order if k % 2 == 0 else order[::-1]):
                comm.flight, obs = modes[m]
                comm.executor.observe(obs)
                comm.barrier()
                t, c = time.perf_counter(), time.process_time()
                for _ in range(iters):
                    comm.all_reduce(x, algo=algo)
                times[m].append((time.perf_counter() - t) / iters)
                cpu[m].append((time.process_time() - c) / iters)
        comm.flight = fr
        comm.executor.observe(None)
        out[nbytes] = times
        out[("cpu", nbytes)] = cpu
    out["events"] = rec.head
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=4)
    ap.add_argument("--algo", default=None, help="force an algorithm (default: the tuner's)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters8", type=int, default=200)
    ap.add_argument("--iters-big", type=int, default=4)
    a = ap.parse_args()
    res = raise_first(run_ranks(_bench, a.nranks, a.algo, a.rounds, a.iters8, a.iters_big,
                                timeout=1800))
    print(f"# all-reduce float32, {a.nranks} ranks, algo={a.algo or 'tuner'}, "
          f"{a.rounds} interleaved rounds; time = median over rounds of the slowest rank's "
          f"mean per call")
    print(f"{'bytes':>10} {'none (us)':>11} {'fr (us)':>11} {'prof (us)':>11} "
          f"{'fr/none':>8} {'prof/fr':>8}  {'per-round prof/fr (min..max)':>28}")
    for nbytes in SIZES:
        per_mode = {}
        for m in ("none", "fr", "prof"):
            rounds = [max(r[nbytes][m][k] for r in res) for k in range(a.rounds)]
            per_mode[m] = rounds
        med = {m: statistics.median(v) * 1e6 for m, v in per_mode.items()}
        ratios = [p / f for p, f in zip(per_mode["prof"], per_mode["fr"])]
        print(f"{nbytes:>10} {med['none']:>11.1f} {med['fr']:>11.1f} {med['prof']:>11.1f} "
              f"{(med['fr'] / med['none'] - 1) * 100:>+7.1f}% "
              f"{(med['prof'] / med['fr'] - 1) * 100:>+7.1f}%  "
              f"{(min(ratios) - 1) * 100:>+12.1f}% .. {(max(ratios) - 1) * 100:+.1f}%")
    print("# CPU time per call (process_time, median over rounds, mean over ranks): "
          "the recorder's own cost, less exposed to scheduling noise")
    for nbytes in SIZES:
        med = {m: statistics.median(statistics.fmean(r[("cpu", nbytes)][m][k] for r in res)
                                    for k in range(a.rounds)) * 1e6
               for m in ("none", "fr", "prof")}
        print(f"{nbytes:>10} {med['none']:>11.1f} {med['fr']:>11.1f} {med['prof']:>11.1f} "
              f"{(med['fr'] / med['none'] - 1) * 100:>+7.1f}% "
              f"{(med['prof'] / med['fr'] - 1) * 100:>+7.1f}%")
    print(f"# events recorded per rank (rank 0): {res[0]['events']}")


if __name__ == "__main__":
    main()
