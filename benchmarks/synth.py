"""Synthesized schedules (``ringtree algo synth``) against ringtree's best existing
algorithm: simulated on presets, and run for real on an uneven namespace testbed.

Simulated (default): for each preset, the all-gather and reduce-scatter trees are packed
once (:func:`ringtree.sim.synth.synthesize`, the chunk count chosen by simulating the
all-gather at ``--size``), then every collective is simulated (aware model) with the
synthesized schedule and with every registered algorithm of it; the table gives the
bandwidth bound (ForestColl's x*; the all-reduce as reduce-scatter + all-gather), the
synthesized time as a multiple of it, the best existing algorithm and the speed-up.

    python benchmarks/synth.py [--size 1G] [--presets switch:8,torus:16,mi300x:2,...]

Real (``--testbed``): 2 hosts × 4 ranks on the namespace testbed (:mod:`ringtree.testbed`),
every link shaped to ``--rate`` but host 1's to ``--slow`` of it; the trees are packed for
the matching preset (``testbed_slow``), written to a forest file and run as
``algo="synth:FILE"``, next to the default (the planner's choice) and the hierarchical
algorithm, ``--reps`` interleaved repetitions of ``--iters`` calls each at ``--real-size``
(16 MiB); the median time per call of the slowest rank. Needs root (namespaces, tc).

    python benchmarks/synth.py --testbed [--rate 1gbit --slow 0.5 --coll all_reduce]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

PRESETS = "switch:8,ring:8,torus:16,mi300x:2,mi300x_slow_nic:2,testbed_slow:2"
COLLS = ("all_gather", "reduce_scatter", "all_reduce")


def simulated(presets_arg: str, size: int) -> None:
    from ringtree.schedules import algorithms, synth
    from ringtree.sim import simulate
    from ringtree.sim.machine import presets
    from ringtree.sim.synth import bound_ns, synthesize

    print(f"# simulated, aware model, {size} B per call (nccl-tests size)")
    print(f"{'preset':<22} {'collective':<15} {'bound us':>10} {'synth us':>10} {'×bound':>7} "
          f"{'best existing':>16} {'us':>10} {'speed-up':>8}  trees  synth s")
    for item in presets_arg.split(","):
        name, _, nodes = item.partition(":")
        topo = presets.get(name, int(nodes) if nodes else None)
        t0 = time.perf_counter()
        forest = synthesize(topo, size=size)
        took = time.perf_counter() - t0
        algo = synth.define(synth.PREFIX + topo.name, forest)
        for coll in COLLS:
            floor = bound_ns(forest, coll, size)
            mine = simulate(coll, algo, topo, size).time_ns
            best = None
            for other in algorithms(coll):
                if other.startswith(synth.PREFIX):
                    continue
                try:
                    t = simulate(coll, other, topo, size).time_ns
                except (ValueError, RuntimeError):
                    continue       # needs a switch, or the work budget refuses it
                if best is None or t < best[0]:
                    best = (t, other)
            assert best is not None
            print(f"{topo.name:<22} {coll:<15} {floor / 1e3:10.1f} {mine / 1e3:10.1f} "
                  f"{mine / floor:7.3f} {best[1]:>16} {best[0] / 1e3:10.1f} "
                  f"{best[0] / mine:8.2f}  {len(forest.gather):5d}  {took:7.1f}",
                  flush=True)


def _timed(comm, coll: str, count: int, algos: list[str | None], iters: int, reps: int):
    """Median seconds per call of every algorithm (the slowest rank's), interleaved."""
    import numpy as np

    n = comm.size
    x = (np.arange(count, dtype=np.float32) % 7) + comm.rank
    y = np.empty(count * n if coll == "all_gather" else count // n if
                 coll == "reduce_scatter" else count, np.float32)
    ops = {a: {"all_reduce": lambda a=a: comm.all_reduce(x, out=y, algo=a),
               "all_gather": lambda a=a: comm.all_gather(x, out=y.reshape(n, count), algo=a),
               "reduce_scatter": lambda a=a: comm.reduce_scatter(x, out=y, algo=a)}[coll]
           for a in algos}
    first = {}
    for a, op in ops.items():
        op()
        first[a] = y.copy()
    same = all(np.array_equal(first[a], first[algos[0]]) for a in algos)
    times: dict = {a: [] for a in algos}
    for rep in range(reps):
        for a in algos[rep % len(algos):] + algos[:rep % len(algos)]:
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                ops[a]()
            times[a].append((time.perf_counter() - t0) / iters)
    comm.barrier()              # nobody closes while a peer still reads its last call
    return {str(a): statistics.median(ts) for a, ts in times.items()}, same


def testbed(args) -> int:
    from ringtree.schedules import synth
    from ringtree.sim.cli import parse_size
    from ringtree.sim.machine import presets
    from ringtree.sim.synth import synthesize
    from ringtree.testbed import Testbed
    from ringtree.testbed.netns import parse_rate
    from ringtree.testbed.pool import run_hosts

    size = parse_size(args.real_size)
    gbit = parse_rate(args.rate) / 1e9
    topo = presets.testbed(2, 4, gbit, args.slow)
    path = os.path.join(tempfile.mkdtemp(), f"{topo.name}.json")
    synth.save(synthesize(topo, size=size), path)
    count = size // 4 if args.coll != "all_gather" else size // 4 // 8
    algos = [None, "hierarchical", f"synth:{path}"]
    with Testbed(2, rate=args.rate) as tb:
        tb.shape(1, parse_rate(args.rate) * args.slow)
        got = run_hosts(tb, 4, _timed, args.coll, count, algos, args.iters, args.reps,
                        timeout=3600)
    bad = [g for g in got if isinstance(g, BaseException)]
    if bad:
        print(f"failed: {bad[0]!r}", file=sys.stderr)
        return 1
    times = {a: max(g[0][a] for g in got) for a in got[0][0]}
    print(f"# testbed 2 hosts × 4 ranks, {args.rate} links, host 1 at {args.slow:g}×; "
          f"{args.coll} of {size} B, median of {args.reps} × {args.iters} calls; "
          f"every algorithm's result bitwise equal on every rank: "
          f"{all(g[1] for g in got)}")
    for a, t in times.items():
        print(f"{'default' if a == 'None' else a:<40} {t * 1e3:9.1f} ms  "
              f"{times['None'] / t:5.2f}× the default")
    return 0


def main(argv: list[str] | None = None) -> int:
    from ringtree.sim.cli import parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1G", help="simulated call size (default 1G)")
    p.add_argument("--presets", default=PRESETS, help=f"NAME:NODES,... (default {PRESETS})")
    p.add_argument("--testbed", action="store_true", help="the real run instead")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--slow", type=float, default=0.5)
    p.add_argument("--coll", default="all_reduce", choices=COLLS)
    p.add_argument("--real-size", default="16M")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    if args.testbed:
        return testbed(args)
    simulated(args.presets, parse_size(args.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
