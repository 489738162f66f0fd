"""``ringtree algo synth``: a schedule packed into trees for a topology, at its bound.

    ringtree algo synth all_gather --topology mi300x_slow_nic --nodes 2 [--size 1G]
                        [-o FILE.json | -o FILE.xml] [--units K] [--proto Simple]

Synthesizes the all-gather and reduce-scatter trees of a simulator preset or topology
file (:mod:`ringtree.sim.synth`, ForestColl's spanning-tree packing), proves the
collective's Programs with the checker (out of place and in place), registers them as
``synth:<topology>`` and prints the bound, the rate reached and, with ``--size``, the
simulated time next to every registered algorithm of the collective. ``-o FILE.json``
writes the trees (``algo="synth:FILE.json"`` runs them on real ranks, no networkx
needed there); ``-o FILE.xml`` writes MSCCL-IR, proven equal to the Programs first.
"""

from __future__ import annotations

import argparse
import sys
import time

from ringtree.ir.check import CheckError
from ringtree.ir.program import parse_collective
from ringtree.schedules import algorithms, check, synth
from ringtree.sim.cli import parse_size


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringtree algo synth", description=__doc__.split("\n\n")[0])
    p.add_argument("collective", help="all_gather, reduce_scatter or all_reduce")
    p.add_argument("--topology", "-t", required=True, help="simulator preset or topology file")
    p.add_argument("--nodes", "-N", type=int, default=None,
                   help="hosts (NPUs for ring/torus/switch presets)")
    p.add_argument("--units", type=int, default=None,
                   help="chunks per rank's block the trees' weights are rounded to "
                        "(default: the fewest within 1 %%, or with --size the fastest "
                        "simulated)")
    p.add_argument("--size", help="also simulate a call of this size against every algorithm")
    p.add_argument("-o", "--output", metavar="FILE.json|FILE.xml",
                   help="write the trees (.json) or MSCCL-IR (.xml)")
    p.add_argument("--proto", default="Simple", choices=("Simple", "LL", "LL128"))
    return p


def _simulate(coll, name: str, topo, forest, nbytes: int) -> None:
    from ringtree.sim import simulate
    from ringtree.sim.synth import bound_ns

    floor = bound_ns(forest, coll, nbytes)
    print(f"# simulated {coll.value} of {nbytes} B (aware model); bandwidth bound "
          f"{floor / 1e3:.1f} us")
    rows = []
    for algo in algorithms(coll):
        if algo.startswith("synth:") and algo != name:
            continue
        try:
            rows.append((simulate(coll, algo, topo, nbytes).time_ns, algo))
        except (ValueError, RuntimeError) as e:
            print(f"#   {algo}: skipped ({str(e).splitlines()[0][:80]})")
    for t, algo in sorted(rows):
        print(f"#   {algo:<28} {t / 1e3:12.1f} us  {t / floor:6.3f}× bound")


def main(argv: list[str]) -> int:
    from ringtree.sim.machine import presets
    from ringtree.sim.synth import synthesize

    args = _parser().parse_args(argv)
    try:
        coll = parse_collective(args.collective)
        if coll not in synth.COLLECTIVES:
            raise ValueError(f"no synthesis for {coll.value} (only "
                             f"{', '.join(c.value for c in synth.COLLECTIVES)})")
        topo = presets.get(args.topology, args.nodes)
        t0 = time.perf_counter()
        forest = synthesize(topo, args.units,
                            parse_size(args.size) if args.size else None)
    except (ValueError, RuntimeError) as e:
        print(f"ringtree algo synth: {e}", file=sys.stderr)
        return 2
    name = synth.define(synth.PREFIX + topo.name, forest)
    f = forest
    print(f"# {name}: {f.nranks} ranks, synthesized in {time.perf_counter() - t0:.1f} s")
    for what, trees, rate, x in (("all-gather", f.gather, f.gather_rate, f.bound),
                                 ("reduce-scatter", f.reduce, f.reduce_rate, f.reduce_bound)):
        print(f"# {what} bound x* = {x:.3f} GB/s per rank; packed {f.units * rate:.3f} "
              f"({100 * f.units * rate / x:.1f} %) in {len(trees)} trees, each rank's block "
              f"in {f.units} chunk(s)")
    try:
        reports = check(coll, name, f.nranks)
    except CheckError as e:
        print(f"ringtree algo synth: the checker refuses {name}: {e}", file=sys.stderr)
        return 1
    modes = " and ".join("in place" if r.in_place else "out of place" for r in reports)
    print(f"# {coll.value}: proven {modes} ({reports[0].messages} messages, depth "
          f"{reports[0].depth})")
    if args.size:
        _simulate(coll, name, topo, f, parse_size(args.size))
    if args.output and args.output.endswith(".json"):
        synth.save(forest, args.output)
        print(f"# trees written to {args.output}: algo=\"synth:{args.output}\"")
    elif args.output:
        from ringtree.schedules import generate_all
        from ringtree.tools.algo import export_programs

        return export_programs(generate_all(coll, name, f.nranks), name, args.proto,
                               args.output)
    return 0
