"""A lower bound of a congestion-aware run's time from one rank's sends, so that a sweep
priced for several of NCCL's protocols skips a protocol that cannot be the fastest.

In the congestion-aware model every link is a FIFO that serves a slice of ``b`` bytes in
``b / rate`` ns (:mod:`.engines.reference`: ``free = max(t, free) + b / rate``), from time
0 on. Every byte rank r sends to a rank on another device leaves r's device d on one of
d's outgoing links (a route starts at d), so some outgoing link i of d serves at least
its share: with ``B`` the bytes r sends off its device and ``R`` the sum of the rates of
d's outgoing links, ``max_i load_i / R_i ≥ B / R``, and the last slice through that link
is delivered, and its receiving step done, no earlier. A run's time is at least that.

The engines add the slices' service times one at a time in floating point, each
addition rounded, so the computed sum may fall short of the real one by a relative
``k · 2⁻⁵³`` for k slices; :data:`MARGIN` (10⁻⁶) covers a billion slices. The bound is
therefore only used with a margin (:func:`exceeds`), and only in the congestion-aware
model with real-valued time (the integer clock truncates, the unaware model has no FIFO
links).
"""

from __future__ import annotations

from ringtree.ir.program import Buf, Program, chunk_regions
from ringtree.sim.machine.cluster import Topology

MARGIN = 1e-6


def sent_bytes(p: Program, topo: Topology, count: int, itemsize: int) -> int:
    """Bytes rank ``p.rank`` sends to ranks on other devices than its own (a virtual rank
    is on a switch: another device), as :func:`ringtree.runtime.plan.compile_program`
    sizes a step: its destination's elements, else its source's, to each peer."""
    ib, ob = p.collective.blocks(p.nranks)
    lengths = {Buf.INPUT: chunk_regions([count] * ib, p.chunks),
               Buf.OUTPUT: chunk_regions([count] * ob, p.chunks),
               Buf.SCRATCH: chunk_regions([count] * p.blocks(Buf.SCRATCH), p.chunks)}
    n, mine = topo.nranks, topo.ranks[p.rank]
    total = 0
    for ch in p.channels:
        for s in ch:
            peers = sum(1 for q in s.send_to if q >= n or topo.ranks[q] != mine)
            ref = s.dst if s.dst is not None else s.src
            if peers and ref is not None:
                regs = lengths[ref.buf]
                first, last = regs[ref.index], regs[ref.index + ref.count - 1]
                total += peers * (last[0] + last[1] - first[0])
    return total * itemsize


def lower_bound_ns(p: Program, topo: Topology, count: int, itemsize: int) -> float:
    """``B / R`` above for rank ``p.rank`` on ``topo`` (ns; 0 when it sends nothing off
    its device or its device has no outgoing link)."""
    d = topo.ranks[p.rank]
    rate = sum(topo.bytes_per_ns(i) for i, lk in enumerate(topo.links) if lk.src == d)
    b = sent_bytes(p, topo, count, itemsize)
    return b / rate if b and rate > 0 else 0.0


def exceeds(bound_ns: float, time_ns: float) -> bool:
    """Is a run whose time is at least ``bound_ns`` (less the rounding, :data:`MARGIN`)
    surely slower than ``time_ns``?"""
    return bound_ns * (1.0 - MARGIN) > time_ns
