"""The event engine: runs every rank's Program on a modeled network.

It mirrors the executor (``ringtree/core/executor.py``) rule for rule, so a simulated Program
and a real one take the same steps:

1. in-order issue — within a channel step i+1 starts no earlier than step i, and a step
   starts only when the earlier steps it conflicts with in memory (RAW/WAR/WAW, same
   analysis as ``compile_program``) are done;
2. sends never block; a step is done when its last slice is processed and its sends have
   left the device;
3. slicing — a step's data is cut into ``ceil(bytes/slice_bytes)`` near-equal slices
   (``split_even``) that flow recv → reduce → send one after another, so chains and
   trees pipeline; zero-length steps do nothing;
4. messages of one (sender, receiver, channel) connection are injected and delivered in
   program order (a NCCL connection / TCP stream is a FIFO).

Times are nanoseconds. The engine is a dataflow over (step, slice) times plus, for the
congestion-aware model, an event heap ordering the chunks that meet on *shared* links.
A link used by a single connection sees that connection's chunks in injection order, so
it is resolved eagerly without events (exact, and the reason a ring on a fat-tree costs
few events) — the ASTRA-sim link FIFO (``Link.cpp``) evaluated only where chunks meet.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ringtree.core.ir import Buf, Program, split_even
from ringtree.sim.model import Aware, Path, Unaware, compute_ns, path
from ringtree.sim.topology import Topology

DEFAULT_SLICE_BYTES = 1 << 20


@dataclass
class Compiled:
    """Programs flattened into parallel lists indexed by global step id / message id."""

    nranks: int                       # real ranks (virtual ranks follow)
    step_rank: list[int] = field(default_factory=list)
    step_chan: list[int] = field(default_factory=list)
    step_prev: list[int] = field(default_factory=list)     # previous step in channel
    step_deps: list[tuple[int, ...]] = field(default_factory=list)
    step_slices: list[tuple[int, ...]] = field(default_factory=list)  # bytes per slice
    step_ops: list[int] = field(default_factory=list)      # reduce/copy passes per slice
    step_recv: list[tuple[int, ...]] = field(default_factory=list)    # message ids
    step_send: list[tuple[int, ...]] = field(default_factory=list)
    step_name: list[str] = field(default_factory=list)
    msg_src: list[int] = field(default_factory=list)        # sender rank
    msg_dst: list[int] = field(default_factory=list)
    msg_chan: list[int] = field(default_factory=list)
    msg_conn: list[int] = field(default_factory=list)       # connection id
    msg_sstep: list[int] = field(default_factory=list)      # sending step
    msg_rstep: list[int] = field(default_factory=list)      # receiving step
    conns: list[tuple[int, int, int]] = field(default_factory=list)  # (src, dst, channel)
    conn_ranks: list[tuple[int, int]] = field(default_factory=list)  # ranks routed between

    @property
    def nsteps(self) -> int:
        return len(self.step_rank)

    @property
    def nmsgs(self) -> int:
        return len(self.msg_src)


def _regions(blocks: list[int], chunks: int) -> list[int]:
    """Element length of every chunk of a buffer made of ``blocks``."""
    out = []
    for size in blocks:
        out += [split_even(size, chunks, s)[1] for s in range(chunks)]
    return out


def compile_programs(programs: list[Program], count: int, itemsize: int,
                     slice_bytes: int = DEFAULT_SLICE_BYTES, in_place: bool = False,
                     fold: int = 0) -> Compiled:
    """Flatten Programs (real ranks first, then virtual ranks) for the engine.

    Slices and memory dependencies follow ``ringtree.core.plan.compile_program`` exactly. With
    ``fold = g`` the Programs are the representatives 0..g−1 of a symmetric run
    (:func:`ringtree.sim.fast.period`): a peer q stands for its class q mod g, while
    the connection keeps the route to the real peer.
    """
    n = programs[0].nranks
    cp = Compiled(len(programs) if fold else n)
    route_pair: dict[tuple[int, int, int], tuple[int, int]] = {}
    slice_elems = max(1, slice_bytes // max(1, itemsize))
    sends: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    layout_cache: dict[tuple, dict] = {}
    slice_cache: dict[int, tuple[int, ...]] = {}
    step_rank, step_chan, step_prev = cp.step_rank, cp.step_chan, cp.step_prev
    step_deps, step_slices, step_ops, step_name = (cp.step_deps, cp.step_slices, cp.step_ops,
                                                   cp.step_name)
    step_send, step_recv = cp.step_send, cp.step_recv
    names: dict[tuple, str] = {}
    for rank, p in enumerate(programs):
        if p.rank != rank:
            raise ValueError(f"program {rank} is for rank {p.rank}")
        ib, ob = p.collective.blocks(n)
        lk = (p.chunks, ib, ob, p.blocks(Buf.SCRATCH))
        layout = layout_cache.get(lk)
        if layout is None:
            layout = layout_cache[lk] = {
                Buf.INPUT: _regions([count] * ib, p.chunks),
                Buf.OUTPUT: _regions([count] * ob, p.chunks),
                Buf.SCRATCH: _regions([count] * p.blocks(Buf.SCRATCH), p.chunks)}
        smap = p.storage_map(True) if in_place else None

        def keys(ref, smap=smap) -> list:
            if smap is None:
                b = int(ref.buf) << 40
                return [b | j for j in range(ref.index, ref.index + ref.count)]
            return [smap(ref.buf, j) for j in range(ref.index, ref.index + ref.count)]

        last_writer: dict = {}
        readers: dict = {}
        for c, chan in enumerate(p.channels):
            prev = -1
            for s in chan:
                gid = len(step_rank)
                src, dst = s.src, s.dst
                ref = dst if dst is not None else src
                regs = layout[ref.buf]
                if ref.index + ref.count > len(regs):
                    raise ValueError(f"rank {rank}: {ref} outside {ref.buf.name}")
                length = regs[ref.index] if ref.count == 1 else \
                    sum(regs[ref.index:ref.index + ref.count])
                slices = slice_cache.get(length)
                if slices is None:
                    nsl = -(-length // slice_elems) if length else 0
                    slices = slice_cache[length] = tuple(
                        split_even(length, nsl, k)[1] * itemsize for k in range(nsl))
                rk = keys(src) if src is not None else []
                wk = keys(dst) if dst is not None else []
                if s.reduce and not s.recv_from:
                    rk = rk + wk
                deps = set()
                for k in rk:
                    w = last_writer.get(k)
                    if w is not None:
                        deps.add(w)
                for k in wk:
                    w = last_writer.get(k)
                    if w is not None:
                        deps.add(w)
                    rd = readers.get(k)
                    if rd:
                        deps.update(rd)
                for k in rk:
                    rd = readers.get(k)
                    if rd is None:
                        readers[k] = [gid]
                    else:
                        rd.append(gid)
                for k in wk:
                    last_writer[k] = gid
                    readers[k] = None
                if s.reduce:
                    ops = max(1, len(s.recv_from) - (src is None))
                else:
                    ops = 1 if (src is not None and dst is not None and not s.recv_from
                                and set(rk) != set(wk)) else 0
                step_rank.append(rank)
                step_chan.append(c)
                step_prev.append(prev)
                step_deps.append(tuple(sorted(deps)) if deps else ())
                step_slices.append(slices)
                step_ops.append(ops)
                nk = (src is not None, dst is not None, bool(s.recv_from), bool(s.send_to),
                      s.reduce)
                nm = names.get(nk)
                if nm is None:
                    nm = names[nk] = s.name
                step_name.append(nm)
                if slices:
                    for pos, q in enumerate(s.send_to):
                        if fold:
                            route_pair[(rank, q % fold, c)] = (rank, q)
                            q %= fold
                        sends.setdefault((rank, q, c), []).append((gid, pos))
                    for pos, q in enumerate(s.recv_from):
                        recvs.setdefault((q % fold if fold else q, rank, c), []).append((gid, pos))
                    step_send.append([0] * len(s.send_to))
                    step_recv.append([0] * len(s.recv_from))
                else:
                    step_send.append(())
                    step_recv.append(())
                prev = gid
    # Pair the i-th send with the i-th receive of every connection (the matching rule).
    for conn in sorted(set(sends) | set(recvs)):
        ss, rr = sends.get(conn, []), recvs.get(conn, [])
        if len(ss) != len(rr):
            raise ValueError(f"connection {conn[0]}→{conn[1]} channel {conn[2]}: "
                             f"{len(ss)} sends but {len(rr)} receives")
        cid = len(cp.conns)
        cp.conns.append(conn)
        cp.conn_ranks.append(route_pair.get(conn, (conn[0], conn[1])))
        for i, ((a, pa), (b, pb)) in enumerate(zip(ss, rr)):
            if step_slices[a] != step_slices[b]:
                raise ValueError(f"connection {conn}: message {i} sizes differ "
                                 f"({sum(step_slices[a])} vs {sum(step_slices[b])} B)")
            m = len(cp.msg_src)
            cp.msg_src.append(conn[0])
            cp.msg_dst.append(conn[1])
            cp.msg_chan.append(conn[2])
            cp.msg_conn.append(cid)
            cp.msg_sstep.append(a)
            cp.msg_rstep.append(b)
            step_send[a][pa] = m
            step_recv[b][pb] = m
    return cp


@dataclass
class Result:
    """Outcome of a simulation. ``time_ns``: when the last rank finished."""

    time_ns: float
    rank_done: list[float]
    messages: int
    bytes: int
    events: int
    step_start: list[float]
    step_done: list[float]
    transfers: list[tuple[int, int, float, float, int]] | None = None  # msg, slice, t0, t1, B


def routes(cp: Compiled, topo: Topology, devices: list[int]) -> list[Path]:
    """The route of every connection (one per (sender, receiver, channel))."""
    return [path(topo, topo.route(devices[s], devices[d], c))
            for (s, d), (_, _, c) in zip(cp.conn_ranks, cp.conns)]


def run(cp: Compiled, topo: Topology, devices: list[int], model: Unaware | Aware,
        trace: bool = False) -> Result:
    """Simulate compiled Programs; ``devices[r]`` is the device of (real or virtual) rank r."""
    NS, NM = cp.nsteps, cp.nmsgs
    aware = isinstance(model, Aware)
    integer = model.integer_ns
    over = topo.overhead_ns
    paths = routes(cp, topo, devices)
    conn_lat = [p.latency for p in paths]
    conn_bott = [p.bottleneck for p in paths]
    conn_first = [p.first for p in paths]
    conn_links = [p.links for p in paths]
    red = [topo.devices[devices[r]].reduce_gbps * topo.gb / 1e9 for r in range(len(devices))]
    if aware:
        users: dict[int, set[int]] = {}
        for cid, p in enumerate(paths):
            for li in p.links:
                users.setdefault(li, set()).add(cid)
        shared = [False] * len(topo.links)
        for li, u in users.items():
            shared[li] = len(u) > 1
        rate = [topo.bytes_per_ns(i) for i in range(len(topo.links))]
        llat = [lk.latency for lk in topo.links]
        free = [0.0] * len(topo.links)

    step_prev, step_deps, step_slices = cp.step_prev, cp.step_deps, cp.step_slices
    step_recv, step_send, step_ops, step_rank = cp.step_recv, cp.step_send, cp.step_ops, cp.step_rank
    msg_conn, msg_sstep, msg_rstep = cp.msg_conn, cp.msg_sstep, cp.msg_rstep
    nxt_in_chan = [-1] * NS
    dependents: list[list[int]] = [[] for _ in range(NS)]
    pend = [0] * NS
    for s in range(NS):
        p = step_prev[s]
        if p >= 0:
            nxt_in_chan[p] = s
            pend[s] += 1
        for d in step_deps[s]:
            dependents[d].append(s)
            pend[s] += 1
    comp = [[compute_ns(b, step_ops[s], red[step_rank[s]]) for b in step_slices[s]]
            if step_ops[s] else None for s in range(NS)]
    start: list[float] = [-1.0] * NS
    done: list[float] = [-1.0] * NS
    maxin = [0.0] * NS
    nxt = [0] * NS
    last = [0.0] * NS
    unsent = [len(step_slices[s]) * len(step_send[s]) for s in range(NS)]
    sdone = [0.0] * NS          # latest send completion of the step
    arr: list[list[float] | None] = [None] * NM
    narr = [0] * NM
    nconn = len(cp.conns)
    conn_cur = [-1] * nconn     # message allowed to inject on the connection
    for m in range(NM - 1, -1, -1):
        conn_cur[msg_conn[m]] = m
    conn_inj = [0.0] * nconn
    conn_arr = [0.0] * nconn
    ninj = [0] * NM
    waiting: dict[int, list[tuple[int, float]]] = {}
    heap: list[tuple[float, int, int, int, int, float]] = []
    seq = 0
    events = 0
    transfers: list | None = [] if trace else None
    work: list[int] = []

    def begin(s: int, t: float) -> None:
        """Issue step s at t; the next step of its channel may now be issued too."""
        start[s] = t
        last[s] = t
        ns_ = nxt_in_chan[s]
        if ns_ >= 0:
            if t > maxin[ns_]:
                maxin[ns_] = t
            pend[ns_] -= 1
            if pend[ns_] == 0:
                work.append(ns_)

    for s in range(NS):
        if pend[s] == 0:
            work.append(s)

    def deliver(m: int, i: int, t: float, t0: float) -> None:
        c = msg_conn[m]
        if t < conn_arr[c]:
            t = conn_arr[c]
        conn_arr[c] = t
        a = arr[m]
        if a is None:
            a = arr[m] = []
        a.append(t)
        narr[m] += 1
        if transfers is not None:
            transfers.append((m, i, t0, t, step_slices[msg_sstep[m]][i]))
        r = msg_rstep[m]
        if start[r] >= 0.0 and nxt[r] == i:
            work.append(r)

    def network(m: int, i: int, t: float, hop: int, t0: float) -> None:
        """Carry slice i of message m from hop ``hop`` of its route, arriving there at t."""
        nonlocal seq
        c = msg_conn[m]
        b = step_slices[msg_sstep[m]][i]
        links = conn_links[c]
        for h in range(hop, len(links)):
            li = links[h]
            if shared[li] and h != hop:
                seq += 1
                heapq.heappush(heap, (t, seq, m, i, h, t0))
                return
            st = free[li]
            if t > st:
                st = t
            ser = b / rate[li]
            free[li] = st + ser
            t = st + ser + llat[li]
            if integer:
                t = float(int(t))
        deliver(m, i, t, t0)

    def inject(m: int, i: int, t: float) -> None:
        nonlocal seq
        c = msg_conn[m]
        if t < conn_inj[c]:
            t = conn_inj[c]
        b = step_slices[msg_sstep[m]][i]
        # The α-β pipe of a connection carries one slice at a time (links do it when aware).
        conn_inj[c] = t if aware or not b else t + b / conn_bott[c]
        s = msg_sstep[m]
        fin = t + (b / conn_first[c] if b and conn_first[c] != math.inf else 0.0)
        if fin > sdone[s]:
            sdone[s] = fin
        unsent[s] -= 1
        if unsent[s] == 0 and nxt[s] == len(step_slices[s]):
            work.append(s)
        if aware:
            t1 = t + over
            links = conn_links[c]
            if links and shared[links[0]]:
                seq += 1
                heapq.heappush(heap, (t1, seq, m, i, 0, t))
            else:
                network(m, i, t1, 0, t)
        else:
            d = over + conn_lat[c] + (b / conn_bott[c] if b else 0.0)
            deliver(m, i, t + (float(int(d)) if integer else d), t)
        ninj[m] += 1
        if ninj[m] == len(step_slices[s]):        # message fully injected: next one may go
            nm = m + 1
            if nm < NM and msg_conn[nm] == c:
                conn_cur[c] = nm
                for j, tj in waiting.pop(nm, ()):
                    inject(nm, j, tj)

    def ready(m: int, i: int, t: float) -> None:
        if conn_cur[msg_conn[m]] == m:
            inject(m, i, t)
        else:
            waiting.setdefault(m, []).append((i, t))

    while True:
        while work:
            s = work.pop()
            if done[s] >= 0.0:
                continue
            if start[s] < 0.0:
                if pend[s]:
                    continue
                begin(s, maxin[s])
            sl = step_slices[s]
            nsl = len(sl)
            rv = step_recv[s]
            cs = comp[s]
            while nxt[s] < nsl:
                i = nxt[s]
                t = last[s]
                ok = True
                for m in rv:
                    if narr[m] <= i:
                        ok = False
                        break
                    a = arr[m][i]  # type: ignore[index]
                    if a > t:
                        t = a
                if not ok:
                    break
                if cs is not None:
                    t += cs[i]
                last[s] = t
                nxt[s] = i + 1
                for m in step_send[s]:
                    ready(m, i, t)
            if nxt[s] == nsl and unsent[s] == 0 and done[s] < 0.0:
                t = last[s] if nsl else start[s]
                if sdone[s] > t:
                    t = sdone[s]
                done[s] = t
                for d in dependents[s]:
                    if t > maxin[d]:
                        maxin[d] = t
                    pend[d] -= 1
                    if pend[d] == 0:
                        work.append(d)
        if not heap:
            break
        t, _, m, i, h, t0 = heapq.heappop(heap)
        events += 1
        network(m, i, t, h, t0)
    if any(d < 0.0 for d in done):
        stuck = [s for s in range(NS) if done[s] < 0.0][:4]
        desc = "; ".join(f"rank {step_rank[s]} ch {cp.step_chan[s]} step {cp.step_name[s]}"
                         for s in stuck)
        raise RuntimeError(f"simulation deadlocked: {desc}")
    rank_done = [0.0] * cp.nranks
    for s in range(NS):
        r = step_rank[s]
        if r < cp.nranks and done[s] > rank_done[r]:
            rank_done[r] = done[s]
    nbytes = sum(sum(step_slices[msg_sstep[m]]) for m in range(NM))
    return Result(max(rank_done, default=0.0), rank_done, NM, nbytes, events, start, done,
                  transfers)
