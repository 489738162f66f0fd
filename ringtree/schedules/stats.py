"""What a schedule costs, read off its Programs: the tuner's input.

For one (collective, algorithm, nranks) this walks the Programs like the checker does —
messages matched in order per (sender, receiver, channel), a step finishing one unit of
time after its inputs arrive — and reports, in units of the collective's ``count``:

- ``depth``: the critical path in dependent steps (how many α a run pays),
- ``send``: the most data any rank sends (the β term: a rank's link or copy engine),
- ``reduce``: the most data any rank reduces (the γ term).

So a new algorithm gets a cost model for free: α·depth + β·send·n + γ·reduce·n, the
Hockney/α-β-γ form of Thakur, Rabenseifner & Gropp (2005), with its coefficients taken
from the schedule instead of written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ringtree.core.ir import Collective, walk
from ringtree.schedules.registry import Options, generate_all


@dataclass(frozen=True)
class ScheduleStats:
    depth: int
    send: float     # × count elements, the most any rank sends
    reduce: float   # × count elements, the most any rank reduces
    messages: int   # per rank, at most


@lru_cache(maxsize=1024)
def schedule_stats(collective: Collective, algo: str, nranks: int,
                   opts: Options | None = None) -> ScheduleStats:
    programs = generate_all(collective, algo, nranks, opts)
    if any(p.meta.get("virtual_programs") for p in programs):
        raise ValueError(f"{algo} needs in-network aggregation switches (simulator only)")
    n = nranks
    deps = [_deps_by_position(p) for p in programs]
    finish: list[dict[tuple[int, int], int]] = [{} for _ in programs]
    sent = [0.0] * n
    reduced = [0.0] * n
    msgs = [0] * n
    depth = 0

    def run(r: int, c: int, i: int, s, arrivals: list) -> int:
        nonlocal depth
        # like the executor: a step waits for the steps whose memory it touches and for
        # its messages, not for its predecessor in the channel
        t = max([finish[r][d] for d in deps[r][(c, i)]] + arrivals, default=0) + 1
        finish[r][(c, i)] = t
        depth = max(depth, t)
        size = s.ref.count / programs[r].chunks  # chunks of a block: equal ±1 element
        if s.reduce:
            reduced[r] += size * max(1, len(s.recv_from))
        sent[r] += size * len(s.send_to)
        msgs[r] += len(s.send_to)
        return t

    walk(programs, run)
    return ScheduleStats(depth, max(sent), max(reduced), max(msgs))


def _deps_by_position(p) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """:meth:`Program.memory_deps` (out of place), keyed by (channel, index)."""
    pos = [(c, i) for c, ch in enumerate(p.channels) for i in range(len(ch))]
    return {pos[g]: [pos[d] for d in ds] for g, ds in enumerate(p.memory_deps(False))}
