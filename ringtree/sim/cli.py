"""``ringtree sim``: nccl-tests style tables of simulated collectives.

    ringtree sim all_reduce --topology dgx_h100 --nodes 128 --algo ring,tree -b 8 -e 1G -f 4

prints, per algorithm, the nccl-tests columns (size, count, type, redop, root, time,
algbw, busbw — busbw with nccl-tests' factors) with a ``*`` on the rows where that
algorithm is the fastest, then a side-by-side summary. ``--plot`` draws busbw against
size (needs matplotlib), ``--trace`` writes a Chrome/Perfetto trace of each algorithm's
largest size.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ringtree.ir.program import Collective, parse_collective
from ringtree.schedules import algorithms
from ringtree.sim import SimRun, Sweep, budget, count_for, simulate, simulate_sizes
from ringtree.sim.engines.dispatch import ENGINES
from ringtree.sim.jobs import default_jobs, run_all
from ringtree.sim.machine import presets
from ringtree.sim.malloc import keep_arrays_in_heap
from ringtree.sim.progress import Progress, cpu_seconds, peak_rss_mib

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
DTYPES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "int32": 4,
          "int64": 8, "uint8": 1}


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``1M``, ``1G`` (powers of 1024, as nccl-tests reads them)."""
    t = text.strip().upper().rstrip("B")
    unit = t[-1] if t and t[-1] in UNITS else ""
    return int(float(t[: len(t) - len(unit)]) * UNITS[unit])


def sizes(lo: int, hi: int, factor: int, incr: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s = s * factor if factor > 1 else s + max(1, incr)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringtree sim", description=__doc__.split("\n\n")[0])
    p.add_argument("collective", help="all_reduce, all_gather, reduce_scatter, broadcast, ...")
    p.add_argument("--topology", "-t", default="dgx_h100",
                   help=f"preset ({', '.join(presets.PRESETS)}) or a JSON/YAML file")
    p.add_argument("--nodes", "-N", type=int, default=None,
                   help="hosts (NPUs for ring/torus/switch presets)")
    p.add_argument("--algo", "-a", default="all",
                   help="comma-separated algorithms, or all; synth: trees packed for the "
                        "topology (ringtree algo synth)")
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="128M")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-i", "--stepbytes", default="1M")
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("--channels", "-c", type=int, default=None,
                   help="channels per schedule (default: the topology's, e.g. its NICs)")
    p.add_argument("--model", "-m", default="aware", choices=["aware", "unaware", "fast"])
    p.add_argument("--proto", "-p", default=None,
                   help="NCCL protocols, NCCL_PROTO's syntax (LL,LL128 / ^LL128 / "
                        "allreduce:LL); each row shows the fastest enabled one; none: "
                        "the topology's own costs. Default: auto (all three) on GPU "
                        "presets, none elsewhere")
    p.add_argument("--slice", default="1M", help="executor slice size (default 1M)")
    p.add_argument("--plot", help="write busbw vs size to this PNG (needs matplotlib)")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the largest size")
    p.add_argument("--no-fold", action="store_true",
                   help="simulate every rank's own Program with the event engine (no "
                        "symmetry folding, no shared programs, no structure compiled once "
                        "per sweep; same answers, slower)")
    p.add_argument("--max-work", type=float, default=budget.MAX_WORK,
                   help="skip an algorithm whose run would simulate more steps and slices "
                        f"than this once folded (default {budget.MAX_WORK:.3g}; 0: no limit)")
    p.add_argument("-j", "--jobs", type=int, default=0,
                   help="algorithms simulated at once, one process each (default: one per "
                        "core, at most one per algorithm; 1: one after another)")
    p.add_argument("--engine", default=None, choices=["auto", *ENGINES],
                   help="run every size on this engine only (default: RINGTREE_SIM_ENGINE, "
                        "else the first that accepts it; -v names it)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print wall time, peak memory, events per second, and the engine "
                        "of every row with why the ones before it declined")
    return p


def _row(run: SimRun, count: int, dtype: str, root: int, best: bool) -> str:
    us = run.time_ns / 1e3
    proto = f"  {run.proto:>6}" if run.proto else ""
    return (f"{run.nbytes:12d}  {count:12d}  {dtype:>8}  {'sum':>6}  {root:6d}  "
            f"{us:9.2f}  {run.algbw:7.2f}  {run.busbw:7.2f}{proto}{'  *' if best else ''}")


def _imported(algo: str, coll: Collective) -> str:
    """``algo`` as registered: an MSCCL-IR file (``msccl:PATH``, ``msccl:NAME``) is read,
    proven and registered under ``msccl:<stem>`` (:mod:`ringtree.msccl.catalog`)."""
    if not algo.lower().startswith("msccl:"):
        return algo.lower()
    from ringtree.msccl import MscclError, MscclSyntaxError
    from ringtree.msccl.catalog import resolve

    try:
        entry = resolve(algo)
    except (MscclError, MscclSyntaxError, OSError) as e:
        raise ValueError(str(e)) from None
    if entry.collective is not coll:
        raise ValueError(f"{algo} is an MSCCL-IR {entry.collective.value}, not {coll.value}")
    return entry.name


def _setup(args) -> tuple | str:
    """(collective, topology, algorithms) of the command line, or what is wrong with it."""
    try:
        coll = parse_collective(args.collective)
        topo = presets.get(args.topology, args.nodes)
    except ValueError as e:
        return str(e)
    try:
        algos = algorithms(coll) if args.algo == "all" else \
            [_imported(a.strip(), coll) for a in args.algo.split(",")]
        if any(a.startswith("synth") for a in algos):
            from ringtree.sim.synth import resolve_names  # packs trees: networkx

            algos = resolve_names(algos, topo)
    except (ValueError, RuntimeError) as e:
        return str(e)
    known = algorithms(coll)
    bad = [a for a in algos if a not in known]
    if bad:
        return f"no algorithm {', '.join(bad)} for {coll.value} (known: {', '.join(known)})"
    return coll, topo, algos


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--workload" or a.startswith("--workload=") for a in argv):
        from ringtree.sim.workload import main as replay_workload  # training-step replay

        return replay_workload(argv)
    args = _parser().parse_args(argv)
    keep_arrays_in_heap()                    # the batched engines' arrays: no mmap per level
    got = _setup(args)
    if isinstance(got, str):
        print(f"ringtree sim: {got}", file=sys.stderr)
        return 2
    coll, topo, algos = got
    proto = args.proto if args.proto is not None else ("auto" if topo.arch else "none")
    proto = None if proto.lower() == "none" else proto
    itemsize = DTYPES[args.datatype]
    todo = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor,
                 parse_size(args.stepbytes))
    root = args.root if coll in (Collective.BROADCAST, Collective.REDUCE, Collective.GATHER,
                                 Collective.SCATTER) else -1
    print(f"# ringtree sim {coll.value} on {topo.name}: {topo.nranks} ranks, "
          f"model {args.model}, channels {args.channels or topo.channels}, "
          f"slice {parse_size(args.slice)} B{f', protocols {proto}' if proto else ''}")
    results: dict[str, dict[int, SimRun]] = {}
    walls: dict[str, float] = {}
    t_all = time.perf_counter()
    order = todo[::-1]                       # the largest first: refused at once

    def one(algo: str, each: Callable[[int], None]) -> tuple:
        """One algorithm's sweep: ("ok", runs, wall) or ("skipped", why, sizes run)."""
        t0 = time.perf_counter()
        finished = [0]

        def done(_: int, run: SimRun) -> None:
            finished[0] += 1
            each(run.events)

        try:
            runs = simulate_sizes(
                coll, algo, topo, order, model=args.model, itemsize=itemsize,
                root=max(root, 0), channels=args.channels,
                slice_bytes=parse_size(args.slice), symmetry=not args.no_fold,
                sweep=None if args.no_fold else Sweep(), max_work=int(args.max_work),
                each=done, engine=args.engine, proto=proto)
        except (ValueError, RuntimeError) as e:
            return ("skipped", str(e), finished[0])
        # the tables need times, not every step's (nor sent back from a worker)
        return ("ok", [replace(r, result=None) for r in runs], time.perf_counter() - t0)

    with Progress(len(algos) * len(todo)) as bar:
        def done_one(algo: str, events: int) -> None:
            bar.text = algo
            bar.done_one(events)

        jobs = args.jobs if args.jobs > 0 else default_jobs(len(algos))
        for algo, outcome in run_all(algos, one, jobs, done_one).items():
            if outcome[0] == "skipped":
                bar.skip(len(todo) - outcome[2])   # the sizes not run
                print(f"# {algo}: skipped ({outcome[1]})", flush=True)
                continue
            results[algo] = dict(zip(order, outcome[1]))
            walls[algo] = outcome[2]
    _tables(results, todo, coll, topo.nranks, itemsize, args.datatype, root)
    if args.verbose:
        _report(results, walls, time.perf_counter() - t_all, jobs)
        _engines(results, todo)
    if args.plot and results:
        _plot(args.plot, results, todo, coll, topo.name)
    if args.trace and results:
        _trace(args.trace, results, coll, topo, todo[-1], args, itemsize)
    return 0


def _tables(results: dict[str, dict[int, SimRun]], todo: list[int], coll: Collective,
            nranks: int, itemsize: int, datatype: str, root: int) -> None:
    """nccl-tests' table of every algorithm, then the times side by side."""
    best = {s: min((r[s].time_ns, a) for a, r in results.items())[1] for s in todo} \
        if results else {}
    for algo, runs in results.items():
        print(f"#\n# algo: {algo}")
        pr = "   proto" if any(r.proto for r in runs.values()) else ""
        print("#       size         count      type   redop    root      time   algbw   busbw"
              + pr)
        print("#        (B)    (elements)                                (us)  (GB/s)  (GB/s)")
        for s in todo:
            print(_row(runs[s], count_for(coll, s, nranks, itemsize), datatype, root,
                       best[s] == algo and len(results) > 1))
    if len(results) > 1:
        names = list(results)
        print("#\n# time (us) per algorithm; * = fastest")
        print("#       size  " + "".join(f"{a:>16}" for a in names))
        for s in todo:
            cells = "".join(f"{results[a][s].time_ns / 1e3:15.2f}{'*' if best[s] == a else ' '}"
                            for a in names)
            print(f"{s:12d}  {cells}")


def _report(results: dict, walls: dict, total: float, jobs: int) -> None:
    """``-v``: wall time, peak memory, events per second (on stderr, so tables compare)."""
    events = sum(r.events for runs in results.values() for r in runs.values())
    for algo, runs in results.items():
        ev = sum(r.events for r in runs.values())
        sims = sorted({r.simulated for r in runs.values()})
        print(f"# {algo}: {walls[algo]:.2f} s wall, {ev:,d} events "
              f"({ev / max(walls[algo], 1e-9):,.0f}/s), ranks simulated "
              f"{'/'.join(map(str, sims))}", file=sys.stderr)
    print(f"# total {total:.2f} s wall, {cpu_seconds():.2f} s CPU over {jobs} "
          f"process{'es' if jobs > 1 else ''}, {events:,d} events "
          f"({events / max(total, 1e-9):,.0f}/s), peak memory {peak_rss_mib():.0f} MiB",
          file=sys.stderr)


def _engines(results: dict, todo: list[int]) -> None:
    """``-v``: the engine of every row, and why the ones before it declined (stderr);
    consecutive sizes that ran alike on one line."""
    for algo, runs in results.items():
        rows = [(s, runs[s].engine, runs[s].declined) for s in todo]
        while rows:
            k = 1
            while k < len(rows) and rows[k][1:] == rows[0][1:]:
                k += 1
            (lo, engine, declined), hi = rows[0], rows[k - 1][0]
            why = "; ".join(f"{name}: {reason}" for name, reason in declined)
            sizes = f"{lo} B" if lo == hi else f"{lo}-{hi} B"
            print(f"# {algo} {sizes}: {engine}{f' ({why})' if why else ''}", file=sys.stderr)
            rows = rows[k:]


def _plot(path: str, results: dict, todo: list[int], coll: Collective, name: str) -> None:
    from ringtree.tools.figure import FigureUnavailable, pyplot

    try:
        plt = pyplot("--plot")
    except FigureUnavailable as e:
        print(f"# {e}", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for algo, runs in results.items():
        ax.plot(todo, [runs[s].busbw for s in todo], marker="o", label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (B)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{coll.value} on {name} (simulated)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    print(f"# plot written to {path}")


def _trace(path: str, results: dict, coll: Collective, topo, size: int, args,
           itemsize: int) -> None:
    from ringtree.sim import trace

    for algo in results:
        out = Path(path)
        if len(results) > 1:
            out = out.with_name(f"{out.stem}.{algo}{out.suffix or '.json'}")
        proto = results[algo][size].proto or None
        run = simulate(coll, algo, topo, size, model="aware" if args.model == "fast" else
                       args.model, itemsize=itemsize, root=max(args.root, 0),
                       channels=args.channels, slice_bytes=parse_size(args.slice), trace=True,
                       proto=proto)
        res = run.result
        assert res is not None and res.compiled is not None and res.devices is not None
        trace.write(out, res, res.compiled, topo, res.devices)
        print(f"# trace of {algo} at {size} B written to {out}")


if __name__ == "__main__":
    sys.exit(main())
