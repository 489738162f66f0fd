"""In-network aggregation on the namespace testbed: all_reduce (and, with ``--colls``,
broadcast, all_gather and reduce_scatter) through a software switch against ring and
hierarchical, with the bytes each host put on its link and the simulator's prediction
for the same topology.

Topology: H hosts × P ranks, every host link shaped to ``--rate`` each way (``tc tbf``),
and one more host that runs ``ringtree switch`` on an unshaped link (a switch port per
host). ringtree reaches it with ``RINGTREE_COLLNET_ENABLE=1`` and
``RINGTREE_COLLNET_SWITCH``; ``algo=collnet_direct`` runs the CollNet schedule with the
switch as its virtual rank.

Measured per size and algorithm: the median over ``--reps`` of the slowest rank's time per
call, and, from the kernel's counters (``/sys/class/net/eth0/statistics/tx_bytes`` of
each host, read by its first rank), the bytes each host sent per call, next to the
theory — ≈ M up and M down through a switch, against 2(n−1)/n·M for a ring of n hosts
(BytePS, docs/rationale.md; SHARP's "bandwidth halving"). The prediction comes from
``ringtree.sim`` on a one-leaf fat-tree with the same link rate and latency, the leaf
reducing, charged the software switch's hop measured here (see :func:`predict`).

    python benchmarks/collnet.py                         # 4x1 and 4x2, 8 B .. 64 MiB
    python benchmarks/collnet.py --layouts 4x1 --sizes 16M --reps 5 --drop 0.01
    python benchmarks/collnet.py --layouts 4x1 --colls broadcast,all_gather,reduce_scatter

Needs root, ``ip`` and ``tc`` (the testbed).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time

import numpy as np

SIZES = "8,64K,1M,16M,64M"
ALGOS = ("collnet_direct", "ring", "hierarchical")
SWITCH_PORT = 7300


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().removesuffix("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def show(n: int) -> str:
    for unit, m in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return f"{n}"


# ---- inside the ranks -----------------------------------------------------------------

def _tx() -> int:
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def _slowest(comm, t: float) -> float:
    v = np.array([t], np.float64)
    comm.all_reduce(v, op="max", algo="ring")
    return float(v[0])


def _call(comm, coll: str, nbytes: int):
    """(run(algo), check()) for one collective of ``nbytes`` (nccl-tests sizes: the
    all-gather's gathered bytes, the reduce-scatter's input bytes)."""
    n, r = comm.size, comm.rank
    count = max(1, nbytes // 4)
    block = max(1, count // n)
    if coll == "all_reduce":
        x, y = np.full(count, r + 1, np.float32), np.empty(count, np.float32)
        return (lambda algo: comm.all_reduce(x, out=y, algo=algo),
                lambda: bool(np.all(y == np.float32(n * (n + 1) // 2))))
    if coll == "broadcast":
        x = np.full(count, r + 1, np.float32)
        return (lambda algo: comm.broadcast(x, root=0, algo=algo),
                lambda: bool(np.all(x == 1)))
    if coll == "all_gather":
        x, y = np.full(block, r + 1, np.float32), np.empty((n, block), np.float32)
        return (lambda algo: comm.all_gather(x, out=y, algo=algo),
                lambda: bool(np.all(y == np.arange(1, n + 1, dtype=np.float32)[:, None])))
    x, y = np.full(block * n, r + 1, np.float32), np.empty(block, np.float32)
    return (lambda algo: comm.reduce_scatter(x, out=y, algo=algo),
            lambda: bool(np.all(y == np.float32(n * (n + 1) // 2))))


def measure(comm, colls: list[str], sizes: list[int], algos: list[str], reps: int,
            local_rank: int) -> dict:
    """Times (s per call) and host tx bytes per call, for every (coll, size, algo)."""
    from ringtree.schedules import algorithms

    out: dict = {}
    for coll in colls:
        for nbytes in sizes:
            run, ok = _call(comm, coll, nbytes)
            for algo in algos:
                if algo not in algorithms(coll):
                    continue
                run(algo)                                 # warm: connections, groups
                if not ok():
                    raise AssertionError(f"{coll} {algo} {nbytes} B: wrong result")
                iters = 1 if nbytes >= 1 << 24 else (4 if nbytes >= 1 << 20 else 20)
                times, txs = [], []
                for _ in range(reps):
                    comm.barrier()
                    tx0 = _tx() if local_rank == 0 else 0
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        run(algo)
                    dt = (time.perf_counter() - t0) / iters
                    tx = (_tx() - tx0) / iters if local_rank == 0 else 0.0
                    times.append(_slowest(comm, dt))
                    txs.append(tx)
                out[f"{coll}/{algo}/{nbytes}"] = {
                    "time": statistics.median(times),
                    "tx": statistics.median(txs) if local_rank == 0 else None}
    return out


# ---- the driver -----------------------------------------------------------------------

def theory_bytes(coll: str, algo: str, nbytes: int, hosts: int, ppn: int) -> float:
    """Bytes a host sends per call, averaged over hosts (M = ``nbytes``)."""
    switch = algo.startswith("collnet")
    if coll == "all_reduce":
        return float(nbytes) if switch else 2 * (hosts - 1) / hosts * nbytes
    if coll == "broadcast":  # the root's host sends M once; a chain's hosts but the last
        return nbytes / hosts if switch else (hosts - 1) / hosts * nbytes
    if coll == "all_gather":  # every rank sends its block to the switch
        return nbytes / hosts if switch else (hosts - 1) / hosts * nbytes
    return float(ppn * nbytes) if switch else (hosts - 1) / hosts * nbytes


def predict(coll: str, algo: str, nbytes: int, hosts: int, ppn: int, rate_bps: float,
            link_us: float, switch_us: float) -> float | None:
    """The simulator's time (s) for the same topology, or None if it has no model.

    Hosts sit on a one-leaf fat-tree: one NIC per host at the link rate, a reducing leaf.
    What the testbed really costs, modeled:

    - latency: ringtree measures ``link_us`` host to host (one way), which the simulator's
      host → leaf → host path crosses as two links of ``link_us / 2``; through the
      switch a pass is two such host-to-host crossings (to the switch's host and back),
      so the leaf stands for the switch and each of its links costs ``link_us``;
    - the software switch's time per pass (``switch_us``, from the 8 B CollNet time less
      the two link latencies), half of it on each of the two links a pass crosses (the
      fat-tree charges ``switch_ns`` only between leaves and spines, and one leaf has
      none);
    - store-and-forward units: the simulator moves a slice over one link after another,
      so the slice is the unit a hop must hold whole before forwarding. The software
      switch holds a whole chunk (every member's, before it reduces), so CollNet is
      simulated with the switch's chunk as the slice; the kernel bridge forwards TCP in
      64 KiB segments, so host-to-host schedules are simulated with 64 KiB slices (with
      the executor's 1 MiB slices every message would pay each link in full, twice the
      measured time at 1 MiB).

    Not modeled: ``tc tbf`` lets a burst of 1 ms of traffic (125 KB at 1 Gbit/s) through
    at once, so calls of 64 KiB run faster than any 1 Gbit/s model predicts."""
    from ringtree.sim import simulate
    from ringtree.sim.machine import cluster as T
    from ringtree.switch.client import DEFAULT_CHUNK

    gbs = rate_bps / 8 / 1e9
    switch = algo.startswith("collnet")
    topo = T.fat_tree(hosts, gpus_per_node=ppn, nics_per_node=1, nvlink_gbps=4.0,
                      nvlink_ns=10e3, pcie_gbps=100.0, pcie_ns=0.0, nic_gbps=gbs,
                      nic_ns=(link_us + switch_us / 2 if switch else link_us / 2) * 1e3,
                      switch_ns=0.0,
                      leaf_ports=max(8, hosts), levels=2, sharp=True, channels=1,
                      name="testbed")
    try:
        return simulate(coll, algo, topo, nbytes,
                        slice_bytes=DEFAULT_CHUNK if switch else 64 << 10).time_ns / 1e9
    except (ValueError, KeyError, NotImplementedError):
        return None


def run_layout(hosts: int, ppn: int, args, sizes: list[int]) -> dict:
    from ringtree.testbed import Testbed
    from ringtree.testbed.pool import HostPool

    token = secrets.token_hex(16)
    with Testbed(hosts, rate=args.rate) as tb:
        sw_host = tb.add_host(rate=None, name=f"{tb.name}-sw")
        sw_addr = f"{sw_host.addr}:{SWITCH_PORT}"
        cmd = [sys.executable, "-m", "ringtree.cli", "switch", "--listen", sw_addr,
               "--token", token, "--drop", str(args.drop), "--seed", "1", *args.switch_args]
        if args.profile_switch:
            cmd[1:3] = ["-m", "pyinstrument", "-r", "text", "-o",
                        f"{args.profile_switch}.{hosts}x{ppn}.txt", "-m", "ringtree.cli"]
        log = open(f"{args.json or os.devnull}.switch.log" if args.json else os.devnull, "w")
        sw_host.popen(cmd, stdout=log)
        time.sleep(1.0)
        env = {"RINGTREE_COLLNET_ENABLE": "1", "RINGTREE_COLLNET_SWITCH": sw_addr,
               "RINGTREE_TIMEOUT": "120"}
        layout = [ppn] * hosts + [0]
        with HostPool(tb, layout, env=env, timeout=3600, token=token) as pool:
            res = pool.run(_job, args.colls.split(","), sizes, args.algos.split(","),
                           args.reps)
    errors = [r for r in res if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    times = res[0]["times"]
    tx = {}
    for h in range(hosts):
        r = h * ppn
        for k, v in res[r]["times"].items():
            tx.setdefault(k, []).append(v["tx"])
    return {"times": {k: v["time"] for k, v in times.items()},
            "tx": {k: statistics.mean(v) for k, v in tx.items()}, "alpha": res[0]["alpha"]}


def _job(comm, colls, sizes, algos, reps):
    local = int(os.environ.get("RINGTREE_LOCAL_RANK", "0"))
    topo = getattr(comm, "topology", None)
    return {"times": measure(comm, colls, sizes, algos, reps, local),
            "alpha": topo.alpha if topo is not None else 50e-6}


def _table(r: dict, coll: str, sizes: list[int], hosts: int, ppn: int, rate: float,
           link_us: float, hop_us: float) -> None:
    algos = [a for a in ALGOS if any(k.startswith(f"{coll}/{a}/") for k in r["times"])]
    head = "| size | " + " | ".join(algos) + " | ring ÷ switch | " + \
        " | ".join(f"{a} MiB [th]" for a in algos) + " | sim switch | sim ring |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in sizes:
        t = {a: r["times"][f"{coll}/{a}/{n}"] for a in algos}
        cells = [f"{t[a] * 1e3:.2f}" for a in algos]
        ratio = t["ring"] / t["collnet_direct"] if "ring" in t and \
            "collnet_direct" in t else float("nan")
        txc = [f"{r['tx'][f'{coll}/{a}/{n}'] / 2**20:.2f} "
               f"[{theory_bytes(coll, a, n, hosts, ppn) / 2**20:.2f}]" for a in algos]
        sim = [predict(coll, a, n, hosts, ppn, rate, link_us, hop_us)
               for a in ("collnet_direct", "ring")]
        print(f"| {show(n)} | " + " | ".join(cells) + f" | {ratio:.2f} | " + " | ".join(txc)
              + " | " + " | ".join(f"{v * 1e3:.2f}" if v else "-" for v in sim) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default="4x1,4x2")
    p.add_argument("--sizes", default=SIZES)
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--colls", default="all_reduce",
                   help="all_reduce, broadcast, all_gather, reduce_scatter (comma-separated)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--json", default=None,
                   help="write the results here (and the switch's counters to JSON.switch.log)")
    p.add_argument("--profile-switch", default=None, metavar="PREFIX",
                   help="run the switch under pyinstrument, text report to PREFIX.HxP.txt")
    p.add_argument("--switch-args", default="",
                   help="extra arguments of `ringtree switch`, e.g. '--slot-bytes 512K'")
    args = p.parse_args(argv)
    args.switch_args = args.switch_args.split()
    from ringtree.testbed.netns import parse_rate

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rate = parse_rate(args.rate)
    print(f"# link {args.rate}; drop {args.drop}; load "
          f"{open('/proc/loadavg').read().split()[:3]}")
    doc = {"rate": args.rate, "drop": args.drop, "layouts": {}}
    for lay in args.layouts.split(","):
        hosts, ppn = (int(v) for v in lay.lower().split("x"))
        r = run_layout(hosts, ppn, args, sizes)
        doc["layouts"][lay] = r
        link_us = r["alpha"] * 1e6
        small = min(sizes)
        for coll in args.colls.split(","):
            t8 = r["times"].get(f"{coll}/collnet_direct/{small}", 0.0)
            hop_us = max(0.0, t8 * 1e6 - 2 * link_us)
            r[f"{coll}/switch_hop_us"] = hop_us
            print(f"\n## {coll}, {lay} ({hosts} hosts x {ppn} ranks): link latency "
                  f"{link_us:.0f} µs (measured by ringtree), switch hop {hop_us:.0f} µs (the "
                  f"{show(small)} CollNet time less two link latencies)\n\nms per call "
                  f"(median of {args.reps}); MiB sent per host per call [theory]; "
                  f"sim = simulator")
            _table(r, coll, sizes, hosts, ppn, rate, link_us, hop_us)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
