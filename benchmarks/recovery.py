"""Recovery times after kill -9, and state-transfer bandwidth (``docs/fault-tolerance.md``).

    python benchmarks/recovery.py [--ranks 2,4,8] [--trials 30] [--json FILE]

Each *kill trial* starts N fresh ranks (:func:`ringtree.testing.run_ranks`, one host) that
all-reduce in a loop (8 B on LL or 1 MiB on Simple, chosen per trial); a thread of the
last rank SIGKILLs it at a random moment (uniform in 20–120 ms into the loop), after
writing the time to the store. From that moment each survivor records (a trial counts the last survivor's time):

- ``detect``: its blocked call returned an error that names the dead rank;
- ``agree``: ``comm.agree`` returned (every survivor holds the same failed set);
- ``shrink``: ``comm.shrink`` returned and the first all-reduce on the child finished.

Each *revoke trial* kills nobody: rank 0 calls ``comm.revoke()`` at a random moment while
the others are blocked in an all-reduce it never joins; ``revoke`` is when the last
blocked call returned :class:`~ringtree.errors.CommRevoked`, from the revoke.

``train_shrink`` / ``train_replace`` (``--train-trials K``): ``ringtree train --elastic``
runs whose last rank SIGKILLs itself in step 2 (``--kill``), under ``--enable-recovery``
or ``--max-restarts 1``: the seconds from the kill to the next committed step
(``resumed_s``; the replace path includes starting the new process and importing torch).

``transfer``: :func:`ringtree.resilience.transfer.stream` of ``--transfer-mib`` from N-1
sources to one newcomer over shared memory, CRC-32 per chunk included; GB/s at the
newcomer (median of ``--trials`` // 5 + 1 runs).

``--overhead`` runs only the failure-free overhead instead (``benchmarks/recovery_overhead.py``):
8 B latency and 1/16 MiB bus bandwidth with recovery on (``--max-restarts 1``, a
recoverable communicator) vs off, alternated over ``--rounds`` launches each, medians.

``--hosts`` runs only the two-host trials instead (``benchmarks/recovery_hosts.py``): 2 hosts
× 2 ranks on the namespace testbed, a rank killed on host 1, and host 1's link cut
(detection by deadline, ``--cut-timeout``).

``--cycles K`` runs only the kill/replace cycle drill instead (``benchmarks/recovery_cycles.py``):
one job of ``--ranks`` ranks (the first value, default 3) under ``ringtree run --max-restarts K``
kills and replaces a rank K times, and reports whether any process, file descriptor,
thread or shared-memory name was left behind.

The table gives p50 and p99 (p99 is the maximum below 100 trials) per N. Times are
``time.time()`` on one host (the ranks share its clock).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import threading
import time

import numpy as np

import ringtree
from ringtree.testing import run_ranks

KEY = "bench/killed_at"


def _loop(comm, x) -> float | str:
    """All-reduce until an error; when it came (or what was wrong)."""
    try:
        for _ in range(100_000):
            comm.all_reduce(x, timeout=120)
    except ringtree.RingtreeError as e:
        at = time.time()
        named = f"rank {comm.size - 1}" in str(e) or getattr(e, "peer", None) == comm.size - 1
        return at if named else f"unnamed: {e}"[:200]
    return "no error"


def kill_trial(comm, size_bytes: int, seed: int):
    rng = random.Random(seed)
    x = np.ones(max(1, size_bytes // 4), np.float32)
    comm.all_reduce(x)
    if comm.rank == comm.size - 1:
        delay = rng.uniform(0.02, 0.12)

        def die() -> None:
            comm.store.set(KEY, repr(time.time()).encode())
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(delay, die).start()
    detect = _loop(comm, x)
    killed = float(comm.store.get(KEY).decode())
    comm.revoke()
    comm.agree(1)
    agree = time.time()
    child = comm.shrink()
    child.all_reduce(np.ones(2, np.float32))
    shrink = time.time()
    child.close()
    if isinstance(detect, str):
        return detect
    return {"detect": detect - killed, "agree": agree - killed, "shrink": shrink - killed}


def revoke_trial(comm, size_bytes: int, seed: int):
    x = np.ones(max(1, size_bytes // 4), np.float32)
    comm.all_reduce(x)
    comm.agree(1)  # everyone has left that call before rank 0 may revoke
    if comm.rank == 0:
        time.sleep(random.Random(seed).uniform(0.02, 0.12))
        comm.store.set(KEY, repr(time.time()).encode())
        comm.revoke()
        return None
    try:
        comm.all_reduce(x, timeout=120)
        return "no error"
    except ringtree.CommRevoked:
        back = time.time()
    return back - float(comm.store.get(KEY).decode())


def transfer_run(comm, mib: int, reps: int):
    from ringtree.resilience.transfer import stream

    n = mib << 18  # float32 elements
    a = np.ones(n, np.float32) if comm.rank else np.zeros(n, np.float32)
    rates = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        stream(comm, [a], list(range(1, comm.size)), [0])
        rates.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates) if comm.rank == 0 else None


def train_trials(n: int, trials: int, launcher: list[str]) -> list[float]:
    """``resumed_s`` of ``ringtree train --elastic`` runs whose last rank is killed in step
    2 (a random phase): from the kill to the next committed step."""
    import subprocess
    import sys
    import tempfile

    out = []
    for t in range(trials):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            cmd = [sys.executable, "-m", "ringtree.cli", "run", "-n", str(n), *launcher,
                   sys.executable, "-m", "ringtree.cli", "train", "--elastic", "--dp", str(n),
                   "--layers", "1", "--heads", "2", "--embd", "32", "--block-size", "16",
                   "--batch-size", str(2 * n), "--steps", "4", "--seed", str(t),
                   "--no-progress", "--kill", f"{n - 1}:2", "--json", path]
            subprocess.run(cmd, capture_output=True, timeout=600,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
            if os.path.exists(path):
                with open(path) as f:
                    fails = json.load(f)["failures"]
                if fails and fails[0].get("resumed_s") is not None:
                    out.append(fails[0]["resumed_s"])
    return out


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def _report(res: dict, path: str | None) -> None:
    print(json.dumps(res, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default=None, help="default 2,4,8 (3 with --cycles)")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--transfer-mib", type=int, default=256)
    ap.add_argument("--train-trials", type=int, default=0,
                    help="also time ringtree train --elastic (shrink and replace) per N")
    ap.add_argument("--cycles", type=int, default=0,
                    help="only the kill/replace cycle drill, K cycles (see the docstring)")
    ap.add_argument("--overhead", action="store_true",
                    help="only the failure-free overhead, recovery on vs off "
                         "(benchmarks/recovery_overhead.py)")
    ap.add_argument("--rounds", type=int, default=8, help="--overhead: rounds per mode")
    ap.add_argument("--hosts", action="store_true",
                    help="only 2 hosts x 2 ranks on the namespace testbed: a kill and a cut "
                         "link (benchmarks/recovery_hosts.py)")
    ap.add_argument("--cut-timeout", type=float, default=3.0,
                    help="--hosts: RINGTREE_TIMEOUT of the cut-link trials (s)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.hosts:
        from recovery_hosts import run as across_hosts

        _report(across_hosts(args.trials, args.cut_timeout), args.json)
        return
    if args.overhead:
        from recovery_overhead import drive as overhead

        _report(overhead(int((args.ranks or "2").split(",")[0]), args.rounds), args.json)
        return
    if args.cycles:
        from recovery_cycles import drive

        _report(drive(args.cycles, int((args.ranks or "3").split(",")[0])), args.json)
        return
    out: dict = {}
    for n in (int(v) for v in (args.ranks or "2,4,8").split(",")):
        got: dict[str, list[float]] = {"detect": [], "agree": [], "shrink": [], "revoke": []}
        odd: list[str] = []
        for t in range(args.trials):
            size = 8 if t % 2 == 0 else 1 << 20
            res = run_ranks(kill_trial, n, size, t, timeout=180)[:-1]
            odd += [repr(r)[:200] for r in res if not isinstance(r, dict)]
            if all(isinstance(r, dict) for r in res):  # the last survivor's time counts
                for k in ("detect", "agree", "shrink"):
                    got[k].append(max(r[k] for r in res))
            res = run_ranks(revoke_trial, n, size, t, timeout=180)[1:]
            if all(isinstance(v, float) for v in res):
                got["revoke"].append(max(res))
            else:
                odd += [repr(v)[:200] for v in res if not isinstance(v, float)]
        rate = run_ranks(transfer_run, n, args.transfer_mib, args.trials // 5 + 1,
                         timeout=600)[0] if n > 1 else None
        out[n] = {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "trials": len(v)}
                  for k, v in got.items() if v}
        for name, launcher in (("train_shrink", ["--enable-recovery"]),
                               ("train_replace", ["--max-restarts", "1"])):
            if args.train_trials and n > 1:
                v = train_trials(n, args.train_trials, launcher)
                if v:
                    out[n][name] = {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "trials": len(v)}
        out[n]["transfer_GBps"] = rate
        out[n]["anomalies"] = odd
        print(f"N={n}: " + ", ".join(f"{k} p50 {d['p50'] * 1e3:.1f} ms p99 {d['p99'] * 1e3:.1f} "
                                     f"ms" for k, d in out[n].items() if isinstance(d, dict))
              + (f", transfer {rate:.2f} GB/s" if rate else "")
              + (f", {len(odd)} anomalies: {odd[:2]}" if odd else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
