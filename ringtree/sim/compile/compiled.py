"""Programs flattened for the simulator's engines, by the executor's own compiler.

Every Program goes through :func:`ringtree.runtime.plan.compile_program` — the function the
executor runs before a real call — so a simulated step has the same element regions,
slices (``split_even`` of the step's data into ``slice_bytes`` pieces), memory
dependencies (:meth:`ringtree.ir.program.Program.memory_deps`) and in-place copy elision as the
real one. This module only renumbers steps globally and pairs the i-th send of every
connection with its i-th receive (the IR's matching rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from ringtree.ir.program import Buf, Program
from ringtree.runtime.plan import DEFAULT_SLICE_BYTES, chunk_regions, compile_program
from ringtree.sim.compile.pairing import issue_order

__all__ = ["Compiled", "compile_programs", "DEFAULT_SLICE_BYTES"]


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
    fold: int = 0                     # rank period g of a folded run (0 = every rank)
    xor: bool = False                 # folded under XOR of blocks of g ranks, not shifts
    link_rep: dict[int, int] | None = None   # folded: link -> its orbit's representative
    world: int = 0                    # ranks of the whole run
    declared: set[tuple[int, int, int]] = field(default_factory=set)  # every (src, dst, ch)
    chan_images: dict[int, tuple[int, ...]] = field(default_factory=dict)  # folded channels
    # what the engines derive from the connections (routes), shared by the runs of one
    # sweep that have the same messages (:mod:`.structure`)
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    # engines that declined this structure after trying, by (engine, rules): why (a
    # sweep's other sizes skip them; :mod:`ringtree.sim.engines.dispatch`)
    declined: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def nsteps(self) -> int:
        return len(self.step_rank)

    @property
    def nmsgs(self) -> int:
        return len(self.msg_src)


def passes(cs) -> int:
    """Passes over a slice's bytes the step's rank makes: k−1 for a k-input reduction,
    one for a copy between different storage, none for receiving in place."""
    s = cs.step
    if s.reduce:
        return max(1, len(s.recv_from) - (s.src is None))
    return int(s.src is not None and s.dst is not None and not s.recv_from
               and not cs.skip_copy)


class _Builder:
    """Accumulates compiled steps and the per-connection send / receive queues."""

    def __init__(self, cp: Compiled, fold: int, shares: bool = True) -> None:
        self.cp, self.fold, self.shares = cp, fold, shares
        self.n, self.xor = cp.world, cp.xor
        self.sends: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        # every connection's first send in program order, empty steps included: the
        # rank of a sender's connections in the message numbering (:func:`pair`)
        self.first: dict[tuple[int, int, int], tuple[int, int]] = {}
        self.recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self.names: dict[tuple, str] = {}
        self.slice_cache: dict[tuple, tuple[int, ...]] = {}
        self.send_ids: list[list[int]] = []      # message ids per step, filled by pair()
        self.recv_ids: list[list[int]] = []

    def rows(self, compiled, itemsize: int) -> tuple[list, ...]:
        """What a compiled Program adds besides its peers, numbered from 0: per step its
        channel, previous step, dependencies, slices (bytes), passes and name; the same
        for every Program of its shape (:func:`shape`)."""
        out: tuple[list, ...] = tuple([] for _ in range(6))
        chan, prev, deps, slices, ops, names = out
        for c, csteps in enumerate(compiled):
            last = -1
            for cs in csteps:
                sl = self.slice_cache.get((cs.slices, itemsize))
                if sl is None:
                    sl = self.slice_cache[(cs.slices, itemsize)] = tuple(
                        ln * itemsize for _, ln in cs.slices)
                chan.append(c)
                prev.append(last)
                deps.append(tuple(cs.deps))
                slices.append(sl)
                ops.append(passes(cs))
                names.append(self._name(cs.step))
                last = cs.gid
        return out

    def add_program(self, rank: int, p: Program, rows: tuple[list, ...]) -> None:
        """Rank ``rank``'s steps: its shape's ``rows`` (:meth:`rows`) renumbered, with
        the peers of ``p``'s own steps."""
        cp, fold = self.cp, self.fold
        base = cp.nsteps
        chan, prev, deps, slices, ops, names = rows
        cp.step_rank += [rank] * len(chan)
        cp.step_chan += chan
        links = rebased(base, prev, deps)
        cp.step_prev += links[0]
        cp.step_deps += links[1]
        cp.step_slices += slices
        cp.step_ops += ops
        cp.step_name += names
        gid, first = base, self.first
        for c, steps in enumerate(p.channels):
            for s in steps:
                for pos, q in enumerate(s.send_to):
                    first.setdefault((rank, q, c), (gid, pos))
                if self.shares:
                    for q in s.send_to:
                        cp.declared.add((rank, q, c))
                if slices[gid - base]:
                    for pos, q in enumerate(s.send_to):
                        self.sends.setdefault((rank, q, c), []).append((gid, pos))
                    for pos, q in enumerate(s.recv_from):
                        a, b = folded_sender(q, rank, fold, self.n, self.xor) if fold \
                            else (q, rank)
                        self.recvs.setdefault((a, b, c), []).append((gid, pos))
                    self.send_ids.append([0] * len(s.send_to))
                    self.recv_ids.append([0] * len(s.recv_from))
                else:
                    self.send_ids.append([])
                    self.recv_ids.append([])
                gid += 1

    def _name(self, s) -> str:
        nk = (s.src is not None, s.dst is not None, bool(s.recv_from), bool(s.send_to),
              s.reduce)
        nm = self.names.get(nk)
        if nm is None:
            nm = self.names[nk] = s.name
        return nm

    def pair(self) -> None:
        """Pair the i-th send with the i-th receive of every connection."""
        pair(self.cp, self.sends, self.recvs, self.send_ids, self.recv_ids,
             self.cp.step_slices, self.first.get)


def rebased(first: int, prev: list[int], deps: list[tuple]) -> tuple[list[int], list[tuple]]:
    """A shape's step links (previous step, memory dependencies) renumbered for a rank
    whose steps start at ``first``; ``-1`` (no previous step) stays ``-1``."""
    return ([first + x if x >= 0 else -1 for x in prev],
            [tuple([first + d for d in ds]) if ds else () for ds in deps])


def shape(p: Program, rank: int) -> tuple:
    """What :func:`~ringtree.runtime.plan.compile_program` reads of ``p`` besides its
    steps' peers: collective, chunks, scratch, channel lengths, each step's references
    (by identity: the caller keeps them alive), receive count, whether it sends and
    reduces; ``rank`` (−1 out of place) for the in-place storage map. Programs of one
    shape compile to the same steps but for the peers, so a tree compiles a handful.
    The caller keeps a Program of each shape alive while it compares shapes."""
    return (p.collective, p.chunks, p.scratch, rank, tuple(len(ch) for ch in p.channels),
            tuple((id(s.src), id(s.dst), len(s.recv_from), bool(s.send_to), s.reduce)
                  for ch in p.channels for s in ch))


def image(r: int, b: int, g: int, n: int, xor: bool) -> int:
    """Rank r under block element b of a fold of g ranks: shifted by b·g (mod n), or its
    block (r div g) XOR b."""
    if xor:
        return ((r // g) ^ b) * g + r % g
    return (r + b * g) % n


def folded_sender(q: int, r: int, g: int, n: int, xor: bool) -> tuple[int, int]:
    """A folded run's connection for rank r receiving from q: q's representative q mod g
    sending to r moved by the inverse of the element that takes q mod g to q (rank q does
    to r what q mod g does to that rank)."""
    b = q // g
    return q % g, image(r, b if xor else -b % (n // g), g, n, xor)


def pair(cp: Compiled, sends: dict, recvs: dict, send_ids: list, recv_ids: list,
         sizes: list | None, first: Callable[[tuple], object]) -> None:
    """Number the messages of ``cp``: connections in :func:`issue_order` (``first``: a
    connection's first send), the i-th send of every connection (``sends``, its (step,
    position) in program order) with its i-th receive; ``sizes``: check that both ends
    cut the message into the same slices."""
    for conn in issue_order(set(sends) | set(recvs), first):
        ss, rr = sends.get(conn, []), recvs.get(conn, [])
        if len(ss) != len(rr):
            raise ValueError(f"connection {conn[0]}→{conn[1]} channel {conn[2]}: "
                             f"{len(ss)} sends but {len(rr)} receives")
        cid = len(cp.conns)
        cp.conns.append(conn)
        cp.conn_ranks.append((conn[0], conn[1]))
        m, k = len(cp.msg_src), len(ss)
        for i, ((a, pa), (b, pb)) in enumerate(zip(ss, rr)):
            if sizes is not None and sizes[a] != sizes[b]:
                raise ValueError(f"connection {conn}: message {i} sizes differ "
                                 f"({sum(sizes[a])} vs {sum(sizes[b])} B)")
            send_ids[a][pa] = recv_ids[b][pb] = m + i
        cp.msg_src += [conn[0]] * k
        cp.msg_dst += [conn[1]] * k
        cp.msg_chan += [conn[2]] * k
        cp.msg_conn += [cid] * k
        cp.msg_sstep += [a for a, _ in ss]
        cp.msg_rstep += [b for b, _ in rr]
    empty: tuple[int, ...] = ()
    cp.step_send = [tuple(x) if x else empty for x in send_ids]
    cp.step_recv = [tuple(x) if x else empty for x in recv_ids]


class Lengths:
    """Prefix sums of the element lengths of every chunk of every buffer, per layout
    (every rank of a run shares one), to tell in O(1) whether a reference moves data."""

    def __init__(self, n: int, count: int) -> None:
        self.n, self.count = n, count
        self.cache: dict[tuple, dict[Buf, list[int]]] = {}

    def of(self, p: Program) -> dict[Buf, list[int]]:
        k = (p.collective, p.chunks, p.scratch)
        got = self.cache.get(k)
        if got is None:
            got = self.cache[k] = {b: list(accumulate(
                (ln for _, ln in chunk_regions([self.count] * p.blocks(b), p.chunks)),
                initial=0)) for b in Buf}
        return got


def _moves(ch, pre: dict[Buf, list[int]]) -> bool:
    """Does a step of channel ``ch`` name a chunk with data (or one out of range)?"""
    for s in ch:
        for ref in (s.src, s.dst):
            if ref is not None:
                a, i = pre[ref.buf], ref.index
                end = i + ref.count
                if i < 0 or end >= len(a) or a[end] != a[i]:
                    return True
    return False


def _zero_keys(p: Program, chans, pre: dict[Buf, list[int]], key, only_zero: bool) -> set:
    out = set()
    for c in chans:
        for s in p.channels[c]:
            for ref in (s.src, s.dst):
                if ref is not None:
                    a = pre[ref.buf]
                    out.update(key(ref.buf, j) for j in ref.chunks()
                               if not only_zero or (j + 1 < len(a) and a[j + 1] == a[j]))
    return out


def _named(p: Program, chans, pre: dict[Buf, list[int]]) -> dict[Buf, np.ndarray] | None:
    """Which chunks of every buffer the steps of ``chans`` name (None: a reference
    outside the buffer), one difference array per buffer instead of a set per chunk."""
    diff = {b: np.zeros(len(a), np.int64) for b, a in pre.items()}
    for c in chans:
        for s in p.channels[c]:
            for ref in (s.src, s.dst):
                if ref is not None:
                    d = diff[ref.buf]
                    if ref.index < 0 or ref.index + ref.count > len(d) - 1:
                        return None
                    d[ref.index] += 1
                    d[ref.index + ref.count] -= 1
    return {b: np.cumsum(d[:-1]) > 0 for b, d in diff.items()}


# buffers of fewer chunks are checked with sets (cheaper than building the arrays: a
# tree on 131,072 ranks has a few chunks per rank)
ARRAYS_FROM_CHUNKS = 512


def _overlap(p: Program, kept, drop, pre: dict[Buf, list[int]], in_place: bool) -> bool:
    """Do the channels kept name a chunk of no data that the channels dropped name too
    (the same storage: in place, an output chunk may be stored in the input)?"""
    if not in_place and sum(map(len, pre.values())) > ARRAYS_FROM_CHUNKS:
        a, b = _named(p, kept, pre), _named(p, drop, pre)
        if a is not None and b is not None:
            both = {k: np.nonzero(a[k] & b[k])[0] for k in pre}
            return any(bool((np.asarray(pre[k])[j + 1] == np.asarray(pre[k])[j]).any())
                       for k, j in both.items() if j.size)
    key = p.storage_map(in_place)
    shared = _zero_keys(p, kept, pre, key, True)
    return bool(shared and shared & _zero_keys(p, drop, pre, key, False))


def moving(p: Program, pre: dict[Buf, list[int]], in_place: bool) -> tuple[Program, list[int]]:
    """``p`` with the channels that move no data emptied, and those channels.

    A step of zero bytes sends and receives nothing and is done when it starts, so a
    channel whose steps are all empty finishes at time 0 unless it waits on memory
    another channel writes. Channels are emptied only when they share no storage with
    the channels kept (which then cannot wait on them either): the answer is exactly the
    unpruned run's, only the zero-byte bookkeeping is gone. At 8 B a 16-channel tree
    moves data on one channel.
    """
    keep = [_moves(ch, pre) for ch in p.channels]
    drop = [c for c, k in enumerate(keep) if not k]
    if not drop or not any(keep):
        return p, []
    kept = [c for c, k in enumerate(keep) if k]
    if any(p.channels[c] for c in drop) and _overlap(p, kept, drop, pre, in_place):
        return p, []
    chans = tuple(ch if k else () for ch, k in zip(p.channels, keep))
    return Program(p.collective, p.algo, p.nranks, p.rank, p.chunks, chans, p.root,
                   p.scratch, p.in_place_ok, p.meta), drop


def compile_programs(programs: Sequence[Program], count: int, itemsize: int,
                     slice_bytes: int = DEFAULT_SLICE_BYTES, in_place: bool = False,
                     fold: int = 0, prune: bool = True, shares: bool = True,
                     xor: bool = False) -> Compiled:
    """Flatten Programs (real ranks first, then virtual ranks) for the engines.

    With ``fold = g`` the Programs are the representatives 0..g−1 of a run that is
    exactly symmetric under shifts of g ranks (``xor``: under XOR of aligned blocks of g
    ranks; :mod:`.symmetry`): a representative sends to its real peers, and a receive
    from q is matched with what q's representative q mod g sends to the image of the
    receiver (:func:`folded_sender`).
    ``prune``: leave out channels that move no data (:func:`moving`; same times).
    ``shares``: record every connection the Programs declare (``Compiled.declared``, the
    unaware model's link shares; the aware model does not read it).
    """
    n = programs[0].nranks
    cp = Compiled(len(programs) if fold else n, fold=fold, world=n, xor=xor)
    b = _Builder(cp, fold, shares)
    cache: dict[tuple, tuple[int, int]] = {}
    # compiled once per shape, with the Program whose references the shape names (kept
    # alive, so no other reference can take their identities)
    shapes: dict[tuple, tuple[tuple[list, ...], Program]] = {}
    lengths = Lengths(n, count)
    for rank, p in enumerate(programs):
        if p.rank != rank:
            raise ValueError(f"program {rank} is for rank {p.rank}")
        ib, ob = cache.get(p.collective) or cache.setdefault(p.collective,
                                                              p.collective.blocks(n))
        if prune:
            full = p
            p, drop = moving(p, lengths.of(p), in_place)
            for c in drop if shares else ():     # still declared (unaware shares)
                cp.declared.update((rank, q, c) for s in full.channels[c] for q in s.send_to)
        sig = shape(p, rank if in_place else -1)
        got = shapes.get(sig)
        if got is None:
            try:
                got = shapes[sig] = (b.rows(compile_program(
                    p, [count] * ib, [count] * ob, count, itemsize, slice_bytes, in_place),
                    itemsize), p)
            except ValueError as e:
                raise ValueError(f"rank {rank}: {e}") from None
        b.add_program(rank, p, got[0])
    b.pair()
    return cp


def declared_connections(cp: Compiled) -> set[tuple[int, int, int]]:
    """Every (sender, receiver, channel) the Programs of the whole run name, data or not:
    a folded run's connections and their images under the shifts (and channels) it
    stands for."""
    every = cp.declared
    if cp.chan_images:
        every = {(s, d, k) for s, d, c in every for k in cp.chan_images.get(c, (c,))}
    n, g = cp.world, cp.fold
    if g:
        every = {(image(s, b, g, n, cp.xor), image(d, b, g, n, cp.xor), c)
                 for b in range(n // g) for s, d, c in every}
    return every


def connection_routes(cp: Compiled, topo, devices: list[int], share: bool = False) -> list:
    """The route (:class:`~ringtree.sim.machine.model.Path`) of every connection of ``cp``.

    With ``share`` (the congestion-unaware model) each link's rate is divided by the
    connections of one sender crossing it (:func:`~ringtree.sim.machine.model.channel_shares`)
    over the *whole* run: a folded run also routes the images of its connections under
    the shifts it stands for. Shares count every connection the Programs declare, so a
    step with no data to move still holds its share (the answer does not depend on which
    channels a small message happens to fill). A folded run with ``link_rep`` routes
    over one representative link per orbit of the symmetry (:mod:`.symmetry`).
    """
    from ringtree.sim.machine.model import channel_shares, path

    key = (id(topo), tuple(devices), share, cp.link_rep is not None)
    got = cp.memo.get(key)
    if got is not None and got[0] is topo:
        return got[1]
    shares = None
    if share:
        shares = channel_shares((s, topo.route(devices[s], devices[d], c))
                                for s, d, c in declared_connections(cp))
    rep = cp.link_rep
    if shares is None and rep is None:
        # routed once per pair of devices, equal routes sharing one summary (.routes)
        from ringtree.sim.compile.routes import route_table

        uniq, idx = route_table(cp, topo, devices)
        out = list(map(uniq.__getitem__, idx.tolist()))
    else:
        out = [path(topo, topo.route(a, b, c) if rep is None else
                    tuple(rep.get(li, li) for li in topo.route(a, b, c)), shares)
               for a, b, c in ((devices[s], devices[d], c)
                               for (s, d), (_, _, c) in zip(cp.conn_ranks, cp.conns))]
    cp.memo[key] = (topo, out)
    return out


def _summary(topo, links: tuple[int, ...], memo: dict):
    """:func:`~ringtree.sim.machine.model.path` of ``links`` on ``topo``, kept in ``memo``
    by the links (a pure function of them)."""
    from ringtree.sim.machine.model import path

    got = memo.get(links)
    if got is None:
        got = memo[links] = path(topo, links)
    return got
