"""Training throughput of ``ringtree train`` on the ringtree backend against gloo.

    python benchmarks/train.py                     # the table of the closing note
    python benchmarks/train.py --steps 30 --repeat 5 --json out.json
    python benchmarks/train.py --no-bubble --grids dp4,tp2dp2   # a subset of the rows

The rows: DP=4, TP=2 x DP=2, PP=2 x DP=2, DP=2 x TP=2 x PP=2 at the global batch and
micro-batches given (32 and 4 by default), and one labelled communication-heavier row,
DP=4 at global batch 8 in one micro-batch (``dp4small``).

For each grid (DP=4, TP=2 x DP=2, PP=2 x DP=2, DP=2 x TP=2 x PP=2) and each backend it
launches ``ringtree run -n N ringtree train ... --json`` (the CLI users run), repeats it,
and reports the median tokens/s and median step time, then ringtree's tokens/s over
gloo's, and the CPU seconds all processes of a run used (start-up and evaluation
included) divided by its steps: a backend that burns CPU while it waits takes it from
the other ranks' compute, since 4-8 ranks share the cores here. Then the pipeline bubble: measured by the 1F1B executor (share of a stage's step
spent outside compute) against (p-1)/(m+p-1), for PP=2 and PP=4 at several m.

Same model, data, seed and global batch on every row but ``dp4small``; the first step of each run is
left out of tokens/s (warm-up). A second table splits each row's median step into the
time ranks spent blocked in communication per axis (tp, pp, dp and the loss all-reduce;
medians of the runs' ``wait_ms``) and the rest (compute, optimizer, data), which bounds
what any backend can gain. ``/proc/loadavg`` is printed before and after: on a shared
machine the numbers move, rerun before quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

GRIDS = {"dp4": ("DP=4", 4, 1, 1), "tp2dp2": ("TP=2 x DP=2", 2, 2, 1),
         "pp2dp2": ("PP=2 x DP=2", 2, 1, 2), "dp2tp2pp2": ("DP=2 x TP=2 x PP=2", 2, 2, 2),
         "dp4small": ("DP=4, batch 8, 1 micro-batch (communication-heavier)", 4, 1, 1)}
# Rows that change the run's batch: (global batch, micro-batches). DP=4 at batch 8 is the
# small-batch end of data parallelism (2 sequences per rank per step): a quarter of the
# compute for the same gradient all-reduce. It is a second, labelled row next to DP=4,
# not a replacement for it.
BATCH = {"dp4small": (8, 1)}
AXES = ("tp", "pp", "dp", "loss")  # wait_ms keys of ``ringtree train --json``
BUBBLE = re.compile(r"bubble measured ([0-9.]+), formula \(p-1\)/\(m\+p-1\) = ([0-9.]+)")


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "n/a"


def run_train(dp: int, tp: int, pp: int, backend: str, args, micro: int | None = None,
              extra: list[str] | None = None, batch: int | None = None
              ) -> tuple[dict, float | None, float]:
    """One ``ringtree train`` job: its --json, the measured bubble (pp > 1) and the CPU
    seconds its processes used (children's rusage, launcher included)."""
    n = dp * tp * pp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", str(n), sys.executable,
               "-m", "ringtree.cli", "train", "--dp", str(dp), "--tp", str(tp), "--pp",
               str(pp), "--micro-batches", str(micro or args.micro_batches), "--steps",
               str(args.steps), "--batch-size", str(batch or args.batch_size), "--backend", backend,
               "--layers", str(args.layers), "--embd", str(args.embd), "--heads", "4",
               "--block-size", str(args.block_size), "--eval-batches", "1", "--no-progress",
               "--json", out, *(extra or [])]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
        with open(out) as f:
            res = json.load(f)
    m = BUBBLE.search(p.stdout)
    return res, float(m.group(1)) if m else None, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--no-bubble", action="store_true")
    ap.add_argument("--only-bubble", action="store_true", help="skip the throughput table")
    ap.add_argument("--bubble-repeat", type=int, default=1, help="runs per bubble point")
    ap.add_argument("--grids", default=",".join(GRIDS),
                    help=f"comma-separated rows to run, of {', '.join(GRIDS)}")
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args(argv)
    unknown = [g for g in args.grids.split(",") if g not in GRIDS]
    if unknown:
        ap.error(f"--grids: unknown {', '.join(unknown)}; known: {', '.join(GRIDS)}")
    sys.stdout.reconfigure(line_buffering=True)  # rows appear as they are measured
    print(f"# loadavg before: {loadavg()}")
    print(f"# model: {args.layers} layers, d={args.embd}, T={args.block_size}; global batch "
          f"{args.batch_size} sequences, {args.micro_batches} micro-batches, {args.steps} "
          f"steps, median of {args.repeat} runs" + "".join(
              f"; {k}: batch {b}, {m} micro-batch(es)" for k, (b, m) in BATCH.items()
              if k in args.grids.split(",")))
    rows, raw = [], {}
    for key in ([] if args.only_bubble else args.grids.split(",")):
        name, dp, tp, pp = GRIDS[key]
        batch, micro = BATCH.get(key, (None, None))
        cell = {}
        runs: dict[str, list] = {"ringtree": [], "gloo": []}
        waits: dict[str, list] = {"ringtree": [], "gloo": []}
        for _ in range(args.repeat):  # interleaved, so a change of load hits both alike
            for backend in runs:
                res, _, cpu = run_train(dp, tp, pp, backend, args, micro=micro, batch=batch)
                runs[backend].append((res["tokens_per_s"], statistics.median(
                    res["step_ms"][1:] or res["step_ms"]), cpu / args.steps))
                waits[backend].append(res.get("wait_ms", {}))
        for backend, rs in runs.items():
            tps, ms, cpu = ([r[i] for r in rs] for i in range(3))
            cell[backend] = (statistics.median(tps), statistics.median(ms),
                             statistics.median(cpu))
            raw[f"{name}/{backend}"] = {"tokens_per_s": tps, "step_ms_median": ms,
                                        "cpu_s_per_step": cpu, "wait_ms": waits[backend]}
            cell[backend + "/waits"] = {axis: statistics.median(w.get(axis, 0.0) for w in
                                                                waits[backend])
                                        for axis in AXES}
        rows.append((name, cell))
        print(f"# {name}: ringtree {runs['ringtree']}, gloo {runs['gloo']} "
              f"(tokens/s, step ms, CPU s/step); loadavg {loadavg()}")
    if rows:
        print("\n| grid | ringtree tokens/s | gloo tokens/s | ratio | ringtree step ms | "
              "gloo step ms | ringtree CPU s/step | gloo CPU s/step |")
        print("|---|---|---|---|---|---|---|---|")
    for name, cell in rows:
        (rt, rms, rc), (gt, gms, gc) = cell["ringtree"], cell["gloo"]
        print(f"| {name} | {rt:,.0f} | {gt:,.0f} | {rt / gt:.2f} | {rms:.1f} | {gms:.1f} | "
              f"{rc:.2f} | {gc:.2f} |")
    if rows:
        print("\n| grid | backend | step ms | tp wait | pp wait | dp wait | loss all-reduce | "
              "rest (compute, optimizer) |")
        print("|---|---|---|---|---|---|---|---|")
    for name, cell in rows:
        for backend in ("ringtree", "gloo"):
            ms, w = cell[backend][1], cell[backend + "/waits"]
            print(f"| {name} | {backend} | {ms:.1f} | " + " | ".join(
                f"{w[a]:.1f}" for a in AXES) + f" | {ms - sum(w.values()):.1f} |")
    if not args.no_bubble:
        print("\n| pipeline | m | measured bubble (1F1B, ringtree) | (p-1)/(m+p-1) |")
        print("|---|---|---|---|")
        for pp in (2, 4):
            for m in (1, 2, 4, 8):
                if args.batch_size % m:
                    continue
                bubbles = [run_train(1, 1, pp, "ringtree", args, micro=m)[1]
                           for _ in range(args.bubble_repeat)]
                b = statistics.median(x for x in bubbles if x is not None)
                raw[f"bubble/pp{pp}/m{m}"] = bubbles
                print(f"| PP={pp} | {m} | {b:.3f} | {(pp - 1) / (m + pp - 1):.3f} |")
    print(f"\n# loadavg after: {loadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
