"""Import, prove, run and simulate every MSCCL-IR file of a folder; print the table of
docs/msccl.md.

    python benchmarks/msccl_corpus.py DIR                 # e.g. the 27 public files
    python benchmarks/msccl_corpus.py DIR --real 8        # real ranks up to 8 GPUs only

Per file: collective, GPUs, protocol, thread blocks per GPU, what an executor would refuse
(findings), the ringtree channels it became, the checker's verdict (where it fails), the
most messages the file ever queues on one connection (MSCCL's sends block beyond 8);
then whether it gives exact results on as many real ranks of this machine as its GPUs
(one job per GPU count running every proven file of that count, in each mode the file
declares, on the protocol the planner gives it: its own LL where it says proto="LL");
its simulated time on a matching preset (``switch`` for 4 GPUs, ``dgx_a100`` with a
host per 8 GPUs) at a size inside its [minBytes, maxBytes] window, next to the best of
ringtree's own algorithms there; and the seconds to read, import, prove and simulate it.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

from ringtree import msccl
from ringtree.msccl import catalog
from ringtree.msccl.program import channel_edges
from ringtree.schedules import algorithms
from ringtree.sim import simulate
from ringtree.sim.machine import presets


def imp_name(path: str) -> str:
    return "msccl:" + os.path.splitext(os.path.basename(path))[0]


def preset_for(ngpus: int):
    """A simulator preset with ``ngpus`` ranks: NPUs on a switch for 4, else DGX A100
    hosts of 8 GPUs."""
    if ngpus % 8 == 0:
        return presets.get("dgx_a100", ngpus // 8)
    return presets.get("switch", ngpus)


def size_for(algo) -> int:
    """A power of two inside the file's [minBytes, maxBytes] window (1 MiB if it can)."""
    lo, hi = algo.min_bytes or 0, algo.max_bytes or 0
    size = 1 << 20
    if hi and size > hi:
        size = 1 << (hi.bit_length() - 1)
    while size < lo:
        size <<= 1
    return size


def simulated(imp, name: str) -> tuple[str, str, str]:
    """(preset and size, the file's time, the best own algorithm and its time)."""
    a = imp.algo
    topo = preset_for(a.ngpus)
    size = size_for(a)
    in_place = not (a.outofplace or a.outofplace is None and not a.inplace)
    t = simulate(a.collective, name, topo, size, in_place=in_place).time_ns / 1e3
    best = None
    for own in algorithms(a.collective):
        if own.startswith(("msccl:", "collnet")):
            continue
        try:
            u = simulate(a.collective, own, topo, size).time_ns / 1e3
        except (ValueError, RuntimeError):
            continue
        best = min(best or (u, own), (u, own))
    label = f"{topo.name}, {_bytes(size)}"
    return label, f"{t:,.1f}", f"{best[1]} {best[0]:,.1f}" if best else "—"


def _bytes(n: int) -> str:
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n >> k} {unit}"
    return f"{n} B"


def row(path: str) -> tuple[list[str], float, object]:
    """The table's cells for one file but the real-rank column, the seconds it took, and
    the import (None: refused)."""
    t0 = time.perf_counter()
    name = os.path.basename(path)
    try:
        algo, findings = msccl.read(path)
    except (msccl.MscclError, msccl.MscclSyntaxError) as e:
        return [f"`{name}`", *"—" * 6, f"not read: {str(e)[:120]}", *"—" * 4], 0.0, None
    blocks = sum(len(g.tbs) for g in algo.gpus) // algo.ngpus
    head = [f"`{name}`", algo.coll, str(algo.ngpus), algo.proto, str(blocks),
            str(len(findings) or "—")]
    try:
        imp = msccl.load(path, imp_name(path).lower())
        catalog.add(imp)
    except msccl.MscclError as e:
        why = e.findings[0].what if e.findings else str(e)
        why = why.replace(f"{imp_name(path).lower()} ", "")
        chans = "1 (merged)" if any(a > b for a, b in channel_edges(algo)) else \
            str(algo.nchannels)
        if len(why) > 300:  # a long chain of waits: its first links
            why = why[:300].rsplit("; ", 1)[0] + "; …"
        return head + [chans, f"**refused**: {why}", "—", "—", "—", "—"], \
            time.perf_counter() - t0, None
    p0 = imp.programs[0]
    chans = f"{len(p0.channels)}" + (" ordered" if p0.meta.get("ordered_channels") else "")
    modes = ", ".join("in place" if r.in_place else "out of place" for r in imp.reports)
    try:
        sim = simulated(imp, p0.algo)
    except (ValueError, RuntimeError) as e:
        sim = (f"not simulated: {str(e)[:80]}", "—", "—")
    return head + [chans, f"proven ({modes})", str(p0.meta["max_in_flight"]), *sim], \
        time.perf_counter() - t0, imp


def real_runs(proven: dict[str, object], most: int) -> tuple[dict[str, str], float]:
    """Per file, its verdict on as many real ranks as it has GPUs (one job per count)."""
    from ringtree.testing import run_msccl_files, run_ranks

    t0 = time.perf_counter()
    out: dict[str, str] = {}
    by_n: dict[int, list[str]] = {}
    for path, imp in proven.items():
        by_n.setdefault(imp.algo.ngpus, []).append(path)
    for n, paths in sorted(by_n.items()):
        if n > most:
            out.update(dict.fromkeys(paths, f"not run (over {most} ranks): checker and "
                                            "simulator only"))
            continue
        got = run_ranks(run_msccl_files, n, paths, timeout=1800)
        for i, path in enumerate(paths):
            seen = {str(g[i]) if isinstance(g, list) else f"error: {g!r}"[:100] for g in got}
            verdict = seen.pop() if len(seen) == 1 else "; ".join(sorted(seen))
            out[path] = verdict.replace("exact", f"exact, {n} ranks")
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--real", type=int, default=32,
                    help="run files of up to this many GPUs on real ranks (0: none)")
    args = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.folder, "*.xml")))
    if not files:
        print(f"no .xml files in {args.folder}", file=sys.stderr)
        return 1
    total, times, rows, proven = time.perf_counter(), [], {}, {}
    for path in files:
        cells, sec, imp = row(path)
        times.append((sec, os.path.basename(path)))
        rows[path] = cells
        if imp is not None:
            proven[path] = imp
    took = time.perf_counter() - total
    real, real_s = real_runs(proven, args.real) if args.real else ({}, 0.0)
    print("| file | coll | GPUs | proto | blocks/GPU | executor findings | ringtree channels | "
          "checker | most queued | preset, size | simulated (us) | ringtree's best (us) | "
          "real ranks | s |")
    print("|---|" * 1 + "---|" * 13)
    for path in files:
        c = rows[path]
        sec = next(s for s, f in times if f == os.path.basename(path))
        print("| " + " | ".join(c + [real.get(path, "—"), f"{sec:.2f}"]) + " |")
    worst = max(times)
    print(f"\n{len(files)} files read, imported, proven and simulated in {took:.1f} s "
          f"(slowest: {worst[1]}, {worst[0]:.2f} s); real-rank runs {real_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
