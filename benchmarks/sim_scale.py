"""The simulator's performance bar, at every preset's own default channels and the
default (congestion-aware) model; each case runs in a fresh process for its peak RSS.

| case | target |
| --- | --- |
| dgx_h100 × 128 nodes (1,024 ranks), ring all-reduce 1 GiB | ≤ 10 s and ≤ 2 GiB |
| dgx_h100 × 2,048 nodes (16,384 ranks), ring all-reduce 1 GiB | ≤ 60 s |
| dgx_h100 × 16,384 nodes (131,072 ranks), tree all-reduce 8 B | ≤ 60 s |
| every preset × every all-reduce algorithm at 8 nodes, 8 B–1 GiB | ≤ 60 s in total |
| the README's ``--nodes 128 --algo all -b 8 -e 1G`` on dgx_h100_sharp | ≤ 60 s |
| dgx_h100 × 2,048 / 4,096 / 16,384 nodes, ring all-reduce 8 B | ≤ 60 s each |
| dgx_h100 × 2,048 / 4,096 nodes, tree all-reduce 8 B | ≤ 60 s each |
| dgx_h100 × 2,048 / 4,096 / 16,384 nodes, ring and tree all-reduce 64 KiB | ≤ 60 s each |

The small-message cases (``ring_8B_*``, ``tree_8B_*``, ``ring_64KiB_*``, ``tree_64KiB_*``;
the tree at 131,072 ranks and 8 B is ``tree_8B_131072`` above) are named
``ALGO_SIZE_RANKS`` and run as one size through :func:`~ringtree.sim.simulate_sizes`;
any such name runs for any registered all-reduce, e.g. ``--cases
rabenseifner_8B_16384`` (the algorithms that need in-network reduction, CollNet and
NVLS, on ``dgx_h100_sharp``). ``docs/design-notes.md`` lists which meet the bar. The
ring's 8 B and 64 KiB cases (at most one element per block) run as block chains
(:mod:`ringtree.sim.engines.ring_chain`); the butterflies' cases in the bar fold under a
XOR of node blocks proved on the generator's XOR template
(:mod:`ringtree.sim.compile.xor_symbolic`).

The README case runs the command itself (``ringtree sim``, whose algorithms run in one
worker process per core); its CPU time is summed over its processes and its peak RSS is
its largest process's. Prints wall time, CPU time (the machine may be shared), peak RSS, chunks carried per
second of wall time, and whether the bar is met. A case that exceeds ``--timeout``
seconds is stopped and reported as such.

Usage: python benchmarks/sim_scale.py [--cases NAME,NAME] [--timeout S] [--detail]
       [--presets NAME,NAME]
       python benchmarks/sim_scale.py --largest [--limit-gib 8] [--timeout S]

``--largest`` looks for the largest case that fits in ``--limit-gib`` of memory: ring
all-reduce of 1 GiB and tree all-reduce of 8 B on dgx_h100, doubling the nodes from the
bar's own cases, each run in a fresh process. It stops before a run whose peak RSS,
extrapolated linearly from the last one (memory is O(ranks × channels)), would pass the
limit, or when a run passes the limit or ``--timeout``, and prints what it measured.

``--detail`` also prints, for the sweeps, the CPU seconds of every (preset, algorithm);
``--presets`` runs the 8-node sweep on those presets only (the bar is for all of them).
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time

GiB = 1 << 30
CASES = {
    "ring_1GiB_1024": (10.0, 2048.0),
    "ring_1GiB_16384": (60.0, None),
    "tree_8B_131072": (60.0, None),
    "sweep_8_nodes": (60.0, None),
    "readme_sharp_128": (60.0, None),
    "ring_8B_16384": (60.0, None),
    "ring_8B_32768": (60.0, None),
    "ring_8B_131072": (60.0, None),
    "tree_8B_16384": (60.0, None),
    "tree_8B_32768": (60.0, None),
    "ring_64KiB_16384": (60.0, None),
    "ring_64KiB_32768": (60.0, None),
    "ring_64KiB_131072": (60.0, None),
    "tree_64KiB_16384": (60.0, None),
    "tree_64KiB_32768": (60.0, None),
    "tree_64KiB_131072": (60.0, None),
    "rabenseifner_64KiB_16384": (60.0, None),
    "rabenseifner_8B_16384": (60.0, None),
    "recursive_doubling_8B_32768": (60.0, None),
    "recursive_doubling_64KiB_32768": (60.0, None),
}
# algorithms that need in-network reduction run on the preset that has it
SHARP = ("collnet_chain", "collnet_direct", "nvls", "nvls_tree")
SMALL = re.compile(r"(\w+?)_(\d+)(B|KiB|MiB)_(\d+)$")


def _sizes(lo: int, hi: int) -> list[int]:
    out = []
    while lo <= hi:
        out.append(lo)
        lo *= 2
    return out


def _one(topo, algo: str, sizes: list[int]) -> tuple[int, int, str]:
    """One algorithm's sweep as ``ringtree sim`` runs it: the structure compiled once
    (:class:`~ringtree.sim.Sweep`), the sizes through :func:`~ringtree.sim.simulate_sizes`."""
    from ringtree.sim import Sweep, simulate_sizes

    if isinstance(topo, str):
        from ringtree.sim import presets

        name, nodes = topo.split(":")
        topo = presets.get(name, int(nodes))
    c0 = time.process_time()
    try:                                         # the largest first, as the CLI: refused at once
        runs = simulate_sizes("all_reduce", algo, topo, sizes[::-1], sweep=Sweep())
    except (ValueError, RuntimeError) as e:      # e.g. CollNet without SHArP
        return 0, 0, f"skipped: {str(e)[:60]}"
    r = runs[0]
    note = (f"{r.time_ns / 1e3:.1f} us, busbw {r.busbw:.1f} GB/s "
            f"({time.process_time() - c0:.2f} s CPU)")
    return sum(x.events for x in runs), len(runs), note


def _readme() -> tuple[int, list[str]]:
    """The README's command itself, ``ringtree sim`` with its defaults (one worker process
    per core, at most one per algorithm): its events and its ``-v`` lines."""
    cmd = [sys.executable, "-m", "ringtree.cli", "sim", "all_reduce", "--topology",
           "dgx_h100_sharp", "--nodes", "128", "--algo", "all", "-b", "8", "-e", "1G", "-v"]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    lines = [ln[2:] for ln in err.splitlines() if ln.startswith("# ")]
    total = [ln for ln in lines if ln.startswith("total ")]
    events = int(total[0].split(" events")[0].rsplit(" ", 1)[1].replace(",", "")) if total else 0
    return events, lines


def run_case(name: str, only: list[str] | None = None) -> dict:
    from ringtree.schedules import algorithms
    from ringtree.sim import presets
    from ringtree.sim.malloc import keep_arrays_in_heap

    keep_arrays_in_heap()                           # as ``ringtree sim`` does

    t0, c0 = time.perf_counter(), time.process_time()
    detail: list[str] = []
    events = 0
    if name == "ring_1GiB_1024":
        events, _, note = _one("dgx_h100:128", "ring", [GiB])
        detail.append(note)
    elif name == "ring_1GiB_16384":
        events, _, note = _one("dgx_h100:2048", "ring", [GiB])
        detail.append(note)
    elif name == "tree_8B_131072":
        events, _, note = _one("dgx_h100:16384", "tree", [8])
        detail.append(note)
    elif SMALL.match(name):
        algo, num, unit, ranks = SMALL.match(name).groups()
        size = int(num) << {"B": 0, "KiB": 10, "MiB": 20}[unit]
        preset = "dgx_h100_sharp" if algo in SHARP else "dgx_h100"
        events, _, note = _one(f"{preset}:{int(ranks) // 8}", algo, [size])
        detail.append(note)
    elif name.startswith("grow:"):                  # --largest: grow:ALGO:BYTES:NODES
        _, algo, size, nodes = name.split(":")
        events, _, note = _one(f"dgx_h100:{nodes}", algo, [int(size)])
        detail.append(note)
    elif name == "readme_sharp_128":
        events, detail = _readme()
    elif name == "sweep_8_nodes":
        for topo_name, nodes in [(p, 8) for p in only or presets.PRESETS]:
            topo = presets.get(topo_name, nodes)    # one per preset, as ``--algo all``
            for algo in algorithms("all_reduce"):
                e, k, note = _one(topo, algo, _sizes(8, GiB))
                events += e
                detail.append(f"{topo_name} {algo}: {k} sizes, {note}")
                print(f"    {detail[-1]}", flush=True)     # read back if the case times out
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu += kids.ru_utime + kids.ru_stime
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, kids.ru_maxrss) / 1024
    small = bool(SMALL.match(name))              # any ALGO_SIZE_RANKS: a minute, and run
    bar_s, bar_mib = CASES.get(name, (60.0 if small else float("inf"), None))
    refused = small and detail[0].startswith("skipped")
    return {"case": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "max_rss_MiB": round(rss, 1), "events": events,
            "events_per_s": round(events / wall) if wall > 0 else 0,
            "ok": wall <= bar_s and (bar_mib is None or rss <= bar_mib)
            and not (only and name == "sweep_8_nodes") and not refused,
            "detail": detail}


def _fresh(case: list[str], timeout: float) -> dict | None:
    """One ``--case`` run in a fresh process (None if it ran past ``timeout``)."""
    try:
        out = subprocess.run([sys.executable, __file__, "--case", *case], capture_output=True,
                             text=True, check=True, timeout=timeout).stdout
    except subprocess.TimeoutExpired:
        return None
    return json.loads(out.strip().splitlines()[-1])


def largest(limit_mib: float, timeout: float) -> None:
    """Double the nodes of each growing case while the next run fits in ``limit_mib``."""
    for algo, size, nodes in (("ring", GiB, 2048), ("tree", 8, 16384)):
        last = None
        while True:
            if last is not None and last["max_rss_MiB"] * 2 > limit_mib:
                print(f"{algo:4s} next: {nodes * 8:,d} ranks would need about "
                      f"{last['max_rss_MiB'] * 2 / 1024:.1f} GiB (linear), over the limit; "
                      f"stopped", flush=True)
                break
            res = _fresh([f"grow:{algo}:{size}:{nodes}"], timeout)
            if res is None:
                print(f"{algo:4s} {nodes * 8:>9,d} ranks: stopped after {timeout:.0f} s",
                      flush=True)
                break
            fits = res["max_rss_MiB"] <= limit_mib
            print(f"{algo:4s} {nodes * 8:>9,d} ranks {size:>10,d} B: wall {res['wall_s']:7.1f} s"
                  f"  cpu {res['cpu_s']:7.1f} s  peak RSS {res['max_rss_MiB']:8.1f} MiB  "
                  f"{res['events']:>11,d} chunks ({res['events_per_s']:,d}/s)"
                  f"{'' if fits else '  OVER the limit'}", flush=True)
            if not fits:
                break
            last, nodes = res, nodes * 2


def main() -> int:
    args = sys.argv[1:]
    if "--largest" in args:
        gib = float(args[args.index("--limit-gib") + 1]) if "--limit-gib" in args else 8.0
        timeout = float(args[args.index("--timeout") + 1]) if "--timeout" in args else 900.0
        with open("/proc/loadavg") as f:
            print(f"# load average: {f.read().strip()}; limit {gib:g} GiB")
        largest(gib * 1024, timeout)
        return 0
    only = args[args.index("--presets") + 1].split(",") if "--presets" in args else []
    if len(args) >= 2 and args[0] == "--case":
        print(json.dumps(run_case(args[1], only)))
        return 0
    timeout = float(args[args.index("--timeout") + 1]) if "--timeout" in args else 600.0
    todo = args[args.index("--cases") + 1].split(",") if "--cases" in args else list(CASES)
    with open("/proc/loadavg") as f:
        print(f"# load average: {f.read().strip()}")
    ok = True
    for name in todo:
        bar_s, bar_mib = CASES.get(name, (60.0, None))
        try:
            out = subprocess.run([sys.executable, __file__, "--case", name,
                                  *(["--presets", ",".join(only)] if only else [])],
                                 capture_output=True, text=True, check=True,
                                 timeout=timeout).stdout
        except subprocess.TimeoutExpired as e:
            print(f"{name:18s} stopped after {timeout:.0f} s (bar {bar_s:.0f} s)  MISSED")
            part = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            if "--detail" in args:
                print(part.rstrip("\n"), flush=True)
            ok = False
            continue
        res = json.loads(out.strip().splitlines()[-1])
        ok &= res["ok"]
        mem = f" and {bar_mib / 1024:.0f} GiB" if bar_mib else ""
        print(f"{name:18s} wall {res['wall_s']:7.2f} s  cpu {res['cpu_s']:7.2f} s  "
              f"peak RSS {res['max_rss_MiB']:8.1f} MiB  {res['events']:>11,d} chunks "
              f"({res['events_per_s']:>10,d}/s)  bar {bar_s:.0f} s{mem}  "
              f"{'OK' if res['ok'] else 'MISSED'}")
        for d in res["detail"] if len(res["detail"]) < 4 or "--detail" in args else []:
            print(f"    {d}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
