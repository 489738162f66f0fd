"""Import and prove every MSCCL-IR file of a folder; print the table of docs/msccl.md.

    python benchmarks/msccl_corpus.py DIR            # e.g. the 27 public files

Per file: collective, GPUs, protocol, thread blocks per GPU, what an executor would refuse
(findings), the ringtree channels it became, the checker's verdict (where it fails), the
most messages the file ever queues on one connection (MSCCL's sends block beyond 8), and
the seconds to read, import and prove it.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

from ringtree import msccl
from ringtree.msccl.program import channel_edges


def imp_name(path: str) -> str:
    return "msccl:" + os.path.splitext(os.path.basename(path))[0]


def row(path: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    name = os.path.basename(path)
    try:
        algo, findings = msccl.read(path)
    except (msccl.MscclError, msccl.MscclSyntaxError) as e:
        return f"| `{name}` | — | — | — | — | — | — | not read: {str(e)[:120]} | — |", 0.0
    blocks = sum(len(g.tbs) for g in algo.gpus) // algo.ngpus
    head = (f"| `{name}` | {algo.coll} | {algo.ngpus} | {algo.proto} | {blocks} | "
            f"{len(findings) or '—'} | ")
    try:
        imp = msccl.load(path)
    except msccl.MscclError as e:
        why = e.findings[0].what if e.findings else str(e)
        why = why.replace(f"{imp_name(path)} ", "")
        chans = "1 (merged)" if any(a > b for a, b in channel_edges(algo)) else algo.nchannels
        return head + f"{chans} | **refused**: {why[:230]} | — |", time.perf_counter() - t0
    p0 = imp.programs[0]
    chans = f"{len(p0.channels)}" + (" ordered" if p0.meta.get("ordered_channels") else "")
    modes = ", ".join("in place" if r.in_place else "out of place" for r in imp.reports)
    return head + f"{chans} | proven ({modes}) | {p0.meta['max_in_flight']} |", \
        time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    args = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.folder, "*.xml")))
    if not files:
        print(f"no .xml files in {args.folder}", file=sys.stderr)
        return 1
    print("| file | coll | GPUs | proto | blocks/GPU | executor findings | ringtree channels | "
          "checker | most queued |")
    print("|---|---|---|---|---|---|---|---|---|")
    total, times = time.perf_counter(), []
    for path in files:
        line, sec = row(path)
        times.append((sec, os.path.basename(path)))
        print(line)
    worst = max(times)
    print(f"\n{len(files)} files in {time.perf_counter() - total:.1f} s "
          f"(slowest: {worst[1]}, {worst[0]:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
