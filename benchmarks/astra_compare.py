"""ringtree's simulator beside ASTRA-sim's analytical network backend: the same
collectives on the same topologies, side by side — predicted time, and the wall time and
peak memory each simulator takes to compute it — from 8 to 16,384 GPUs.

ASTRA-sim is not part of ringtree and is not built by it: build its analytical backend
from its public repository (``astra-sim/astra-sim``, ``build/astra_analytical``) and give
this script the directory of its binaries (``AstraSim_Analytical_Congestion_Aware`` and,
for the two-level cases, ``AstraSim_Analytical_Congestion_Unaware``) with ``--astra DIR``
or ``ASTRA_SIM_BIN=DIR``. Without them the script says so and skips.

The cases, and how each side is configured:

- ``switch``: n GPUs on one switch, 50 GB/s and 500 ns per link (ringtree's ``switch``
  preset; ASTRA-sim's ``Switch`` basic topology, congestion-aware backend), exactly the
  same network: a transfer crosses two links, each a FIFO serving whole chunks
  (store-and-forward). ringtree's ``ring`` against ASTRA-sim's ``ring``, ringtree's
  ``tree`` against ASTRA-sim's ``doubleBinaryTree``.
- ``dgx_h100``: nodes of 8 GPUs on NVSwitch joined by NDR InfiniBand (ringtree's
  ``dgx_h100`` preset, a rail-optimized fat-tree). One node (8 GPUs) is ASTRA-sim's
  congestion-aware ``Switch``; its congestion-aware backend has only one-level
  topologies, so from 2 nodes on it runs its congestion-unaware backend on
  ``[Switch(8), Switch(nodes)]`` with the preset's per-GPU NVLink and NIC bandwidths and
  half the preset's GPU-to-GPU latency per hop (its ``Switch`` counts two hops).
  ringtree's ``ring`` against ``oneRing`` (one ring over every GPU), ``hierarchical``
  against ``["ring", "ring"]`` (ASTRA-sim's multi-dimensional collective), ``tree``
  against ``["ring", "doubleBinaryTree"]`` (NCCL's tree: a chain in the node, a double
  binary tree across nodes).

ringtree prices one protocol (``--proto none``, the topology's own costs: NCCL's Simple
protocol), as ASTRA-sim does. Both sides use their own defaults otherwise: ringtree its
presets' sender overhead
(ASTRA-sim's ``endpoint-delay`` is set to it) and 1 MiB slices; ASTRA-sim the settings
of its validated HGX-H100 example (4 dataset splits, 2 active chunks per dimension,
LIFO). ASTRA-sim's GB is 2^30 bytes, converted. Units: µs; wall time and peak RSS of
the whole process, each run alone in a fresh process (ringtree's is the ``ringtree sim``
command, import included). A run past ``--timeout`` is reported as such.

Usage: python benchmarks/astra_compare.py [--astra DIR] [--ranks 8,64,512,4096,16384]
       [--sizes 1M,64M] [--cases switch,dgx_h100] [--timeout S] [--max-gib G]
       [--json FILE]
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

from ringtree.perf.flags import parse_size

GIB_ASTRA = float(1 << 30)          # ASTRA-sim's GB
AWARE = "AstraSim_Analytical_Congestion_Aware"
UNAWARE = "AstraSim_Analytical_Congestion_Unaware"
TIME = "/usr/bin/time"
MAX_GIB = 12.0               # address space of one simulator run (``--max-gib``)
# ringtree algorithm -> ASTRA-sim's all-reduce implementation per dimension
PAIRS = {"switch": [("ring", ["ring"]), ("tree", ["doubleBinaryTree"])],
         "dgx_h100": [("ring", ["oneRing", "oneRing"]), ("hierarchical", ["ring", "ring"]),
                      ("tree", ["ring", "doubleBinaryTree"])]}


# -- Chakra execution traces, written without the protobuf package -----------------------

def _varint(x: int) -> bytes:
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        out.append(b | (0x80 if x else 0))
        if not x:
            return bytes(out)


def _field(no: int, wire: int, payload: bytes | int) -> bytes:
    key = _varint(no << 3 | wire)
    if wire == 0:
        return key + _varint(int(payload))
    assert isinstance(payload, bytes)
    return key + _varint(len(payload)) + payload


def _attr(name: str, field: int, value: int) -> bytes:
    """A Chakra ``AttributeProto``: name (1) and one varint value (a oneof: always
    written, zero included)."""
    return _field(1, 2, name.encode()) + _field(field, 0, value)


def chakra_collective(comm_type: int, nbytes: int, name: str) -> bytes:
    """One rank's trace: ``GlobalMetadata(version="0.0.4")`` then one ``COMM_COLL_NODE``
    (type 7) with ``is_cpu_op`` false, ``comm_type`` and ``comm_size``, each
    length-prefixed — what ASTRA-sim's ``generator_scripts/all_reduce.py`` writes."""
    meta = _field(1, 2, b"0.0.4")
    node = (_field(2, 2, name.encode()) + _field(3, 0, 7)
            + _field(10, 2, _attr("is_cpu_op", 27, 0))
            + _field(10, 2, _attr("comm_type", 9, comm_type))
            + _field(10, 2, _attr("comm_size", 9, nbytes)))
    return _varint(len(meta)) + meta + _varint(len(node)) + node


# -- the two sides ------------------------------------------------------------------------

def _measured(cmd: list[str], timeout: float, cwd: str | None = None
              ) -> tuple[str, float, float] | None:
    """stdout+stderr, wall seconds and peak RSS (MiB) of one process (None: timed out).
    The peak is GNU time's (``/usr/bin/time``): a child forked from this process would
    count this process's pages as its own (``ru_maxrss`` survives ``exec``)."""
    gnu = os.path.isfile(TIME)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(([TIME, "-f", "peak-kib %M"] if gnu else []) + cmd, stdout=out,
                             stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                             preexec_fn=_limit)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)     # GNU time and the simulator under it
            p.wait()
            return None
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read()
    if p.returncode:
        if "bad_alloc" in text or "MemoryError" in text:
            return text, wall, -1.0
        raise RuntimeError(f"{cmd[0]} exited with {p.returncode}: {text[-400:]}")
    peak = re.findall(r"^peak-kib (\d+)$", text, re.M)
    rss = int(peak[-1]) / 1024 if peak else \
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return text, wall, rss


def _limit() -> None:
    """The child's address space capped at ``MAX_GIB``: a simulator that would grow past
    it fails with an allocation error instead of pushing the machine into swap."""
    cap = int(MAX_GIB * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _unfinished(got: tuple | None, timeout: float) -> dict | None:
    """The row of a run that timed out or ran out of memory (None: it finished)."""
    if got is None:
        return {"us": None, "wall_s": None, "rss_MiB": None, "note": f"> {timeout:.0f} s"}
    _, wall, rss = got
    if rss < 0:
        return {"us": None, "wall_s": round(wall, 2), "rss_MiB": None,
                "note": f"out of memory (> {MAX_GIB:g} GiB)"}
    return None


def ringtree_run(case: str, n: int, algo: str, nbytes: int, timeout: float) -> dict:
    nodes = n if case == "switch" else n // 8
    cmd = [sys.executable, "-m", "ringtree.cli", "sim", "all_reduce", "-t", case, "-N",
           str(nodes), "--algo", algo, "-b", str(nbytes), "-e", str(nbytes), "-j", "1",
           "--proto", "none"]
    got = _measured(cmd, timeout)
    failed = _unfinished(got, timeout)
    if failed:
        return failed
    text, wall, rss = got
    rows = [ln.split() for ln in text.splitlines() if ln.strip()[:1].isdigit()]
    if not rows:
        return {"us": None, "wall_s": round(wall, 2), "rss_MiB": round(rss),
                "note": text.strip().splitlines()[-1][:80]}
    return {"us": float(rows[0][5]), "wall_s": round(wall, 2), "rss_MiB": round(rss)}


def _network(case: str, n: int) -> tuple[str, dict, float]:
    """ASTRA-sim's network (YAML text), the system settings that depend on the topology,
    and which binary runs it."""
    from ringtree.sim import presets
    from ringtree.sim.machine.model import path

    if case == "switch":
        t = presets.get("switch", n)
        bw = t.bytes_per_ns(t.route(0, 1)[0]) * 1e9 / GIB_ASTRA
        lat = t.links[t.route(0, 1)[0]].latency
        return (f"topology: [ Switch ]\nnpus_count: [ {n} ]\nbandwidth: [ {bw!r} ]\n"
                f"latency: [ {lat!r} ]\n", {}, t.overhead_ns)
    t = presets.get("dgx_h100", max(2, n // 8))
    g0, g1, g8 = t.ranks[0], t.ranks[1], t.ranks[8]
    intra, inter = path(t, t.route(g0, g1, 0)), path(t, t.route(g0, g8, 0))
    bws = [intra.bottleneck * 1e9 / GIB_ASTRA, inter.bottleneck * 1e9 / GIB_ASTRA]
    lats = [intra.latency / 2, inter.latency / 2]
    nodes = n // 8
    dims = "[ Switch, Switch ]" if nodes > 1 else "[ Switch ]"
    npus = f"[ 8, {nodes} ]" if nodes > 1 else "[ 8 ]"
    k = 2 if nodes > 1 else 1
    return (f"topology: {dims}\nnpus_count: {npus}\n"
            f"bandwidth: [ {', '.join(repr(b) for b in bws[:k])} ]\n"
            f"latency: [ {', '.join(repr(x) for x in lats[:k])} ]\n", {}, t.overhead_ns)


def astra_run(bindir: str, case: str, n: int, impl: list[str], nbytes: int,
              timeout: float) -> dict:
    yml, _, overhead = _network(case, n)
    if case == "dgx_h100" and n == 8:            # one node: one dimension
        impl = ["ring" if impl[-1] == "oneRing" else impl[-1]]
    binary = os.path.join(bindir, AWARE if case == "switch" or n == 8 else UNAWARE)
    with tempfile.TemporaryDirectory() as d:
        for r in range(n):
            with open(os.path.join(d, f"ar.{r}.et"), "wb") as f:
                f.write(chakra_collective(0, nbytes, f"all_reduce_{n}_{nbytes}"))
        system = {"scheduling-policy": "LIFO", "endpoint-delay": max(1, int(overhead)),
                  "active-chunks-per-dimension": 2, "preferred-dataset-splits": 4,
                  "all-reduce-implementation": impl, "all-gather-implementation": impl,
                  "reduce-scatter-implementation": impl, "all-to-all-implementation": impl,
                  "collective-optimization": "baseline", "local-mem-bw": 1100,
                  "boost-mode": 0}
        files = {"system.json": json.dumps(system), "network.yml": yml,
                 "memory.json": json.dumps({"memory-type": "NO_MEMORY_EXPANSION"})}
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        cmd = [binary, f"--workload-configuration={d}/ar",
               f"--system-configuration={d}/system.json",
               f"--remote-memory-configuration={d}/memory.json",
               f"--network-configuration={d}/network.yml"]
        got = _measured(cmd, timeout, cwd=d)
    failed = _unfinished(got, timeout)
    if failed:
        return failed
    text, wall, rss = got
    ends = [int(c) for c in re.findall(r"sys\[\d+\] finished, (\d+) cycles", text)]
    if len(ends) != n:
        return {"us": None, "wall_s": round(wall, 2), "rss_MiB": round(rss),
                "note": f"{len(ends)} of {n} ranks reported"}
    return {"us": max(ends) / 1e3, "wall_s": round(wall, 2), "rss_MiB": round(rss)}


def _bindir(args: list[str]) -> str | None:
    d = args[args.index("--astra") + 1] if "--astra" in args else os.environ.get(
        "ASTRA_SIM_BIN")
    return d if d and os.path.isfile(os.path.join(d, AWARE)) else None


def _unless(gave_up: dict, key: tuple, n: int, run, *args) -> dict:
    """``run(*args)``, unless the same side and case timed out on fewer GPUs (the simulators
    grow with the GPUs: it would time out again)."""
    if key in gave_up:
        return {"us": None, "wall_s": None, "rss_MiB": None,
                "note": f"not run (stopped at {gave_up[key]:,d} GPUs)"}
    got = run(*args)
    if got["us"] is None and str(got.get("note", "")).startswith((">", "out of")):
        gave_up[key] = n
    return got


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def main() -> int:
    args = sys.argv[1:]

    def opt(name: str, default: str) -> str:
        return args[args.index(name) + 1] if name in args else default

    bindir = _bindir(args)
    if bindir is None:
        print(f"skipped: ASTRA-sim is not built here (no {AWARE} in --astra DIR or "
              "ASTRA_SIM_BIN); build its analytical backend from astra-sim/astra-sim "
              "(build/astra_analytical) and pass the directory of its binaries")
        return 0
    ranks = [int(x) for x in opt("--ranks", "8,64,512,4096,16384").split(",")]
    sizes = [parse_size(x, "--sizes") for x in opt("--sizes", "1M,64M").split(",")]
    cases = opt("--cases", "switch,dgx_h100").split(",")
    timeout = float(opt("--timeout", "600"))
    global MAX_GIB
    MAX_GIB = float(opt("--max-gib", str(MAX_GIB)))
    with open("/proc/loadavg") as f:
        print(f"# load average: {f.read().strip()}")
    print("| topology | GPUs | size | ringtree / ASTRA-sim algorithm | ringtree µs | "
          "ASTRA-sim µs | ringtree wall s, MiB | ASTRA-sim wall s, MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    gave_up: dict[tuple, int] = {}       # (side, case, algo, size) -> GPUs it timed out at
    for case in cases:
        for n in ranks:
            if case == "dgx_h100" and n % 8:
                continue
            for nbytes in sizes:
                for algo, impl in PAIRS[case]:
                    if not os.path.isfile(os.path.join(bindir, UNAWARE)) and \
                            case != "switch":
                        continue
                    a = _unless(gave_up, ("ringtree", case, algo, nbytes), n, ringtree_run,
                                case, n, algo, nbytes, timeout)
                    b = _unless(gave_up, ("astra", case, algo, nbytes), n, astra_run,
                                bindir, case, n, impl, nbytes, timeout)
                    rows.append({"case": case, "gpus": n, "bytes": nbytes, "algo": algo,
                                 "astra": impl, "ringtree": a, "astra_sim": b})
                    print(f"| {case} | {n:,d} | {nbytes:,d} | {algo} / {'+'.join(impl)} | "
                          f"{_fmt(a['us'], ',.1f')} | {_fmt(b['us'], ',.1f')} | "
                          f"{_fmt(a['wall_s'], '.1f')}, {_fmt(a['rss_MiB'], ',')} "
                          f"{a.get('note', '')}| {_fmt(b['wall_s'], '.1f')}, "
                          f"{_fmt(b['rss_MiB'], ',')} {b.get('note', '')}|", flush=True)
    if "--json" in args:
        with open(opt("--json", ""), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
