"""``ringtree algo``: list, show and check the schedule library.

    ringtree algo list [COLLECTIVE]
    ringtree algo show ALGO COLLECTIVE -n N [--root R] [--channels K]
                       [--nodes 0,0,1,1 | --ppn P] [--param KEY=VALUE ...]
                       [--time] [--long] [--png FILE]
    ringtree algo check ALGO|all COLLECTIVE|all -n N|A-B|A,B,... [same options]
    ringtree algo import FILE.xml ... [--strict]
    ringtree algo export ALGO COLLECTIVE -n N [--proto LL|LL128|Simple] [-o FILE.xml]
                         [--root R] [--channels K] [--nodes ... | --ppn P]
    ringtree algo synth COLLECTIVE --topology PRESET|FILE [--nodes N] [-o FILE.xml|.json]
"""

from __future__ import annotations

import argparse
import os
import sys

from ringtree.ir.program import Collective, parse_collective
from ringtree.schedules import Options, algorithms, generate_all, has
from ringtree.tools import figure


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rank count {text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"rank count must be >= 1, got {n}")
    return n


def _nranks(text: str) -> list[int]:
    """``8``, ``1-16`` or ``2,3,5``."""
    out: list[int] = []
    for part in text.split(","):
        a, sep, b = part.partition("-")
        lo = int(a)
        hi = int(b) if sep else lo
        out.extend(range(lo, hi + 1))
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"bad rank count {text!r}")
    return out


def _value(text: str) -> object:
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def _options(args: argparse.Namespace, n: int) -> Options:
    if args.nodes and args.ppn:
        raise ValueError("give --nodes or --ppn, not both")
    nodes: tuple[int, ...] | None = None
    if args.nodes:
        nodes = tuple(int(x) for x in args.nodes.split(","))
        if len(nodes) != n:
            raise ValueError(f"--nodes lists {len(nodes)} ranks, -n is {n}")
    elif args.ppn:
        nodes = tuple(r // args.ppn for r in range(n))
    params = []
    for kv in args.param or []:
        key, sep, val = kv.partition("=")
        if not sep:
            raise ValueError(f"--param wants KEY=VALUE, got {kv!r}")
        params.append((key.strip(), _value(val.strip())))
    root = args.root % n if args.root is not None and args.root < 0 else (args.root or 0)
    return Options(root=root, channels=args.channels, nodes=nodes, params=tuple(sorted(params)))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", help="algorithm name (see `ringtree algo list`)")
    p.add_argument("collective", help="all_reduce, all_gather, reduce_scatter, broadcast, ...")
    p.add_argument("--root", type=int, default=None, help="root rank (negative: from the end)")
    p.add_argument("--channels", type=int, default=1, help="channels (default 1)")
    p.add_argument("--nodes", help="node id of every rank, e.g. 0,0,1,1")
    p.add_argument("--ppn", type=int, help="ranks per node, nodes filled in rank order")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="algorithm parameter, e.g. pattern=split_tree, inter=tree, pipeline=4")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ringtree algo",
                                 description="list, show and check collective schedules")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="collectives × algorithms with their α-β-γ cost")
    ls.add_argument("collective", nargs="?")
    sh = sub.add_parser("show", help="print a schedule's step table (and draw it)")
    _common(sh)
    sh.add_argument("-n", "--nranks", type=_positive, required=True)
    sh.add_argument("--time", action="store_true",
                    help="columns are logical time (dependency depth), not program order")
    sh.add_argument("--long", action="store_true", help="NCCL primitive names in full")
    sh.add_argument("--width", type=int, help="table width (default: terminal)")
    sh.add_argument("--png", metavar="FILE", help="draw a rank/time diagram (matplotlib)")
    ck = sub.add_parser("check", help="run the symbolic checker")
    _common(ck)
    ck.add_argument("-n", "--nranks", type=_nranks, required=True, help="N, A-B or A,B,...")
    ck.add_argument("--no-in-place", action="store_true", help="skip the in-place check")
    im = sub.add_parser("import", help="read MSCCL-IR files and prove them")
    im.add_argument("files", nargs="+", metavar="FILE.xml")
    im.add_argument("--strict", action="store_true",
                    help="also fail on what NCCL's MSCCL executor or RCCL would refuse")
    ex = sub.add_parser("export", help="write a schedule as an MSCCL-IR file")
    _common(ex)
    ex.add_argument("-n", "--nranks", type=_positive, required=True)
    ex.add_argument("--proto", default="Simple", choices=("Simple", "LL", "LL128"))
    ex.add_argument("-o", "--output", metavar="FILE.xml", help="default: standard output")
    return ap


def _list(args: argparse.Namespace) -> int:
    from ringtree.tools.viz import cost_of

    colls = [parse_collective(args.collective)] if args.collective else list(Collective)
    rows = [(c.value, a, cost_of(c, a)) for c in colls for a in algorithms(c)]
    if not rows:
        print("no algorithms registered")
        return 0
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'collective':<{w0}}  {'algorithm':<{w1}}  cost (p ranks, n bytes; α latency, "
          f"β s/byte, γ reduce s/byte)")
    for c, a, cost in rows:
        print(f"{c:<{w0}}  {a:<{w1}}  {cost}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from ringtree.tools.viz import draw_png, step_table

    coll = parse_collective(args.collective)
    programs = generate_all(coll, args.algo, args.nranks, _options(args, args.nranks))
    print(step_table(programs, long=args.long, by_time=args.time, width=args.width))
    if args.png and not figure.write("ringtree algo", args.png,
                                     lambda path: draw_png(programs, path)):
        return 1
    return 0


def _check(args: argparse.Namespace) -> int:
    from ringtree.ir.check import CheckError, check_programs

    colls = list(Collective) if args.collective == "all" else [parse_collective(args.collective)]
    failed = checked = 0
    for coll in colls:
        algos = algorithms(coll) if args.algo == "all" else [args.algo]
        for algo in algos:
            if not has(coll, algo):
                if args.algo != "all" and args.collective != "all":
                    known = ", ".join(algorithms(coll)) or "none"
                    print(f"ringtree algo: no algorithm {algo!r} for {coll.value} "
                          f"(known: {known})", file=sys.stderr)
                    return 2
                continue
            for n in args.nranks:
                programs = generate_all(coll, algo, n, _options(args, n))
                modes = [] if programs[0].meta.get("in_place_only") else [False]
                if (not args.no_in_place and all(p.in_place_ok for p in programs)
                        and coll not in (Collective.GATHER, Collective.SCATTER,
                                         Collective.BARRIER)):
                    modes.append(True)
                for in_place in modes:
                    checked += 1
                    try:
                        rep = check_programs(programs, in_place=in_place)
                    except CheckError as e:
                        failed += 1
                        print(f"FAIL {algo} {coll.value} n={n}"
                              f"{' in-place' if in_place else ''}: {e}")
                        continue
                    print(f"ok   {algo} {coll.value} n={n}{' in-place' if in_place else ''}: "
                          f"{rep.messages} messages, {rep.max_steps} steps/rank max, "
                          f"depth {rep.depth}")
    print(f"{checked - failed}/{checked} checks passed")
    return 1 if failed else 0


def _import(args: argparse.Namespace) -> int:
    """Each file: what it is, what an executor would refuse, and the checker's verdict;
    non-zero if any file is wrong (or, with --strict, would be refused)."""
    from ringtree import msccl

    bad = 0
    for path in args.files:
        try:
            imp = msccl.load(path, strict=args.strict)
        except (msccl.MscclError, msccl.MscclSyntaxError, OSError) as e:
            bad += 1
            print(f"FAIL {e}")
            continue
        a, p0 = imp.algo, imp.programs[0]
        modes = " and ".join("in place" if r.in_place else "out of place" for r in imp.reports)
        layout = "one channel (dependencies both ways between channels)" \
            if len(p0.channels) == 1 and a.nchannels > 1 else \
            f"{len(p0.channels)} channel{'s' * (len(p0.channels) > 1)}" + (
                " sharing memory in order" if p0.meta.get("ordered_channels") else "")
        print(f"ok   {path}: {a.collective.value} on {a.ngpus} GPUs, {a.proto}, "
              f"{sum(len(g.tbs) for g in a.gpus) // a.ngpus} blocks/GPU → {layout}; "
              f"proven {modes} ({imp.reports[0].messages} messages, depth "
              f"{imp.reports[0].depth}); at most {p0.meta['max_in_flight']} message(s) "
              f"queued on one connection")
        for f in imp.findings:
            print(f"     {f.level}: {f}")
    return 1 if bad else 0


def _export(args: argparse.Namespace) -> int:
    """The MSCCL-IR file of a schedule, proven equal to it first: imported again, it
    computes the same bits as the schedule on every rank."""
    coll = parse_collective(args.collective)
    programs = generate_all(coll, args.algo, args.nranks, _options(args, args.nranks))
    return export_programs(programs, args.algo, args.proto, args.output)


def export_programs(programs: list, name: str, proto: str, output: str | None) -> int:
    """Write ``programs`` as MSCCL-IR to ``output`` (standard output if None) after
    proving the file computes what they do; 1 if it does not."""
    from ringtree import msccl
    from ringtree.ir.check import same_outputs
    from ringtree.msccl.export import from_programs
    from ringtree.msccl.program import to_programs

    coll, nranks = programs[0].collective, programs[0].nranks
    algo = from_programs(programs, f"ringtree {name}", proto)
    text = msccl.to_text(algo)
    again, findings = msccl.read_text(text, output or "<export>")
    if not same_outputs(programs, to_programs(again, name)):
        print(f"ringtree algo: the exported {name} does not compute what the schedule "
              "does (a bug: please report it)", file=sys.stderr)
        return 1
    for f in findings:
        print(f"ringtree algo: warning: {f}", file=sys.stderr)
    if output:
        with open(output, "w") as fh:
            fh.write(text)
        print(f"ringtree algo: wrote {output} ({coll.value} on {nranks} GPUs, "
              f"{algo.nchannels} channel(s), {sum(len(g.tbs) for g in algo.gpus)} thread "
              "blocks)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["synth"]:
        from ringtree.tools.synth import main as synth

        return synth(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        return {"list": _list, "show": _show, "check": _check, "import": _import,
                "export": _export}[args.cmd](args)
    except ValueError as e:
        print(f"ringtree algo: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:          # `ringtree algo show ... | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


if __name__ == "__main__":
    sys.exit(main())
