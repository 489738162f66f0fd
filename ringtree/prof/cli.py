"""``ringtree trace``: turn a profiler directory into a Perfetto trace or a text summary.

::

    RINGTREE_PROFILE=out ringtree run -n 4 python train.py
    ringtree trace out -o trace.json      # open in https://ui.perfetto.dev
    ringtree trace out --summary          # wait / transfer / reduce, slowest rank per step
"""

from __future__ import annotations

import argparse
import sys

from ringtree.prof import summary, trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ringtree trace",
                                 description="Merge per-rank profiler files (rank*.npz) into "
                                             "one Chrome/Perfetto trace.")
    ap.add_argument("dir", help="the RINGTREE_PROFILE / ringtree.prof.profile() directory")
    ap.add_argument("-o", "--output", help="write the trace JSON here")
    ap.add_argument("--summary", action="store_true",
                    help="print per collective: wait/transfer/reduce and the slowest rank "
                         "per step")
    args = ap.parse_args(argv)
    if not args.output and not args.summary:
        args.output = "trace.json"
    try:
        if args.output:
            t = trace.write(args.dir, args.output)
            od = t["otherData"]
            nev = sum(1 for e in t["traceEvents"] if e["ph"] in ("B", "s"))
            ranks = len({e["pid"] for e in t["traceEvents"]})
            print(f"wrote {args.output}: {ranks} ranks, {nev - od['flows']} slices, "
                  f"{od['flows']} flows"
                  + (f", {od['unmatched_sends']} unmatched sends" if od["unmatched_sends"]
                     else "")
                  + (f", {od['dropped']} events dropped (ring full)" if od["dropped"] else "")
                  + (f", {od['unfinished']} unfinished slices" if od["unfinished"] else ""))
        if args.summary:
            print(summary.summary(args.dir))
    except FileNotFoundError as e:
        print(f"ringtree trace: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
