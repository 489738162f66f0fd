"""Many hosts on the namespace testbed: ringtree's default, every ringtree algorithm and
torch gloo, on shaped links.

For each link rate (``--rates``, tc units) and layout (``--layouts`` HxP: H hosts of P
ranks) it builds a :class:`ringtree.testbed.Testbed`, runs all_reduce, all_gather and
reduce_scatter over ``--sizes`` (nccl-tests sizes: all_gather's is the gathered output,
reduce_scatter's the input) with ringtree's default choice and with each algorithm,
interleaved per repetition so machine noise hits all alike, then the same sweep through
gloo (``torchrun`` on the same hosts, ``GLOO_SOCKET_IFNAME=eth0``). It prints, per size,
the median time, the default's bus bandwidth and its fraction of the link bound, the
default ÷ best-ringtree ratio and gloo ÷ default, and writes the raw numbers (``--json``)
and a plot (``--plot``).

The default is what a caller gets: the cost model's choice, or where the model's close
candidates were measured on the communicator (``ringtree.tuning.autotune``,
``RINGTREE_TUNE=online``) the measured winner. That measuring happens once per
(collective, size), in the default's untimed first call, so the default's times exclude
it; its cost (the slowest rank's) and what it measured are printed and saved under
``tuning``. ``--env RINGTREE_TUNE=model`` gives the model alone.

Each testbed host owns its share of the machine's CPUs (``--cpus own``, the testbed's
default: one CPU per host of 2×2 and 2×4 on two CPUs, one CPU per two hosts of 4×1), as a
real host would; ``--cpus shared`` lets every host's ranks run on every CPU, as all runs
before that default did.

Method: float32 zeros; one untimed call per candidate and size first (gloo likewise
drops its first repetition); each repetition is ``barrier; t0; iters × op; t1`` on every rank,
and its time is the slowest rank's (t1−t0)/iters; ``iters`` makes a repetition last about
50 ms (a first timed call that already takes that long is the repetition). Each
repetition runs the candidates in a rotated order, so none is always first after a
barrier. Sizes up to 64 KiB, where candidates are tens of microseconds apart and a
repetition costs little, get ``--small-reps`` repetitions (default 15) instead of
``--reps``: the median of a few 50 ms samples moves as much as the candidates differ,
and the best of eight such medians is biased low. An algorithm more than 1.8× slower than the best at some size ≥ 1 MiB is not run
at the larger sizes (printed as ``-``), which keeps a full sweep under an hour.

Link bound (each host's link carries ``rate`` each way; L hosts, S bytes): all_reduce
2(L−1)/L·S/rate (each host must send that much), all_gather and reduce_scatter
(L−1)/L·S/rate (what each host must receive). tbf counts frame bytes, so TCP payload tops
out near 95% of it.

    python benchmarks/multihost.py                                  # the full sweep
    python benchmarks/multihost.py --layouts 2x2 --rates 1gbit --colls all_reduce \\
        --sizes 8,64K,16M --reps 3 --no-gloo
    python benchmarks/multihost.py --layouts 4x1 --rates 1gbit --json a.json   # in parts,
    python benchmarks/multihost.py --layouts 2x4 --rates 1gbit --json b.json   # then
    python benchmarks/multihost.py --report a.json b.json                      # one report

Needs root, ``ip``, ``tc`` (the testbed) and torch for gloo.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

COLLS = ["all_reduce", "all_gather", "reduce_scatter"]
SIZES = "8,256,8K,256K,1M,4M,16M,64M"
LAYOUTS = "2x2,4x1,2x4"
RATES = "1gbit,200mbit"
PRUNE_RATIO, PRUNE_FROM = 1.8, 1 << 20
REP_SECONDS = 0.05
SMALL = 64 << 10          # sizes up to this get --small-reps repetitions


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().removesuffix("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def show_size(n: int) -> str:
    for unit, m in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return f"{n}"


def counts(coll: str, nbytes: int, n: int) -> int:
    """Elements each rank passes in (float32), nccl-tests size conventions."""
    elems = max(1, nbytes // 4)
    if coll == "all_gather":
        return max(1, elems // n)
    if coll == "reduce_scatter":
        return max(n, elems // n * n)
    return elems


def busbw_factor(coll: str, n: int) -> float:
    return 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n


def link_bound(coll: str, nbytes: int, hosts: int, rate_bps: float) -> float:
    """Seconds the busiest host's link needs (``ringtree.perf.linkbound``), hosts of one
    rank each: the bound does not depend on the ranks per host for these collectives."""
    from ringtree.perf.linkbound import link_bound as bound

    return bound(coll, nbytes, tuple(range(hosts)), rate_bps / 8)


# ---- ringtree ranks (run inside the testbed hosts) ---------------------------------------

_BUFS: dict = {}


def _op(comm, coll: str, count: int, algo):
    key = (coll, count)
    if key not in _BUFS:
        _BUFS.clear()
        x = np.zeros(count, np.float32)
        out = np.zeros(count * comm.size if coll == "all_gather" else
                       (count // comm.size if coll == "reduce_scatter" else count), np.float32)
        _BUFS[key] = (x, out)
    x, out = _BUFS[key]
    if coll == "all_reduce":
        return lambda: comm.all_reduce(x, algo=algo)
    if coll == "all_gather":
        return lambda: comm.all_gather(x, out=out.reshape(comm.size, count), algo=algo)
    return lambda: comm.reduce_scatter(x, out=out, algo=algo)


def _slowest(comm, t: float) -> float:
    v = np.array([t], np.float64)
    comm.all_reduce(v, op="max", algo="ring")
    return float(v[0])


_WARM: set = set()


def rt_time(comm, coll: str, count: int, algo) -> float:
    f = _op(comm, coll, count, algo)
    if (coll, count, algo) not in _WARM:  # the plan, its staging and first touches
        _WARM.add((coll, count, algo))
        f()
    comm.barrier()
    t0 = time.perf_counter()
    f()
    first = _slowest(comm, time.perf_counter() - t0)
    if first >= REP_SECONDS:
        return first
    iters = max(1, min(300, int(REP_SECONDS / max(first, 1e-6))))
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    return _slowest(comm, (time.perf_counter() - t0) / iters)


def rt_choice(comm, coll: str, count: int) -> tuple[str, dict | None]:
    """The default's algorithm at this size (the planner's size: an all-gather's is the
    gathered output) and, when the online choice measured it, what it measured."""
    from ringtree.ir.program import parse_collective

    c = parse_collective(coll)
    nbytes = count * 4 * (comm.size if coll == "all_gather" else 1)
    choice = comm.planner.choose(c, nbytes)
    online = comm.planner.online
    d = None if online is None else online.decisions.get((c, nbytes))
    if d is None:
        return choice, None
    return choice, {"model": d.model, "candidates": list(d.candidates),
                    "times": list(d.times), "seconds": d.seconds,
                    "excluded": list(d.excluded)}


def rt_topology(comm):
    t = comm.topology
    return None if t is None else (t.alpha, t.bandwidth, t.source, t.burst)


# ---- gloo ranks (torchrun inside the testbed hosts) --------------------------------------

def gloo_worker(args) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    res = {}
    for coll in args.colls.split(","):
        for s in args.sizes.split(","):
            nbytes = parse_size(s)
            count = counts(coll, nbytes, n)
            x = torch.zeros(count)
            out = torch.zeros(count * n if coll == "all_gather" else max(1, count // n))
            if coll == "all_reduce":
                def f(x=x):
                    dist.all_reduce(x)
            elif coll == "all_gather":
                def f(x=x, out=out):
                    dist.all_gather_into_tensor(out, x)
            else:
                def f(x=x, out=out):
                    dist.reduce_scatter_tensor(out, x)
            times = []
            for rep in range(reps_for(nbytes, args.reps, args.small_reps) + 1):
                dist.barrier()
                t0 = time.perf_counter()
                f()
                t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if float(t) < REP_SECONDS:
                    iters = max(1, min(300, int(REP_SECONDS / max(float(t), 1e-6))))
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        f()
                    t = torch.tensor([(time.perf_counter() - t0) / iters],
                                     dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if rep:
                    times.append(float(t))
            res[f"{coll}/{nbytes}"] = times
    if rank == 0:
        with open(args.gloo_out, "w") as fh:
            json.dump(res, fh)
    dist.destroy_process_group()


def run_gloo(tb, hosts: int, ppn: int, args) -> dict:
    out = os.path.join(tempfile.mkdtemp(prefix="rt-mh-"), "gloo.json")
    port = tb.port()
    procs = []
    for i in range(hosts):
        h = tb.hosts[i]
        env = dict(os.environ, GLOO_SOCKET_IFNAME=h.ifname, OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts),
               "--nproc-per-node", str(ppn), "--node-rank", str(i),
               "--master-addr", tb.hosts[0].addr, "--master-port", str(port),
               os.path.abspath(__file__), "--gloo-worker", "--gloo-out", out,
               "--colls", args.colls, "--sizes", args.sizes, "--reps", str(args.reps),
               "--small-reps", str(args.small_reps)]
        procs.append(h.popen(cmd, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=7200)[1] for p in procs]
    if any(p.returncode for p in procs) or not os.path.exists(out):
        print(f"  gloo failed: {[p.returncode for p in procs]} {errs[0][-500:]}", flush=True)
        return {}
    with open(out) as fh:
        return json.load(fh)


# ---- the sweep ----------------------------------------------------------------------------

def reps_for(nbytes: int, reps: int, small_reps: int) -> int:
    """Repetitions at a size: ``small_reps`` up to :data:`SMALL`, else ``reps``."""
    return max(reps, small_reps) if nbytes <= SMALL else reps


def sweep(pool, hosts: int, coll: str, sizes: list[int], reps: int, n: int,
          only: str | None = None, small_reps: int = 0) -> dict:
    from ringtree.schedules import algorithms

    algos = [None] + [a for a in algorithms(coll) if not a.startswith("collnet")
                      and (only is None or a in only.split(","))]
    res: dict = {}
    pruned: set = set()
    for nbytes in sizes:
        count = counts(coll, nbytes, n)
        live = [a for a in algos if a not in pruned]
        times: dict = {a: [] for a in live}
        for rep in range(reps_for(nbytes, reps, small_reps)):
            k = rep % len(live)
            for a in live[k:] + live[:k]:
                times[a].append(pool.run_ok(rt_time, coll, count, a)[0])
        got = pool.run_ok(rt_choice, coll, count)
        choice, tuned = got[0]
        med = {a: statistics.median(v) for a, v in times.items()}
        best = min(v for a, v in med.items() if a is not None)
        if nbytes >= PRUNE_FROM:
            pruned |= {a for a in live if a is not None and med[a] > PRUNE_RATIO * best}
        res[str(nbytes)] = {"choice": choice, "times": {str(a): v for a, v in times.items()}}
        others = ", ".join(f"{a} {t * 1e3:.3f}" for a, t in sorted(
            ((a, t) for a, t in med.items() if a is not None), key=lambda x: x[1]))
        print(f"    {coll} {show_size(nbytes):>4}: default ({choice}) {med[None] * 1e3:.3f} ms;"
              f" {others}", flush=True)
        if tuned is not None:  # once, in the default's untimed first call
            tuned["seconds"] = max(t["seconds"] for _, t in got)  # the slowest rank's
            res[str(nbytes)]["tuning"] = tuned
            meas = ", ".join(f"{a} {t * 1e3:.3f}" for a, t in zip(tuned["candidates"],
                                                                tuned["times"]))
            print(f"      online choice (model: {tuned['model']}): measured {meas} ms; "
                  f"tuning took {tuned['seconds'] * 1e3:.0f} ms once", flush=True)
    return res


def table(entry: dict, gloo: dict) -> str:
    coll, hosts, n, rate = entry["coll"], entry["hosts"], entry["n"], entry["rate_bps"]
    rows = ["| size | default (choice) | best ringtree | default/best | gloo | gloo/default "
            "| busbw GB/s | link bound | of bound | tuning once |", "|" + "---|" * 10]
    for nbytes_s, r in entry["results"].items():
        nbytes = int(nbytes_s)
        med = {a: statistics.median(v) for a, v in r["times"].items()}
        d = med["None"]
        ba, bt = min(((a, t) for a, t in med.items() if a != "None"), key=lambda x: x[1])
        g = gloo.get(f"{coll}/{nbytes}")
        gm = statistics.median(g) if g else math.nan
        bus = nbytes / d * busbw_factor(coll, n) / 1e9
        bound = link_bound(coll, nbytes, hosts, rate)
        rows.append(f"| {show_size(nbytes)} | {d * 1e3:,.3f} ms ({r['choice']}) | "
                    f"{bt * 1e3:,.3f} ms ({ba}) | {d / bt:.2f} | {gm * 1e3:,.3f} ms | "
                    f"{gm / d:.2f} | {bus:.3f} | {bound * 1e3:,.3f} ms | {bound / d:.0%} | "
                    f"{_tuning(r)} |")
    return "\n".join(rows)


def _tuning(r: dict) -> str:
    """What the online choice spent at this size, once (``-``: the model decided)."""
    t = r.get("tuning")
    return "-" if t is None else f"{t['seconds'] * 1e3:,.0f} ms ({len(t['candidates'])})"


def plot(entries: list[dict], glos: dict, path: str) -> bool:
    """Times against size per part, with gloo and the link bound; False without
    matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(entries), 1, figsize=(9, 3.2 * len(entries)), squeeze=False)
    for ax, e in zip(axes[:, 0], entries):
        sizes = [int(s) for s in e["results"]]
        algos = sorted({a for r in e["results"].values() for a in r["times"]})
        for a in algos:
            pts = [(s, statistics.median(e["results"][str(s)]["times"][a])) for s in sizes
                   if a in e["results"][str(s)]["times"]]
            style = dict(lw=2.5, color="k") if a == "None" else dict(lw=1, alpha=0.7)
            ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts],
                    label="default" if a == "None" else a, marker=".", **style)
        g = glos.get(e["key"], {})
        gp = [(s, statistics.median(g[f"{e['coll']}/{s}"])) for s in sizes
              if f"{e['coll']}/{s}" in g]
        if gp:
            ax.plot([p[0] for p in gp], [p[1] * 1e3 for p in gp], "r--", lw=2, label="gloo")
        ax.plot(sizes, [link_bound(e["coll"], s, e["hosts"], e["rate_bps"]) * 1e3
                        for s in sizes], "g:", label="link bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{e['coll']} {e['layout']} @ {e['rate']}")
        ax.set_xlabel("bytes")
        ax.set_ylabel("ms")
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default=LAYOUTS)
    ap.add_argument("--rates", default=RATES)
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--small-reps", type=int, default=15,
                    help="repetitions at sizes up to 64 KiB (default 15)")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--algos", help="ringtree algorithms to run besides the default "
                    "(comma-separated; default: all but CollNet's)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="extra environment for the ringtree ranks, e.g. "
                    "RINGTREE_NSOCKS_PERTHREAD=2 (repeatable)")
    ap.add_argument("--cpus", choices=("own", "shared"), default="own",
                    help="the testbed hosts' CPUs: each its own share (default), or all "
                    "hosts on every CPU")
    ap.add_argument("--json", default="multihost.json")
    ap.add_argument("--plot", default="multihost.png")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="print the tables and the score of saved runs (e.g. a sweep taken "
                    "in parts) and plot them; runs nothing")
    ap.add_argument("--gloo-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gloo-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gloo_worker:
        gloo_worker(args)
        return 0
    if args.report:
        entries, glos = [], {}
        for path in args.report:
            with open(path) as fh:
                d = json.load(fh)
            entries += d["entries"]
            for key, runs in d["gloo"].items():  # parts may split one layout's collectives
                glos.setdefault(key, {}).update(runs)
        report(entries, glos, args.plot)
        return 0

    from ringtree.testbed import Testbed, available, parse_rate
    from ringtree.testbed.pool import HostPool

    ok, why = available()
    if not ok:
        print(f"multihost: {why}", file=sys.stderr)
        return 1
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    entries, glos = [], {}
    with open("/proc/loadavg") as fh:
        print(f"load before: {fh.read().strip()}", flush=True)
    for rate in args.rates.split(","):
        for layout in args.layouts.split(","):
            hosts, ppn = (int(v) for v in layout.split("x"))
            n = hosts * ppn
            key = f"{layout}@{rate}"
            print(f"== {key}", flush=True)
            with Testbed(hosts, rate=rate, cpus=args.cpus) as tb:
                env = dict(kv.split("=", 1) for kv in args.env)
                env["RINGTREE_TOKEN"] = secrets.token_hex(8)
                with HostPool(tb, ppn, env=env, timeout=3600) as pool:
                    topo = pool.run_ok(rt_topology)[0]
                    print(f"  learned: {topo}", flush=True)
                    for coll in args.colls.split(","):
                        entries.append({"key": key, "layout": layout, "rate": rate,
                                        "rate_bps": parse_rate(rate), "hosts": hosts, "n": n,
                                        "coll": coll, "topology": topo, "cpus": args.cpus,
                                        "results": sweep(pool, hosts, coll, sizes, args.reps,
                                                         n, args.algos, args.small_reps)})
                        with open(args.json, "w") as fh:  # what is done so far
                            json.dump({"entries": entries, "gloo": glos}, fh, indent=1)
                if not args.no_gloo:
                    glos[key] = run_gloo(tb, hosts, ppn, args)
            with open(args.json, "w") as fh:
                json.dump({"entries": entries, "gloo": glos}, fh, indent=1)
    with open("/proc/loadavg") as fh:
        print(f"load after: {fh.read().strip()}", flush=True)
    report(entries, glos, args.plot)
    print(f"raw numbers: {args.json}")
    return 0


def report(entries: list[dict], glos: dict, plot_path: str) -> None:
    """The tables, the score against the targets, and the plot."""
    for e in entries:
        print(f"\n### {e['coll']}, {e['layout']} at {e['rate']}\n")
        print(table(e, glos.get(e["key"], {})))
    print("\n" + score(entries, glos))
    print(f"plot: {plot_path}" if plot(entries, glos, plot_path)
          else "plot: skipped (matplotlib is not installed)")


def score(entries: list[dict], glos: dict) -> str:
    """How often the default is within 10% of the best ringtree algorithm (its own run,
    and its choice's forced run: the choice is right even when the default's run drew a
    slow sample), and the default's fraction of the link bound and ratio to gloo at
    >= 16 MiB."""
    near = forced = total = 0
    big = []
    for e in entries:
        g = glos.get(e["key"], {})
        for nbytes_s, r in e["results"].items():
            med = {a: statistics.median(v) for a, v in r["times"].items()}
            best = min(t for a, t in med.items() if a != "None")
            total += 1
            near += med["None"] <= 1.1 * best
            forced += med.get(r["choice"], math.inf) <= 1.1 * best
            if int(nbytes_s) >= 16 << 20:
                gm = g.get(f"{e['coll']}/{nbytes_s}")
                bound = link_bound(e["coll"], int(nbytes_s), e["hosts"], e["rate_bps"])
                big.append((bound / med["None"], statistics.median(gm) / med["None"]
                            if gm else math.nan, e, nbytes_s))
    lines = [f"default within 10% of the best ringtree algorithm: {near} of {total} sizes "
             f"(its choice, forced: {forced} of {total})"]
    for frac, vs_gloo, e, nb in big:
        lines.append(f"{e['key']} {e['coll']} {show_size(int(nb))}: {frac:.0%} of the link "
                     f"bound, gloo/default {vs_gloo:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
