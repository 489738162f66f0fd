"""Algorithm selection: ``RINGTREE_ALGO`` (NCCL_ALGO syntax) plus a small cost model.

Syntax (NCCL ``tuning.cc::parseList``): ``"ring,tree;allreduce:^tree;broadcast:ring"`` —
semicolon-separated entries; only the first may omit its ``collective:`` prefix and then
applies to every collective that has one of the listed algorithms; a list starting with ``^`` disables the listed algorithms
instead of enabling only them. Unknown collectives or algorithms are errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringtree.ir.collectives import parse_list
from ringtree.ir.program import Collective
from ringtree.schedules import Options, algorithms, options_for, record
from ringtree.schedules.stats import host_stats, schedule_stats
from ringtree.transports import registry as transport_registry
from ringtree.transports.base import LinkModel

# The default algorithm of each collective, used when the cost model has no opinion.
DEFAULTS: dict[Collective, str] = {c: c.spec.default_algo for c in Collective}
def tuned(coll: Collective) -> set[str]:
    """The algorithms the tuner chooses among for ``coll`` unless told otherwise: those
    whose record is ``tuned`` (LL's one-round reduce, broadcast and barrier run on Simple
    only when named: their costs over messages were never measured)."""
    return {a for a in algorithms(coll) if record(coll, a).tuned}


def parse_algo_spec(spec: str) -> dict[Collective, set[str]]:
    """Enabled algorithms per collective after applying ``spec`` (all enabled initially)."""
    enabled = {c: tuned(c) for c in Collective}
    for colls, negate, listed, prefixed in parse_list(spec, "RINGTREE_ALGO"):
        names = set(listed)
        known = set(algorithms())
        unknown = names - known
        if unknown:
            raise ValueError(f"RINGTREE_ALGO: unknown algorithm(s) {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        for c in colls:
            avail = set(algorithms(c))
            if negate:
                enabled[c] = tuned(c) - names
            elif prefixed or avail & names:
                # A prefix-less list only constrains collectives it names an algorithm of,
                # so "ring" does not disable gather's only algorithm.
                enabled[c] = avail & names
    return enabled


# Crowded machines (more ranks than cores), fitted to benchmarks/multihost.py on 2x2, 4x1
# and 2x4 namespace hosts sharing 2 cores: the software cost of one TCP message, and the
# CPU seconds one message (its send and its receive) takes from the machine's cores. On
# 2x4 (8 ranks, 2 cores) a small recursive-doubling all-reduce, 24 messages at once, took
# 0.90-1.2 ms (75-100 us per message), and four concurrent cross-host ping-pongs 430-490
# us a round trip; 50 us had put it at 0.60 ms, below the hierarchical one's 0.67-0.85.
CROWDED_TCP_OVERHEAD = 60e-6
CROWDED_CPU = 75e-6
# ... and the CPU seconds per call of each rank that talks across hosts at all. On 2x2 at
# 1 Gbit/s (benchmarks/multihost_cpu.py --loop, 4 rounds of 200 calls) recursive doubling
# and hierarchical both send 8 messages, 4 of them over TCP, but in recursive doubling
# all 4 ranks cross hosts and in hierarchical only the 2 leaders: the ranks' CPU per call
# was 1.02 against 0.88 ms at 256 B (all-reduce) and 1.07 against 0.94 ms at 8 KiB
# (all-gather; medians of 4 rounds) under the kernel's BBR, 0.76-0.93 against 0.63-0.81 ms
# with ringtree's sockets on CUBIC: 60-70 us per rank that crosses, either way.
CROWDED_REMOTE_RANK = 60e-6
# What a call costs on a crowded machine outside its steps (entering and leaving the API,
# planning, submitting and completing it), on its path once per call: one-message calls
# back to back on the 2x2 testbed (benchmarks/multihost_hops.py, 5 rounds of 300 at
# 1 Gbit/s) took 258-317 us over shared memory and 287-326 us over TCP, 103-197 us (median
# 143) beyond the path the model gives their one step; 51-108 us in a run where the
# machine was a third faster throughout (the CPU terms above were fitted in the slower
# state). Without it the path of a small call was below the CPU floor for every
# algorithm, so the floor alone chose.
CROWDED_CALL = 140e-6
# ... and a shared-memory hop whose receiver waited through a host crossing it took no part
# in (HostStats.wakes): the receiver has left its spin and sleeps on its doorbell while
# the machine's cores idle, and must be woken. Timed directly (multihost_hops.py, 2x2 at
# 1 Gbit/s, medians of 300 hops per round): a leader's 8 B to its host's other rank after
# the leaders' TCP round trip took 154-196 us, after the leaders spun 200 us instead
# (the receiver asleep as long, the cores busy) 107-159 us: 49 us between the medians of
# the 5 rounds; 56 and 61 us in two runs of 3 (the second in the faster state), 39 us
# against leaders that spun 300 us in another (single rounds ranged over 4-84 us).
CROWDED_WAKE = 50e-6


# The link models by key (``tcp``, ``shm``, ``shm_crowded``): each transport's record
# carries its coefficients (:mod:`ringtree.transports.registry`), so a new transport
# brings its own.
MODELS = transport_registry.MODELS
NETWORK = transport_registry.network().model  # the default model: links between hosts


@dataclass(frozen=True)
class HostModel:
    """Two link classes: ``intra`` (shared memory inside a host) and ``inter`` (TCP over
    a host's link, with α and β from :mod:`ringtree.tuning.links`).

    ``cpu``: when a machine runs more ranks than it has cores, the CPU seconds its cores
    spend on all of them for each message any rank sends (``CROWDED_CPU`` × ranks on the
    busiest machine ÷ (its cores × all ranks)); 0 otherwise.

    ``burst``: seconds of the link a token-bucket shaper lets through at once after an
    idle spell (σ/ρ of :class:`~ringtree.tuning.links.Topology`'s burst σ and rate ρ);
    0 for a link that serialises at its rate.

    ``cpu_remote``: like ``cpu``, for each rank that sends or receives across hosts in a
    call (``CROWDED_REMOTE_RANK``).

    ``call``: seconds of a call's own software on its path (``CROWDED_CALL``), and
    ``wake``: seconds of each shared-memory hop that must wake a receiver which slept
    through a host crossing (``CROWDED_WAKE``); both 0 on machines with a core per rank,
    where they were not measured."""

    intra: LinkModel
    inter: LinkModel
    cpu: float = 0.0
    burst: float = 0.0
    cpu_remote: float = 0.0
    call: float = 0.0
    wake: float = 0.0


def host_model(topo, intra: LinkModel) -> HostModel:
    """The :class:`HostModel` of a learned :class:`~ringtree.tuning.links.Topology`.

    The link between hosts is the network transport's (TCP). On a crowded machine a TCP
    message costs ``CROWDED_TCP_OVERHEAD`` of software instead of its model's overhead;
    the measured α, which is half a ping-pong less that overhead, gives the difference
    back so a hop is not charged twice."""
    tcp = transport_registry.network().model
    crowd = getattr(topo, "crowding", 0.0)
    if crowd > 1:
        o = CROWDED_TCP_OVERHEAD
        alpha = max(5e-6, topo.alpha + tcp.overhead - o)
        where = topo.machines or topo.nodes
        share = crowd / len(where)  # wall seconds per CPU second of one rank's work
        call, wake = CROWDED_CALL, CROWDED_WAKE
    else:
        o, alpha, share, call, wake = tcp.overhead, topo.alpha, 0.0, 0.0, 0.0
    return HostModel(intra, LinkModel(alpha=alpha, overhead=o, beta=1 / topo.bandwidth,
                                      gamma=tcp.gamma), CROWDED_CPU * share,
                     getattr(topo, "burst", 0.0) / topo.bandwidth,
                     CROWDED_REMOTE_RANK * share, call, wake)


def estimate(coll: Collective, algo: str, nbytes: int, n: int,
             model: LinkModel | HostModel = NETWORK, opts: Options | None = None
             ) -> float:
    """Predicted seconds for ``algo`` on a call of ``nbytes`` (the planner's and
    nccl-tests' size: the larger of the input and output buffers, so an all-gather's
    gathered output and a reduce-scatter's input): α·depth + o·messages + β·sent +
    γ·reduced, with depth, messages and volumes read off the schedule itself
    (:mod:`ringtree.schedules.stats`), which counts volumes in blocks of ``count``
    elements (:func:`block_bytes`). Infinite for what the executor cannot run. ``opts``
    are the options the algorithm runs with, as given (:func:`ranking` and
    :func:`choose` refine the call's options per candidate, as the planner builds it).

    With a :class:`HostModel` and ranks on several hosts, each link class is charged for
    its own traffic: α_i·depth + (α_e − α_i)·(host crossings on the critical path) +
    o_i·(messages inside a host) + o_e·(messages out of it) + β_i·(bytes a rank sends
    inside its host) + β_e·(1 + 0.3·(f − 1))·(bytes the busiest host sends or receives
    over its link; f the most remote ranks sending into one host at once — on the testbed,
    direct reduce-scatter's three concurrent flows into each 1 Gbit/s link ran 2.6× slower
    than the ring's one with the same bytes) + γ·reduced. On a crowded machine the result
    is at least the CPU its cores need for every rank's messages and every rank that
    crosses hosts, ``HostModel.cpu``·(messages of all ranks) + ``HostModel.cpu_remote``
    ·(ranks with remote peers): the ranks take turns on the cores, so the algorithm with
    fewer messages in all, and fewer ranks on the network, wins small sizes even with a
    longer path.

    On a token-bucket link (σ, ρ) the link term and the rest of the path overlap by up to
    σ/ρ (:func:`overlap_burst`)."""
    if n == 1:
        return 0.0
    nbytes = block_bytes(coll, nbytes, n)
    if isinstance(model, HostModel):
        if opts is not None and opts.nodes is not None and len(set(opts.nodes)) > 1:
            return _estimate_hosts(coll, algo, nbytes, n, model, opts)
        model = model.intra
    try:
        st = schedule_stats(coll, algo, n, opts)
    except ValueError:
        return math.inf
    m = model
    return (m.alpha * st.depth + m.overhead * st.messages + m.beta * st.send * nbytes
            + m.gamma * st.reduce * nbytes)


def block_bytes(coll: Collective, nbytes: int, n: int) -> float:
    """Bytes of one ``count``-element block of a call of ``nbytes``: the call's size over
    its largest buffer's blocks (``Collective.blocks``), as the planner sizes a call. A
    volume the schedule statistics give in blocks times this is bytes: an 8 KiB
    reduce-scatter on 4 ranks has 2 KiB blocks, and halving-doubling's 4 blocks per host
    link are 8 KiB, not 32."""
    return nbytes / max(1, *coll.blocks(n))


HOST_TIE = 0.02  # across hosts, estimates this close to the best tie with the default
INCAST = 0.3  # extra cost of inter-host bytes per additional concurrent flow into a host


def _estimate_hosts(coll: Collective, algo: str, nbytes: int, n: int, hm: HostModel,
                    opts: Options) -> float:
    try:
        st = host_stats(coll, algo, n, opts)
    except ValueError:
        return math.inf
    i, e = hm.intra, hm.inter
    local = (i.beta * st.send_intra + i.gamma * st.reduce) * nbytes
    link = incast(e.beta * max(st.host_out, st.host_in) * nbytes, st.fan_in, hm.burst)
    fill = record(coll, algo).overlap(n, opts)  # pipelined phases (Algorithm.fill)
    hops = (hm.call + i.alpha * st.depth + max(0.0, e.alpha - i.alpha) * st.inter_depth
            + i.overhead * st.msgs_intra + e.overhead * st.msgs_inter + hm.wake * st.wakes)
    # what of the path leaves the link idle: the hops and the intra-host phases (all of
    # them, or, pipelined in pieces, the part that does not overlap the link)
    idle = hops + (local if fill >= 1 else fill * min(local, link) + max(0.0, local - link))
    cpu = hm.cpu * st.msgs_total + hm.cpu_remote * st.remote_ranks
    return max(overlap_burst(idle, link, hm.burst), cpu)


def incast(link: float, flows: int, burst: float) -> float:
    """Seconds of a host's link for ``link`` s of bytes arriving in ``flows`` concurrent
    flows: ``INCAST`` more per extra flow for the part beyond ``burst``. Flows into one
    link share the shaper's queue and lose packets to each other once it overflows
    (direct reduce-scatter's three flows into each 1 Gbit/s testbed link ran 2.6× slower
    than the ring's one with the same bytes); what the token bucket passes at once never
    queues. On the testbed at 200 Mbit/s an 8 KiB halving-doubling reduce-scatter on
    2×2, two flows of 4 KiB into each host, took 0.353 ms, its 8 KiB at the link's rate
    alone (0.33 ms)."""
    return link + INCAST * (flows - 1) * max(0.0, link - burst)


def overlap_burst(idle: float, link: float, burst: float) -> float:
    """Seconds per call, in a run of calls, of a path that keeps a host's link busy for
    ``link`` s and idle for ``idle`` s, on a token bucket that passes ``burst`` s of the
    link at once: ``idle + link − min(idle, link, burst)``.

    A (σ, ρ) shaper carries at most σ + ρ·t bytes in any t (Cruz 1991). While the path
    waits on latency and software the bucket refills, up to σ, and the next bytes go out
    at once: a call that needs the link for ``link`` ≤ σ/ρ costs max(idle, link) (the
    steps' latencies hide under the link's time, or the reverse), a longer one
    link + max(0, idle − σ/ρ). With ``burst`` 0 (a link that serialises every byte at
    its rate) this is the additive α-β cost, idle + link (Hockney 1994)."""
    return idle + link - min(idle, link, burst)


def ranking(coll: Collective, nbytes: int, n: int, enabled: set[str] | None,
            model: LinkModel | HostModel = NETWORK, opts: Options | None = None
            ) -> list[tuple[str, float]]:
    """Every enabled algorithm that can run here with its predicted seconds, best first."""
    cands = tuned(coll) if enabled is None else set(enabled)
    est = _estimates(coll, cands, nbytes, n, model, opts)
    return sorted([(a, est[a]) for a in sorted(cands) if not math.isinf(est[a])],
                  key=lambda x: x[1])


def _estimates(coll: Collective, cands: set[str], nbytes: int, n: int,
               model: LinkModel | HostModel, opts: Options | None) -> dict[str, float]:
    """:func:`estimate` of every candidate with the options it would run a call of
    ``nbytes`` with (:func:`ringtree.schedules.options_for`, the planner's), so each is
    priced as the Program it would run."""
    return {a: estimate(coll, a, nbytes, n, model,
                        None if opts is None else options_for(coll, a, nbytes, opts))
            for a in cands}


def choose(coll: Collective, nbytes: int, n: int, enabled: set[str] | None,
           model: LinkModel | HostModel = NETWORK, opts: Options | None = None) -> str:
    """The enabled algorithm with the lowest estimate (ties: the collective's default).

    Across hosts, estimates within ``HOST_TIE`` of the best count as a tie: the model
    cannot tell them apart (on 4 hosts of one rank, halving-doubling and the ring move the
    same bytes over every link and were predicted 0.1% apart), and the default ring, which
    keeps each rank on the same two sockets, measured as fast or faster
    (``benchmarks/multihost.py``)."""
    cands = tuned(coll) if enabled is None else set(enabled)
    if not cands:
        raise ValueError(f"RINGTREE_ALGO leaves no algorithm enabled for {coll.value}")
    default = DEFAULTS.get(coll)
    est = _estimates(coll, cands, nbytes, n, model, opts)
    ranked = sorted(cands, key=lambda a: (est[a], a != default, a))
    if math.isinf(est[ranked[0]]):
        raise ValueError(f"no enabled algorithm for {coll.value} can run here "
                         f"(enabled: {sorted(cands)})")
    spans = isinstance(model, HostModel) and opts is not None and opts.nodes is not None \
        and len(set(opts.nodes)) > 1
    if spans and default in est and est[default] <= est[ranked[0]] * (1 + HOST_TIE):
        return default
    return ranked[0]
