"""The simulator's scale bar (issue 6), each case in a fresh process for its peak RSS.

- ring all-reduce, 1 GiB, 1,024 ranks (DGX-H100 ×128), congestion-aware: ≤ 30 s
- double-binary-tree all-reduce, 8 B, 16,384 ranks (DGX-H100 ×2048), aware: ≤ 60 s
- peak memory ≤ 4 GiB

Usage: python benchmarks/sim_scale.py [--case NAME]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

CASES = {
    "ring_1GiB_1024": ("all_reduce", "ring", 128, 1 << 30, "aware", 30.0),
    "ring_1GiB_1024_fast": ("all_reduce", "ring", 128, 1 << 30, "fast", 30.0),
    "tree_8B_16384": ("all_reduce", "tree", 2048, 8, "aware", 60.0),
}


def run_case(name: str) -> dict:
    coll, algo, nodes, nbytes, model, bar = CASES[name]
    t0 = time.perf_counter()
    from ringtree.sim import presets, simulate

    topo = presets.get("dgx_h100", nodes)
    run = simulate(coll, algo, topo, nbytes, model=model, channels=1)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": name, "ranks": topo.nranks, "model": model, "wall_s": round(wall, 2),
            "bar_s": bar, "sim_time_us": round(run.time_ns / 1e3, 3),
            "busbw_GBps": round(run.busbw, 2), "max_rss_MiB": round(rss, 1),
            "ok": wall <= bar and rss <= 4096}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        print(json.dumps(run_case(sys.argv[2])))
        return 0
    ok = True
    for name in CASES:
        out = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True,
                             text=True, check=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        ok &= res["ok"]
        print(f"{name:22s} {res['ranks']:6d} ranks  {res['model']:7s} wall {res['wall_s']:6.2f} s "
              f"(bar {res['bar_s']:.0f} s)  simulated {res['sim_time_us']:12.3f} us  "
              f"busbw {res['busbw_GBps']:7.2f} GB/s  max RSS {res['max_rss_MiB']:7.1f} MiB  "
              f"{'OK' if res['ok'] else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
