"""Registered buffers (``Communicator.zeros``: the peers read them in place,
``runtime/protocols/ll_reg.py``) against the same calls on plain NumPy buffers and the
machine's limit, alternated in one job.

For each rank count, one ``ringtree run`` job (pinned when the ranks fit the cores); in
it, for each collective and size, blocks of back-to-back calls of four variants in
turn (A B C D, B C D A, ...: the order turns each round): ``plain`` (``np.ones`` buffers: the library's ordinary path),
``registered`` (the same call on ``comm.zeros`` buffers), ``registered-py`` (the same
buffers with the compiled entry ``Round.reg`` set aside for the block: the path's NumPy
steps and Python agreement) and ``limit`` (the adds and
copies of ``benchmarks/cpu_peers_worker.py``'s ``Limit``, by the same processes). Prints
the median over blocks of the slowest rank's µs per call, wall time and the calling
thread's CPU time (on a loaded host a rank is often descheduled while its peer waits:
wall time then measures the load, CPU time what the calls cost), registered ÷ plain,
and each one's fraction of the limit (limit time ÷ its time; 1.0 = at the limit). All-reduce in
place; all-gather and reduce-scatter into a separate output; float32 sum; ``--colls
broadcast`` (root 0; its limit: one copy of the buffer) too.

    python benchmarks/ll_reg.py --ranks 2 4 --sizes 1M 16M 64M --rounds 5

``--min-bytes 0`` runs the registered variant on registered buffers at every size (the
library's ``ll_reg.MIN_BYTES`` otherwise sends small calls to the ordinary path): the
sweep that places the crossover, e.g. ``--sizes 256K 512K 1M 2M 4M 8M --min-bytes 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("plain", "registered", "registered-py", "limit")


def _calls(c, coll: str, count: int) -> dict:
    """Each variant's call (buffers allocated once) for ``count`` float32 elements of the
    larger buffer."""
    sys.path.insert(0, HERE)
    from cpu_peers_worker import Limit

    n = c.size
    per = count // n
    lim = Limit(c.rank, n, c.barrier)
    out = {}
    def registered(m: int) -> np.ndarray:
        a = c.empty(m, np.float32)
        a[...] = 1
        return a

    for v, alloc in (("plain", lambda m: np.ones(m, np.float32)), ("registered", registered)):
        if coll == "all_reduce":
            x = alloc(count)
            out[v] = lambda x=x: c.all_reduce(x)
        elif coll == "all_gather":
            x, y = alloc(per), alloc(per * n)
            out[v] = lambda x=x, y=y: c.all_gather(x, out=y)
        elif coll == "broadcast":
            x = alloc(count)
            out[v] = lambda x=x: c.broadcast(x, 0)
        else:
            x, y = alloc(per * n), alloc(per)
            out[v] = lambda x=x, y=y: c.reduce_scatter(x, out=y)
    x = np.ones(count, np.float32)
    y = np.ones(count, np.float32) if coll == "broadcast" else None

    def limit() -> None:
        if y is not None:  # a broadcast's: a rank but the root copies the buffer
            if c.rank:
                np.copyto(y, x)
            return
        with np.errstate(over="ignore"):  # its adds repeat on the same arrays
            getattr(lim, coll)(x, x) if coll != "all_reduce" else lim.all_reduce(x)
    out["limit"] = limit
    out["registered-py"] = out["registered"]
    return out


def _kernel(c, on: bool, saved: dict) -> None:
    """Set the registered calls' compiled entries aside (``on`` False) or back."""
    from ringtree.runtime.protocols import ll_reg

    reg = ll_reg.of(c, create=False)
    for rop in (reg.ops.values() if reg is not None else ()):
        if on:
            rop.k = saved.pop(rop, rop.k)
        else:
            saved.setdefault(rop, rop.k)
            rop.k = None


def worker(args) -> None:
    import ringtree

    c = ringtree.init()
    if args.min_bytes is not None:
        from ringtree.runtime.protocols import ll_reg

        reg = ll_reg.of(c)
        reg.min_bytes = dict.fromkeys(reg.min_bytes, args.min_bytes)
    res: dict = {}
    for coll in args.colls.split(","):
        for nbytes in args.sizes:
            calls = _calls(c, coll, nbytes // 4)
            iters = max(2, min(50, (16 << 20) // nbytes))
            got: dict = {v: ([], []) for v in VARIANTS}  # wall, CPU (this thread's)
            saved: dict = {}
            for k in range(args.rounds + 1):
                # the order turns each round: no variant always follows the same one (the
                # one after the registered variant, on the same buffers, found them warm)
                for v in VARIANTS[k % len(VARIANTS):] + VARIANTS[:k % len(VARIANTS)]:
                    _kernel(c, v != "registered-py", saved)
                    c.barrier()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    for _ in range(iters):
                        calls[v]()
                    if k:  # the first round warms up
                        got[v][0].append((time.perf_counter() - t0) / iters)
                        got[v][1].append((time.thread_time() - c0) / iters)
            slow = np.array([[got[v][i] for v in VARIANTS] for i in (0, 1)], np.float64)
            c.all_reduce(slow, op="max")  # the slowest rank's time of each block
            res.setdefault(coll, {})[nbytes] = slow.tolist()
    if c.rank == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    c.close()


def main(argv: list[str] | None = None) -> int:
    from ringtree.perf.flags import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["1M", "16M", "64M"])
    ap.add_argument("--colls", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-bytes", type=int, default=None,
                    help="registered buffers from this many bytes (default: the library's)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s, "--sizes") if isinstance(s, str) else s for s in args.sizes]
    if args.worker:
        worker(args)
        return 0
    run = os.path.join(os.path.dirname(sys.executable), "ringtree")
    cpus = len(os.sched_getaffinity(0))
    print(f"# load {os.getloadavg()[0]:.2f} at start; {args.rounds} alternated blocks; "
          f"µs per call, medians of the slowest rank")
    for n in args.ranks:
        out = tempfile.mktemp(suffix=".json")
        subprocess.run([run, "run", "-n", str(n), "--bind-to", "core" if n <= cpus else
                        "none", sys.executable, __file__, "--worker", "--out", out,
                        "--rounds", str(args.rounds), "--colls", args.colls, "--sizes",
                        *map(str, args.sizes)] + ([] if args.min_bytes is None else
                                                  ["--min-bytes", str(args.min_bytes)]),
                       check=True)
        with open(out) as f:
            res = json.load(f)
        os.unlink(out)
        for coll, per in res.items():
            for i, what in enumerate(("wall time", "CPU time")):
                print(f"\n### {coll}, {n} ranks{' (pinned)' if n <= cpus else ''}, {what}\n")
                print("| size | plain | registered | registered, no kernel | limit | "
                      "registered ÷ plain | no kernel ÷ plain | plain of limit | registered "
                      "of limit |\n|---|---|---|---|---|---|---|---|---|")
                for nbytes, slow in per.items():
                    p, r, rp, lim = (statistics.median(v) * 1e6 for v in slow[i])
                    print(f"| {int(nbytes) / 2 ** 20:g} MiB | {p:,.0f} | {r:,.0f} | {rp:,.0f} | "
                          f"{lim:,.0f} | {r / p:.2f} | {rp / p:.2f} | {lim / p:.2f} | "
                          f"{lim / r:.2f} |")
    print(f"\n# load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
