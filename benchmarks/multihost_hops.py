"""What a call and a hop cost on a crowded machine (the namespace testbed: every host's
ranks share the machine's cores), beyond what the schedule's steps account for.

Calls (``calls``): a call of one message, back to back, on each host's pair of ranks
(a 2-rank all-gather over shared memory, both hosts at once) and on the pairs across
hosts (rank 0 with 2, rank 1 with 3, over TCP). Its time per call less the path the
tuner's model gives its schedule (α·depth + o·messages of the transport) is what a call
costs outside its steps: entering and leaving the API, planning and submitting it,
completing it (``tuner.CROWDED_CALL``).

Hops (``--modes``): a hierarchical collective's non-leader ranks wait while their leader
crosses hosts; by the time the leader's shared-memory message comes they have left their
spin phase and sleep on their doorbell (:mod:`ringtree.transports.shm`), so that hop
must wake them. A flat exchange's ranks meet their partner on every hop. This times the
hop directly on 2 testbed hosts of 2 ranks (host-major: ranks 0, 1 on host 0; 2, 3 on
host 1), mirrored on both hosts as a hierarchical collective runs it:

- ``tcp``: the leaders (ranks 0 and 2) ping-pong 8 bytes over TCP, then each sends
  8 bytes over shared memory to its host's other rank, which has waited since the round
  began; that rank answers at once.
- ``delay:D``: the same with the leaders spinning D µs instead of crossing hosts (the
  receivers asleep as long from D ≈ 50 µs on, the machine's cores busy meanwhile);
  ``sleep:D``: with the leaders asleep D µs (the cores idle).

Each hop's latency is the receiver's ``perf_counter`` after its ``recv`` returned less
the sender's before its ``send`` (the ranks share the machine's ``CLOCK_MONOTONIC``), so
it includes both ends' call overhead. Printed per mode and round: the median *waited*
hop (leader → the rank that waited) and *answer* hop (back to the leader, which posts
its receive only after its send returned, so the answer mostly waits for that), and
their difference. What a hop after a crossing costs beyond one whose receiver slept as
long while the cores were busy is the ``tcp`` waited hop less the ``delay:200`` one
(``tuner.CROWDED_WAKE``).

    python benchmarks/multihost_hops.py --rate 1gbit --iters 300 --rounds 3 \\
        --modes calls,tcp,delay:20,delay:200,sleep:200
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time

import numpy as np


def _round(comm, mode: str, iters: int) -> list[tuple[float, float]]:
    """(waited hop, answer hop) seconds per iteration on the non-leaders; [] elsewhere."""
    x = np.zeros(2, np.float32)
    leader = comm.rank % 2 == 0
    mate = comm.rank + 1 if leader else comm.rank - 1
    other = (comm.rank + 2) % 4
    delay = float(mode.split(":")[1]) * 1e-6 if ":" in mode else 0.0
    stamps = np.zeros(2, np.float64)
    hops = []
    comm.barrier()
    for _ in range(iters):
        if leader:
            if mode == "tcp":
                if comm.rank == 0:
                    comm.send(x, other)
                    comm.recv(x, other)
                else:
                    comm.recv(x, other)
                    comm.send(x, other)
            elif mode.startswith("sleep"):
                time.sleep(delay)
            else:
                end = time.perf_counter() + delay
                while time.perf_counter() < end:
                    pass
            stamps[0] = time.perf_counter()
            comm.send(stamps, mate)
            comm.recv(stamps, mate)
            hops.append(time.perf_counter() - stamps[1])
        else:
            comm.recv(stamps, mate)
            waited = time.perf_counter() - stamps[0]
            stamps[1] = time.perf_counter()
            comm.send(stamps, mate)
            hops.append(waited)
    return hops


def _calls(comm, iters: int) -> tuple[float, float]:
    """Seconds per call of a one-message all-gather (recursive doubling on 2 ranks) on
    this rank's host pair (shared memory) and across hosts (TCP), back to back."""
    x = np.zeros(2, np.float32)
    out = np.zeros((2, 2), np.float32)
    pair = comm.split(comm.nodes[comm.rank])
    across = comm.split(comm.rank % 2)
    res = []
    for c in (pair, across):
        for _ in range(5):
            c.all_gather(x, out=out, algo="recursive_doubling")
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            c.all_gather(x, out=out, algo="recursive_doubling")
        res.append((time.perf_counter() - t0) / iters)
        c.close()
    return res[0], res[1]


def _model_paths(alpha: float) -> tuple[float, float]:
    """The tuner's path (no per-call term) for the two one-message calls: shared memory
    on a crowded host, and TCP with the measured α."""
    from ringtree.ir.program import Collective
    from ringtree.schedules import Options
    from ringtree.schedules.stats import host_stats, schedule_stats
    from ringtree.tuning.tuner import MODELS, host_model

    ag, rd = Collective.ALL_GATHER, "recursive_doubling"
    i = MODELS["shm_crowded"]
    st = schedule_stats(ag, rd, 2, None)
    shm = i.alpha * st.depth + i.overhead * st.messages
    from ringtree.tuning.links import Topology
    hm = host_model(Topology((0, 1, 1, 0), alpha=alpha, bandwidth=125e6, source="",
                             cpus=2, machines=(0, 0, 0, 0)), i)
    hs = host_stats(ag, rd, 2, Options(nodes=(0, 1)))
    tcp = (i.alpha * hs.depth + max(0.0, hm.inter.alpha - i.alpha) * hs.inter_depth
           + hm.inter.overhead * hs.msgs_inter)
    return shm, tcp


def _topo_alpha(comm) -> float:
    comm.all_reduce(np.zeros(1, np.float32))  # the communicator learns its topology
    t = getattr(comm, "topology", None)
    return t.alpha if t is not None else 0.0


def run(args) -> int:
    from ringtree.testbed import Testbed, available
    from ringtree.testbed.pool import HostPool

    ok, why = available()
    if not ok:
        print(f"multihost_hops: {why}", file=sys.stderr)
        return 1
    with open("/proc/loadavg") as fh:
        print(f"load: {fh.read().strip()}", flush=True)
    modes = [m for m in args.modes.split(",") if m != "calls"]
    calls = "calls" in args.modes.split(",")
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    per_call: list[tuple[float, float]] = []
    alpha = 0.0
    with Testbed(2, rate=args.rate, cpus=args.cpus) as tb:
        with HostPool(tb, 2, env={"RINGTREE_TOKEN": secrets.token_hex(8)},
                      timeout=1800) as pool:
            alpha = pool.run_ok(_topo_alpha)[0]
            for _ in range(args.rounds):
                if calls:
                    res = pool.run_ok(_calls, args.iters)
                    per_call.append((max(r[0] for r in res), max(r[1] for r in res)))
                for m in modes:
                    res = pool.run_ok(_round, m, args.iters)
                    waited = res[1] + res[3]  # the non-leaders' waited hops
                    answer = res[0] + res[2]  # the leaders' answer hops
                    got[m].append((statistics.median(waited), statistics.median(answer)))
    with open("/proc/loadavg") as fh:
        print(f"load after: {fh.read().strip()}", flush=True)
    if calls:
        shm, tcp = _model_paths(alpha)
        print(f"2x2 @ {args.rate}, one-message calls, {args.iters} per round, slowest rank; "
              f"the model's path: shm {shm * 1e6:.0f} us, tcp {tcp * 1e6:.0f} us "
              f"(alpha {alpha * 1e6:.0f} us measured)")
        for name, k, model in (("shm pair", 0, shm), ("tcp pairs", 1, tcp)):
            cells = ", ".join(f"{c[k] * 1e6:.0f} ({(c[k] - model) * 1e6:+.0f})"
                              for c in per_call)
            print(f"  {name:>10}: per call (beyond the path) us: {cells}")
    print(f"2x2 @ {args.rate}, {args.iters} iterations per round, {args.rounds} rounds; "
          "medians per round (us): waited hop / answer hop / difference")
    for m in modes:
        cells = ", ".join(f"{w * 1e6:.0f} / {a * 1e6:.0f} / {(w - a) * 1e6:+.0f}"
                          for w, a in got[m])
        print(f"  {m:>10}: {cells}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus", choices=("own", "shared"), default="own",
                    help="the testbed hosts' CPUs (ringtree.testbed.Testbed)")
    ap.add_argument("--modes", default="calls,tcp,delay:20,delay:200,sleep:200")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
