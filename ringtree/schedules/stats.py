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

from ringtree.ir.program import Collective
from ringtree.ir.walk import walk
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


@dataclass(frozen=True)
class HostStats:
    """What a schedule costs per link class when ranks live on several hosts
    (``opts.nodes``), in units of ``count`` for volumes:

    - ``depth``: dependent steps on the critical path; ``inter_depth``: the most
      host-crossing hops on any dependency path (so α_intra·depth + (α_inter − α_intra)
      ·inter_depth bounds the latency term);
    - ``msgs_intra`` / ``msgs_inter``: the most messages any rank sends inside / out of its
      host (each costs that transport's per-message overhead);
    - ``send_intra``: the most any rank sends to ranks on its own host;
    - ``host_out`` / ``host_in``: the most any *host* sends out / takes in over its link —
      the ranks of a host share one NIC, which is what flat algorithms forget;
    - ``reduce``: the most any rank reduces;
    - ``fan_in``: the most remote ranks sending into one host in the same step (incast:
      concurrent TCP flows into one link share its queue and lose packets to each other);
    - ``msgs_total``: the messages all ranks send together (what the cores of a machine
      that runs more ranks than it has cores must work through one after another);
    - ``remote_ranks``: the ranks that send or receive across hosts (each drives its
      sockets through the call, which costs CPU of its own);
    - ``wakes``: the most shared-memory hops on any dependency path whose receiver waited
      through a host crossing it took no part in (the message's path crossed more hosts
      than the receiver's own steps so far): hierarchical's hop out of the leader after
      the leaders' exchange, where the receiver has long left its spin and sleeps. A flat
      exchange's ranks meet each other on every hop and have none.
    """

    depth: int
    inter_depth: int
    msgs_intra: int
    msgs_inter: int
    send_intra: float
    host_out: float
    host_in: float
    reduce: float
    fan_in: int = 1
    msgs_total: int = 0
    remote_ranks: int = 0
    wakes: int = 0


@lru_cache(maxsize=1024)
def host_stats(collective: Collective, algo: str, nranks: int, opts: Options) -> HostStats:
    programs = generate_all(collective, algo, nranks, opts)
    node = list(opts.nodes) if opts.nodes is not None else [0] * nranks
    hosts = max(node) + 1
    # CollNet: the switches are virtual ranks, each its own "host" (a switch port per
    # host link); only the real hosts' links and messages are charged
    virtual = list(programs[0].meta.get("virtual_programs", ())) if programs else []
    programs = programs + virtual
    node += [hosts + i for i in range(len(virtual))]
    deps = [_deps_by_position(p) for p in programs]
    # per step: (time, host crossings, wake-ups) of its latest dependency path
    finish: list[dict[tuple[int, int], tuple[int, int, int]]] = [{} for _ in programs]
    total = len(programs)
    intra = [0.0] * total
    reduced = [0.0] * total
    m_in = [0] * total
    m_out = [0] * total
    h_out = [0.0] * (hosts + len(virtual))
    h_in = [0.0] * (hosts + len(virtual))
    worst = [0, 0, 0]
    flows: dict[tuple[int, int], set[int]] = {}  # (host, step time) -> remote senders
    remote: set[int] = set()  # ranks with a message across hosts
    seen = [0] * total  # the most crossings of any step a rank has run so far

    def run(r: int, c: int, i: int, s, arrivals: list) -> tuple[int, int, int]:
        own = [finish[r][d] for d in deps[r][(c, i)]]
        # the crossings this rank's own steps so far have been part of
        mine = max([b[1] for b in own] + [seen[r]])
        before = own + [(t, e + (node[q] != node[r]),
                         w + (node[q] == node[r] and e > mine))
                        for q, (t, e, w) in zip(s.recv_from, arrivals)]
        t = max((b[0] for b in before), default=0) + 1
        e = max((b[1] for b in before), default=0)
        w = max((b[2] for b in before), default=0)
        finish[r][(c, i)] = (t, e, w)
        seen[r] = max(seen[r], e)
        worst[0], worst[1], worst[2] = max(worst[0], t), max(worst[1], e), max(worst[2], w)
        size = s.ref.count / programs[r].chunks
        if s.reduce:
            reduced[r] += size * max(1, len(s.recv_from))
        for q in s.send_to:
            if node[q] == node[r]:
                intra[r] += size
                m_in[r] += 1
            else:
                h_out[node[r]] += size
                h_in[node[q]] += size
                m_out[r] += 1
                remote.update((r, q))
                flows.setdefault((node[q], t), set()).add(r)
        return t, e, w

    walk(programs, run)
    n = nranks
    fan_in = max((len(f) for (h, _), f in flows.items() if h < hosts), default=1)
    return HostStats(worst[0], worst[1], max(m_in[:n]), max(m_out[:n]), max(intra[:n]),
                     max(h_out[:hosts]), max(h_in[:hosts]), max(reduced[:n]), fan_in,
                     sum(m_in[:n]) + sum(m_out[:n]), sum(1 for r in remote if r < n),
                     worst[2])
