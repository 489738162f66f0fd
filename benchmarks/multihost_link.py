"""What keeps a shaped link from its bound: ringtree configurations side by side, and gloo,
with what each host's link carried and when it stood idle.

One testbed (``--layout`` H×P, ``--rate``), one collective (``--coll``) and size. Each ``--config
NAME=VAR=VALUE,VAR=VALUE`` is a job of its own (socket options are set at connect), and
the jobs take turns for ``--rounds`` rounds of ``--iters`` calls, so machine noise hits
them alike; gloo (``torch.distributed``, ``GLOO_SOCKET_IFNAME=eth0``) runs last. Per call:
its time (first rank in to last rank out); per configuration: the ranks' CPU per call
(user, system), each host's tbf drops and TCP retransmissions. With ``--timeline`` a
sampler in every host reads ``eth0``'s sent bytes every 0.5 ms and each call also prints,
per host, the ms its link ran below 30% of the rate ("idle"), and how long after the
call's start its first byte left and before its end the last one did (``--gaps``: every
idle stretch of 4 ms or more; the samplers take CPU themselves).

    python benchmarks/multihost_link.py --rate 200mbit --size 16M \\
        --config autotuned=RINGTREE_SOCKET_BUFFER=0 --config default= --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import sys
import tempfile
import time

import numpy as np

_GLOO = r'''
import json, resource, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
count, iters, out, coll = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
n = dist.get_world_size()
x = torch.zeros(count)
y = torch.zeros(count * n if coll == "all_gather" else count // n)
op = {"all_reduce": lambda: dist.all_reduce(x),
      "all_gather": lambda: dist.all_gather_into_tensor(y, x),
      "reduce_scatter": lambda: dist.reduce_scatter_tensor(y, x)}[coll]
op()
r0 = resource.getrusage(resource.RUSAGE_SELF)
spans = []
for _ in range(iters):
    dist.barrier()
    t0 = time.monotonic()
    op()
    spans.append((t0, time.monotonic()))
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = ((r1.ru_utime - r0.ru_utime) / iters, (r1.ru_stime - r0.ru_stime) / iters)
with open(out + str(dist.get_rank()), "w") as f:
    json.dump({"spans": spans, "cpu": cpu}, f)
dist.destroy_process_group()
'''


def _sampler(path: str, stop: str) -> None:
    """In a host: (time, eth0 bytes sent) every 0.5 ms until ``stop`` exists."""
    ts, tx = [], []
    while not os.path.exists(stop):
        with open("/proc/net/dev") as f:
            for ln in f:
                if "eth0:" in ln:
                    ts.append(time.monotonic())
                    tx.append(int(ln.split(":", 1)[1].split()[8]))
                    break
        time.sleep(0.0005)
    with open(path, "w") as f:
        json.dump({"t": ts, "tx": tx}, f)


def _job(comm, coll: str, count: int, iters: int):
    x = np.zeros(count, np.float32)
    y = np.zeros(count * comm.size if coll == "all_gather" else count // comm.size, np.float32)
    op = {"all_reduce": lambda: comm.all_reduce(x),
          "all_gather": lambda: comm.all_gather(x, out=y.reshape(comm.size, count)),
          "reduce_scatter": lambda: comm.reduce_scatter(x, out=y)}[coll]
    op()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    spans = []
    for _ in range(iters):
        comm.barrier()
        t0 = time.monotonic()
        op()
        spans.append((t0, time.monotonic()))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return spans, ((r1.ru_utime - r0.ru_utime) / iters, (r1.ru_stime - r0.ru_stime) / iters)


def _counters(tb) -> list[tuple[int, int]]:
    """Per host: (tbf drops on eth0, TCP segments retransmitted), since it was made."""
    out = []
    for h in tb.hosts:
        q = h.run(["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout.split()
        drop = int(q[q.index("(dropped") + 1].rstrip(",")) if "(dropped" in q else 0
        rows = [ln.split()[1:] for ln in h.run(["cat", "/proc/net/snmp"]).stdout.splitlines()
                if ln.startswith("Tcp:")]
        out.append((drop, int(dict(zip(rows[0], rows[1]))["RetransSegs"])))
    return out


def _gaps(t, dt, db, rate_bps: float, least: float = 0.004) -> str:
    """The link's idle stretches of at least ``least`` s: "start+length" in ms."""
    out, start = [], None
    for j in range(len(dt)):
        slow = db[j] * 8 < 0.3 * rate_bps * dt[j]
        if slow and start is None:
            start = t[j]
        elif not slow and start is not None:
            if t[j] - start >= least:
                out.append(f"{start * 1e3:.0f}+{(t[j] - start) * 1e3:.0f}")
            start = None
    if start is not None and t[-1] - start >= least:
        out.append(f"{start * 1e3:.0f}+{(t[-1] - start) * 1e3:.0f}")
    return " ".join(out) or "none"


def _link(spans: list, samples: list[dict], rate_bps: float, gaps: bool = False
          ) -> list[str]:
    """Per call, per host: idle ms, first-byte and last-byte gaps (with ``gaps``, each
    idle stretch of 4 ms or more: its start after the call's and its length)."""
    lines = []
    for i in range(len(spans[0])):
        t0, t1 = min(s[i][0] for s in spans), max(s[i][1] for s in spans)
        cells = []
        for smp in samples:
            t, tx = np.array(smp["t"]), np.array(smp["tx"])
            m = (t >= t0) & (t <= t1)
            tt, bb = t[m], tx[m]
            if len(tt) < 3:
                cells.append("-")
                continue
            dt, db = np.diff(tt), np.diff(bb)
            idle = dt[db * 8 < 0.3 * rate_bps * dt].sum()
            moving = np.nonzero(db)[0]
            head = tt[moving[0]] - t0 if len(moving) else 0.0
            tail = t1 - tt[moving[-1] + 1] if len(moving) else 0.0
            cells.append(f"{(bb[-1] - bb[0]) / 1e6:.1f} MB, idle {idle * 1e3:.0f}, "
                         f"head {head * 1e3:.1f}, tail {tail * 1e3:.1f}"
                         + (f", gaps {_gaps(tt - t0, dt, db, rate_bps)}" if gaps else ""))
        lines.append(f"    {(t1 - t0) * 1e3:,.1f} ms: " + " | ".join(cells))
    return lines


def _calls(spans: list) -> list[float]:
    return [max(s[i][1] for s in spans) - min(s[i][0] for s in spans)
            for i in range(len(spans[0]))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layout", default="4x1")
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--size", default="16M", help="nccl-tests size: all_gather's output, "
                    "reduce_scatter's input")
    ap.add_argument("--coll", default="all_reduce",
                    choices=["all_reduce", "all_gather", "reduce_scatter"])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", action="append", default=[], metavar="NAME=VAR=VALUE,...")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--gaps", action="store_true", help="with --timeline: list the idle "
                    "stretches of 4 ms or more")
    args = ap.parse_args()
    from ringtree.testbed import Testbed, available, parse_rate
    from ringtree.testbed.pool import HostPool

    ok, why = available()
    if not ok:
        print(f"multihost_link: {why}", file=sys.stderr)
        return 1
    hosts, ppn = (int(v) for v in args.layout.split("x"))
    s = args.size.upper()
    nbytes = int(s[:-1]) << {"K": 10, "M": 20, "G": 30}[s[-1]] if s[-1] in "KMG" else int(s)
    n = hosts * ppn
    elems = nbytes // 4
    count = elems // n if args.coll == "all_gather" else \
        elems // n * n if args.coll == "reduce_scatter" else elems
    rate = parse_rate(args.rate)
    configs = {}
    for c in args.config or ["default="]:
        name, _, env = c.partition("=")
        configs[name] = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    tmp = tempfile.mkdtemp(prefix="rt-link-")
    with open("/proc/loadavg") as fh:
        print(f"load before: {fh.read().strip()}", flush=True)
    with Testbed(hosts, rate=args.rate) as tb:
        def measured(label: str, fn):
            c0 = _counters(tb)
            if args.timeline:
                stop = os.path.join(tmp, f"stop-{label}")
                ps = [h.spawn(_sampler, os.path.join(tmp, f"s-{label}-{h.index}"), stop)
                      for h in tb.hosts]
                time.sleep(0.2)
            spans, cpu = fn()
            if args.timeline:
                open(stop, "w").close()
                for p in ps:
                    p.join()
            c1 = _counters(tb)
            calls = _calls(spans)
            print(f"  {label}: " + ", ".join(f"{t * 1e3:,.0f}" for t in calls) + " ms; CPU "
                  "per call and rank (user/sys ms) " + " ".join(
                      f"{u * 1e3:.0f}/{k * 1e3:.0f}" for u, k in cpu) + "; drops/retransmits "
                  "per host " + " ".join(f"{b[0] - a[0]}/{b[1] - a[1]}"
                                         for a, b in zip(c0, c1)), flush=True)
            if args.timeline:
                smp = []
                for h in tb.hosts:
                    with open(os.path.join(tmp, f"s-{label}-{h.index}")) as fh:
                        smp.append(json.load(fh))
                print("\n".join(_link(spans, smp, rate, args.gaps)), flush=True)
            return calls

        pools = {k: HostPool(tb, ppn, env={"RINGTREE_TOKEN": secrets.token_hex(8), **v},
                             timeout=1800) for k, v in configs.items()}
        times: dict[str, list[float]] = {k: [] for k in pools}
        try:
            for rnd in range(args.rounds):
                for k, pool in pools.items():
                    def run(pool=pool):
                        res = pool.run_ok(_job, args.coll, count, args.iters)
                        return [r[0] for r in res], [r[1] for r in res]
                    times[k] += measured(f"{k} round {rnd}", run)
        finally:
            for pool in pools.values():
                pool.close()
        if not args.no_gloo:
            script, port = os.path.join(tmp, "gloo.py"), tb.port()
            with open(script, "w") as fh:
                fh.write(_GLOO)

            def gloo():
                procs = []
                for i, h in enumerate(tb.hosts):
                    for j in range(ppn):
                        env = dict(os.environ, GLOO_SOCKET_IFNAME=h.ifname,
                                   OMP_NUM_THREADS="1", MASTER_ADDR=tb.hosts[0].addr,
                                   MASTER_PORT=str(port), RANK=str(i * ppn + j),
                                   WORLD_SIZE=str(hosts * ppn))
                        procs.append(h.popen([sys.executable, script, str(count),
                                              str(args.iters * args.rounds),
                                              os.path.join(tmp, "g"), args.coll], env=env))
                for p in procs:
                    p.wait()
                res = []
                for r in range(hosts * ppn):
                    with open(os.path.join(tmp, f"g{r}")) as fh:
                        res.append(json.load(fh))
                return [r["spans"] for r in res], [r["cpu"] for r in res]

            times["gloo"] = measured("gloo", gloo)
    with open("/proc/loadavg") as fh:
        print(f"load after: {fh.read().strip()}")
    share = 2 if args.coll == "all_reduce" else 1
    bound = share * (hosts - 1) / hosts * nbytes / (rate / 8)
    for k, v in times.items():
        med = statistics.median(v)
        print(f"{k}: median {med * 1e3:,.1f} ms of {len(v)} ({bound / med:.1%} of the link "
              f"bound), min {min(v) * 1e3:,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
