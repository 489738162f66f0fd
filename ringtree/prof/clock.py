"""Aligning the ranks' clocks for one timeline.

Every rank timestamps events with ``time.perf_counter_ns()``. Ranks on one host read the
same CLOCK_MONOTONIC, so their offset is exactly 0. Across hosts the offset is estimated
the way NTP (and Cristian's algorithm) does it, through the communicator itself: rank 0
sends a ping to rank r at ``t0`` (its clock), r answers with its clock ``tr``, rank 0 gets
the answer at ``t3``; then ``offset_r = tr - (t0 + t3) / 2`` with an error of at most half
the round trip, and the round with the smallest round trip wins. Rank 0 then tells each
rank its offset. ``ts_on_rank0 = ts_on_rank_r - offset_r``.

The measured offsets are kept even on one host (``measured_ns``), which shows what the
estimator would have done; the offset *used* there is 0.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

CLOCK_TAG = 65000        # p2p tag reserved for the ping-pong
ROUNDS = 8


@dataclass(frozen=True)
class ClockSync:
    offset_ns: int       # subtract from this rank's timestamps to get rank 0's clock
    measured_ns: int     # what the ping-pong estimated
    rtt_ns: int          # round trip of the best round (error bound: rtt/2)
    method: str          # "same-host" | "ping-pong" | "single"

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(comm, rounds: int = ROUNDS) -> ClockSync:
    """Collective: every rank of ``comm`` must call it. Returns this rank's offset."""
    n, r = comm.size, comm.rank
    if n == 1:
        return ClockSync(0, 0, 0, "single")
    force = comm.settings.profile_clock == "pingpong"
    ping = np.zeros(1, dtype=np.int64)
    table = np.zeros((n, 2), dtype=np.int64)  # (offset, rtt) per rank, on rank 0
    if r == 0:
        for peer in range(1, n):
            best = None
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                comm.send(ping, peer, CLOCK_TAG)
                comm.recv(ping, peer, CLOCK_TAG)
                t3 = time.perf_counter_ns()
                rtt = t3 - t0
                if best is None or rtt < best[1]:
                    best = (int(ping[0]) - (t0 + t3) // 2, rtt)
            table[peer] = best
        for peer in range(1, n):
            comm.send(table[peer].copy(), peer, CLOCK_TAG)
        mine = (0, 0)
    else:
        for _ in range(rounds):
            comm.recv(ping, 0, CLOCK_TAG)
            ping[0] = time.perf_counter_ns()
            comm.send(ping, 0, CLOCK_TAG)
        got = np.zeros(2, dtype=np.int64)
        comm.recv(got, 0, CLOCK_TAG)
        mine = (int(got[0]), int(got[1]))
    if r == 0:
        return ClockSync(0, 0, 0, "reference")
    same_host = comm.peers[0].host_id == comm.peers[r].host_id
    if same_host and not force:
        return ClockSync(0, mine[0], mine[1], "same-host")
    return ClockSync(mine[0], mine[0], mine[1], "ping-pong")
