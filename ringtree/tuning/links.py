"""What a communicator knows about the machines under it: which ranks share a host, and
how fast the path between hosts is.

- Hosts come from the host identities published at rendezvous (``comm.nodes``).
- The inter-host path (one-way latency α and bandwidth B of a host's link) is read from
  ``RINGTREE_TOPO_FILE`` — a topology in the simulator's format
  (:func:`ringtree.sim.machine.cluster.load`; the route from a rank of node 0 to a rank of
  node 1: latencies summed, the narrowest link's bandwidth) — or else measured once per
  job by the first communicator that spans hosts: rank 0 ping-pongs a small message with
  the first rank of every other host (α = half the best of 20 round trips, less the
  per-message software cost the model charges separately; on a machine with more ranks
  than cores the best of 5 ranged over 60–170 µs between probes of one job), then, after
  the link has been idle for a while, times four 1 MiB messages back to back and keeps
  the slowest host. Rank 0 broadcasts the numbers, so every rank's tuner sees the same
  ones and picks the same algorithm.
- A shaped link (a token bucket: Linux ``tc tbf``, a cloud provider's policer) carries at
  most σ + ρ·t bytes in any t (the (σ, ρ) arrival curve of Cruz, "A calculus for network
  delay", IEEE Trans. Inf. Theory 37(1), 1991). The messages after the first find the
  bucket empty and give the sustained rate ρ = bytes / (time − round trip). The burst σ
  comes from single messages of 4 KiB to 256 KiB, each after an idle spell that fills the
  bucket: one of m ≤ σ bytes passes at once, a larger one waits (m − σ)/ρ
  (:func:`burst_of`). A bulk transfer cannot show it: TCP paces it at its bandwidth
  estimate, and on the testbed the first 1 MiB after idle was only 0–14 KiB' worth faster
  where the tbf bucket holds 32 KiB (200 Mbit/s) or 122 KiB (1 Gbit/s). σ is 0 on a link
  that simply serialises at its rate, and from ``RINGTREE_TOPO_FILE``.

The tuner then charges each algorithm for what it moves over each link class
(:func:`ringtree.schedules.stats.host_stats`, :func:`ringtree.tuning.tuner.estimate`):
intra-host bytes at shared-memory speed, the bytes that leave or enter a host at B — the
ranks of a host share its link — and the host-crossing hops at α.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

PROBE_BYTES = 1 << 20
PROBE_REPS = 4  # the first with a full token bucket, then the best of the rest
PINGS = 20  # round trips, best of: a busy CPU only ever makes one look slower
IDLE = 0.01  # s of idle link before the first transfer, so a token bucket fills up
BURST_SIZES = tuple(4096 << i for i in range(7))  # 4-256 KiB, each alone after idle
_JOB: Topology | None = None  # measured by this process's first multi-host communicator


@dataclass(frozen=True)
class Topology:
    """``nodes[r]``: host index of rank r; the inter-host link's ``alpha`` (s, one way),
    sustained ``bandwidth`` (bytes/s, each direction) and token-bucket ``burst`` (bytes it
    passes at once after an idle spell; 0 for a link that serialises at its rate);
    ``source`` says where they came from."""

    nodes: tuple[int, ...]
    alpha: float
    bandwidth: float
    source: str
    cpus: int = 0  # cores of rank 0's host (taken for every host)
    machines: tuple[int, ...] = ()  # physical machine of each rank (hosts may share one)
    burst: float = 0.0

    @property
    def crowded(self) -> bool:
        """Some machine runs more ranks than it has cores (then fewer, larger messages
        win). Namespace or container "hosts" that share one kernel (the same boot id)
        share its cores too, so ranks are counted per machine, not per host."""
        where = self.machines or self.nodes
        return max(where.count(m) for m in set(where)) > max(1, self.cpus)

    @property
    def crowding(self) -> float:
        """Ranks of the busiest machine per core (above 1: crowded)."""
        where = self.machines or self.nodes
        return max(where.count(m) for m in set(where)) / max(1, self.cpus)

    @property
    def hosts(self) -> int:
        return len(set(self.nodes))

    def describe(self) -> str:
        per: dict[int, list[int]] = {}
        for r, h in enumerate(self.nodes):
            per.setdefault(h, []).append(r)
        layout = "; ".join(f"host {h}: ranks {_span(rs)}" for h, rs in sorted(per.items()))
        shared = len(set(self.machines)) < self.hosts if self.machines else False
        return (f"{self.hosts} hosts ({layout}); inter-host link {self.bandwidth * 8 / 1e6:,.0f}"
                f" Mbit/s, latency {self.alpha * 1e6:.0f} us"
                + (f", burst {self.burst / 1024:,.0f} KiB" if self.burst else "")
                + f" ({self.source})"
                + ("; hosts share one machine's cores" if shared else "")
                + ("; more ranks than cores" if self.crowded else ""))


def _span(rs: list[int]) -> str:
    return f"{rs[0]}-{rs[-1]}" if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 1 \
        else ",".join(map(str, rs))


def from_file(path: str) -> tuple[float, float]:
    """(alpha s, bandwidth B/s) between node 0 and node 1 of a simulator topology file."""
    from ringtree.sim.machine.cluster import load

    t = load(path)
    nodes = t.nodes()
    a = next((d for r, d in enumerate(t.ranks) if nodes[r] == 0), None)
    b = next((d for r, d in enumerate(t.ranks) if nodes[r] not in (0, -1)), None)
    if a is None or b is None:
        raise ValueError(f"RINGTREE_TOPO_FILE={path!r}: the topology has no two nodes "
                         f"with ranks (nodes of its ranks: {sorted(set(nodes))})")
    links = [t.links[i] for i in t.route(a, b)]
    alpha = sum(lk.latency for lk in links) * 1e-9
    bw = min(lk.bandwidth for lk in links) * t.gb
    return alpha, bw


def _leaders(nodes: tuple[int, ...]) -> list[int]:
    seen: dict[int, int] = {}
    for r, h in enumerate(nodes):
        seen.setdefault(h, r)
    return [r for h, r in sorted(seen.items(), key=lambda kv: kv[1]) if h != nodes[0]]


def _round_trip(comm, data: np.ndarray, ack: np.ndarray, peer: int) -> float:
    """Seconds to send ``data`` to ``peer`` and receive its one-word answer."""
    t0 = time.perf_counter()
    comm.send(data, peer)
    comm.recv(ack, peer)
    return time.perf_counter() - t0


def measure(comm, overhead: float) -> tuple[float, float, float, float]:
    """Collective over ``comm``: (alpha, bandwidth, cores, burst) rank 0 measured, on
    every rank."""
    small = np.zeros(1, np.float64)
    big = np.zeros(PROBE_BYTES, np.uint8)
    res = np.zeros(4, np.float64)
    if comm.rank == 0:
        alphas, bws, bursts = [], [], []
        for peer in _leaders(comm.nodes):
            rtt = min(_round_trip(comm, small, small, peer) for _ in range(PINGS))
            time.sleep(IDLE)
            times = [_round_trip(comm, big, small, peer) for _ in range(PROBE_REPS)]
            bw, burst = rate_and_burst(big.nbytes, rtt, times)
            small_times = []
            for m in BURST_SIZES:
                time.sleep(max(IDLE, 2 * m / bw))  # the bucket fills up again
                small_times.append(_round_trip(comm, big[:m], small, peer))
            burst = max(burst, burst_of(BURST_SIZES, small_times, rtt, bw))
            alphas.append(max(5e-6, rtt / 2 - overhead))
            bws.append(bw)
            bursts.append(burst)
        res[:] = (max(alphas), min(bws), os.cpu_count() or 1, min(bursts))
    elif comm.rank in _leaders(comm.nodes):  # the echo of every probe above, in order
        for buf in [small] * PINGS + [big] * PROBE_REPS + [big[:m] for m in BURST_SIZES]:
            comm.recv(buf, 0)
            comm.send(small, 0)
    comm.broadcast(res, root=0, algo="ring")
    return float(res[0]), float(res[1]), float(res[2]), float(res[3])


def rate_and_burst(nbytes: int, rtt: float, times: list[float]) -> tuple[float, float]:
    """(ρ bytes/s, σ bytes) of a (σ, ρ) token bucket from back-to-back transfers of
    ``nbytes`` (each acknowledged): ``times[0]`` started with a full bucket and took
    rtt + (nbytes − σ)/ρ, the rest found it empty and took rtt + nbytes/ρ; the best of the
    rest is kept (a busy CPU only ever makes a transfer slower). σ is at least 0 and at
    most half of ``nbytes`` (beyond that the probe cannot tell a bucket from noise)."""
    if len(times) < 2:
        raise ValueError(f"rate_and_burst needs at least 2 transfers, got {len(times)}")
    drained = min(times[1:])
    rho = nbytes / max(drained - rtt, 1e-6)
    return rho, min(nbytes / 2, max(0.0, rho * (drained - times[0])))


def burst_of(sizes: tuple[int, ...], times: list[float], rtt: float, rho: float) -> float:
    """σ of a (σ, ρ) token bucket from single messages sent after idle spells: a message
    of m ≤ σ bytes passes at once (rtt and little more), a larger one takes
    rtt + (m − σ)/ρ, so each gives σ ≥ m − ρ·(time − rtt), and the largest such bound is
    kept (a busy CPU, or TCP pacing a message of several segments, only make a message
    slower and the bound lower). Messages far smaller than a bulk transfer show the bucket
    that a bulk transfer does not: TCP paces a bulk transfer at its bandwidth estimate
    (BBR), while a small message leaves in one burst, as a small collective's do."""
    if len(sizes) != len(times):
        raise ValueError(f"burst_of: {len(sizes)} sizes but {len(times)} times")
    return max([0.0] + [min(m, m - rho * (t - rtt)) for m, t in zip(sizes, times)])


def machines(host_ids: list[str]) -> tuple[int, ...]:
    """Index of each rank's physical machine: host identities are ``hostname|boot_id``,
    and hosts with one boot id run on one kernel."""
    order: dict[str, int] = {}
    return tuple(order.setdefault(h.rpartition("|")[2] or h, len(order)) for h in host_ids)


def learn(comm, overhead: float) -> Topology | None:
    """The communicator's topology, or None on one host (collective when it measures)."""
    global _JOB
    nodes = tuple(comm.nodes)
    if len(set(nodes)) < 2:
        return None
    where = machines([p.host_id for p in comm.peers])
    if _JOB is not None:
        return Topology(nodes, _JOB.alpha, _JOB.bandwidth, _JOB.source, _JOB.cpus, where,
                        _JOB.burst)
    from ringtree.settings import current

    path = (current().topo_file or "").strip()
    res = np.zeros(4, np.float64)
    if path:
        err = None
        if comm.rank == 0:  # rank 0's reading is everyone's, as with a measurement
            try:
                res[:] = (*from_file(path), os.cpu_count() or 1, 0.0)
            except (OSError, ValueError, KeyError) as e:
                err, res[:] = e, np.nan
        comm.broadcast(res, root=0, algo="ring")
        if np.isnan(res).any():
            raise ValueError(f"RINGTREE_TOPO_FILE={path!r}: " + (
                str(err) if err else "rank 0 could not read it (see rank 0's error)"))
        source = f"RINGTREE_TOPO_FILE={path}"
    else:
        res[:] = measure(comm, overhead)
        source = "measured by rank 0"
    topo = Topology(nodes, float(res[0]), float(res[1]), source, int(res[2]), where,
                    float(res[3]))
    _JOB = topo
    return topo


def tune_for(comm) -> Topology | None:
    """A communicator's tuning across hosts, set up at creation (collective): the paths
    between its hosts measured once (:func:`learn`) for the planner's cost model, and the
    online choice with ``RINGTREE_TUNE=online``; None on one host."""
    if len(set(comm.nodes)) < 2:
        return None
    from ringtree.tuning.tuner import NETWORK

    topo = comm.planner.topology = learn(comm, NETWORK.overhead)
    if comm.debug in ("INFO", "TRACE") and comm.rank == 0:
        print(f"ringtree: topology: {topo.describe()}", flush=True)
    if comm.settings.tune == "online":  # the same on every rank: one environment per job
        from ringtree.tuning.autotune import OnlineChoice

        comm.planner.online = OnlineChoice(comm)
    return topo
