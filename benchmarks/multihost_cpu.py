"""Where a multi-host collective's time goes: its time, the CPU its ranks used, and what
the links carried, on the namespace testbed.

For one layout (H hosts × P ranks), link rate, collective and size it runs each listed
algorithm (``default`` = ringtree's choice) ``--iters`` times after one untimed call,
and prints the median time (the slowest rank's), the CPU seconds of all ranks together
per call (``getrusage``: user + system, every thread) and their context switches
(voluntary: a rank waiting; involuntary: preempted by another), the machine's user / system /
softirq / idle seconds over the run (``/proc/stat``; on a shared machine the other
processes are in there too) and, per host, the bytes and packets its ``tc tbf`` sent,
its drops, the bytes and drops of the bridge port's tbf towards it, and its TCP
retransmissions. A rank that uses far less CPU than the call takes
is waiting on the network or on another rank, not computing.

    python benchmarks/multihost_cpu.py --layout 2x4 --rate 1gbit --coll all_reduce \\
        --size 16M --algos default,hierarchical,tree

With ``--loop`` the calls run back to back (one barrier, then ``--iters`` calls, the time
per call the slowest rank's), as ``benchmarks/multihost.py`` times them; ``--rounds R``
alternates the algorithms R times, so small calls tens of microseconds apart are compared
in one machine state.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time

import numpy as np


def _job(comm, coll: str, count: int, algo, iters: int, loop: bool = False):
    x = np.zeros(count, np.float32)
    out = np.zeros(count // comm.size, np.float32) if coll == "reduce_scatter" else \
        np.zeros((comm.size, count), np.float32) if coll == "all_gather" else None

    def f():
        if coll == "all_reduce":
            comm.all_reduce(x, algo=algo)
        elif coll == "all_gather":
            comm.all_gather(x, out=out, algo=algo)
        else:
            comm.reduce_scatter(x, out=out, algo=algo)

    f()
    comm.barrier()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    if loop:  # back to back, as benchmarks/multihost.py times a repetition
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        t = (time.perf_counter() - t0) / iters
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        return [t] * iters, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), \
            r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw
    times = []
    for _ in range(iters):
        comm.barrier()
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return times, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), \
        r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw


def _stat() -> list[int]:
    with open("/proc/stat") as fh:
        return [int(v) for v in fh.readline().split()[1:]]


def _tbf(q: list[str]) -> tuple[str, str, str]:
    """(bytes, packets, drops) of ``tc -s qdisc show`` output, split in words."""
    sent = q[q.index("Sent") + 1] if "Sent" in q else "?"
    pkts = q[q.index("Sent") + 3] if "Sent" in q else "?"
    drop = q[q.index("(dropped") + 1].rstrip(",") if "(dropped" in q else "?"
    return sent, pkts, drop


def _host_counters(host, tb) -> str:
    q = host.run(["tc", "-s", "qdisc", "show", "dev", "eth0"], capture_output=True,
                 text=True).stdout.split()
    sent, pkts, drop = _tbf(q)
    # the other direction: the bridge's port towards the host, shaped the same way
    into = subprocess.run(["nsenter", "-t", str(tb._bridge.pid), "-n", "--", "tc", "-s",
                           "qdisc", "show", "dev", host.port], capture_output=True,
                          text=True).stdout.split()
    in_sent, _, in_drop = _tbf(into)
    snmp = host.run(["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout
    tcp = [ln.split()[1:] for ln in snmp.splitlines() if ln.startswith("Tcp:")]
    kv = dict(zip(tcp[0], tcp[1])) if len(tcp) == 2 else {}
    return (f"tbf sent {sent} B in {pkts} packets, dropped {drop}; into it {in_sent} B, "
            f"dropped {in_drop}; "
            f"TCP retransmitted {kv.get('RetransSegs', '?')} of {kv.get('OutSegs', '?')}")


def run(args) -> int:
    from ringtree.testbed import Testbed, available
    from ringtree.testbed.pool import HostPool

    ok, why = available()
    if not ok:
        print(f"multihost_cpu: {why}", file=sys.stderr)
        return 1
    hosts, ppn = (int(v) for v in args.layout.split("x"))
    nbytes = _size(args.size)
    n = hosts * ppn
    count = max(1, nbytes // 4 // (n if args.coll == "all_gather" else 1))
    if args.coll == "reduce_scatter":
        count = max(n, count // n * n)
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/loadavg") as fh:
        print(f"load: {fh.read().strip()}", flush=True)
    with Testbed(hosts, rate=args.rate) as tb:
        env = {"RINGTREE_TOKEN": secrets.token_hex(8),
               **dict(kv.split("=", 1) for kv in args.env)}
        with HostPool(tb, ppn, env=env, timeout=1800) as pool:
            for name in args.algos.split(",") * args.rounds:
                algo = None if name == "default" else name
                s0, w0 = _stat(), time.monotonic()
                res = pool.run_ok(_job, args.coll, count, algo, args.iters, args.loop)
                s1, wall = _stat(), time.monotonic() - w0
                d = [(b - a) / hz for a, b in zip(s0, s1)]
                per = [max(r[0][i] for r in res) for i in range(args.iters)]
                cpu = sum(r[1] for r in res) / args.iters
                med = statistics.median(per)
                vol, invol = (sum(r[k] for r in res) / args.iters for k in (2, 3))
                print(f"{args.layout}@{args.rate} {args.coll} {args.size} {name}: median "
                      f"{med * 1e3:.3f} ms; ranks' CPU {cpu * 1e3:.3f} ms per call "
                      f"({cpu / med / (os.cpu_count() or 1):.0%} of the machine's cores), "
                      f"context switches {vol:.1f} waiting + {invol:.1f} preempted; "
                      f"machine over {wall:.2f} s: user {d[0]:.2f} system {d[2]:.2f} "
                      f"softirq {d[6]:.2f} idle {d[3]:.2f}", flush=True)
        for h in tb.hosts:
            print(f"  host {h.index}: {_host_counters(h, tb)}")
    return 0


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layout", default="2x4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--coll", default="all_reduce",
                    choices=["all_reduce", "all_gather", "reduce_scatter"])
    ap.add_argument("--size", default="16M")
    ap.add_argument("--algos", default="default")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--loop", action="store_true",
                    help="time the --iters calls back to back (no barrier between them)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the --algos list this many times, alternating")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    sys.exit(run(ap.parse_args()))
