"""Hierarchical (two-level) algorithms: an intra-node phase, an inter-node phase among one
leader per node, and a second intra-node phase (Sack & Gropp; MPICH's SMP-aware
collectives, ``MPIR_*_intra_smp``; Horovod's hierarchical all-reduce).

Nodes come from ``Options.nodes`` (the host identities published at rendezvous; tests may
fake them). Each node's leader is its lowest rank (for broadcast: the root on the root's
node). The inter-node phase is any registered flat algorithm, ``params["inter"]`` (default
``ring``), generated over the L leaders and embedded into the leaders' programs with its
peers and buffers remapped; other params pass through to it. Intra-node phases are
pipelined chains (reduce, broadcast) or direct sends to the leader (gather, scatter).

- all-reduce: chain-reduce to the leader, inter-node all-reduce, chain-broadcast.
- broadcast: inter-node broadcast from the root, chain-broadcast in each node.
- all-gather: gather to the leader, inter-node all-gather of node "superblocks" of M
  blocks (M = largest node), chain-broadcast of the whole output.
- reduce-scatter: chain-reduce the whole input to the leader (in superblock order),
  inter-node reduce-scatter of superblocks, scatter to the node's ranks.
Nodes need not be contiguous or equal: superblocks live in scratch and are padded to M;
when nodes are contiguous and equal the all-gather runs in the output directly, and with
``params["pieces"]`` both go block by block (:mod:`ringtree.schedules.hierarchical_blocks`). With
``nodes=None`` (one node) only the intra-node phases remain; with one rank per node this
is exactly the flat ``inter`` algorithm.

Costs, p ranks on L nodes of m = p/L ranks, n bytes, intra (α_i, β_i) vs inter (α_e, β_e)
links, T_inter = the flat algorithm's cost over L ranks:
- all-reduce, ``hierarchical``: 2(m−1+s−1)(α_i + n/s·β_i) + (m−1)·n·γ + T_inter(n).
- broadcast, ``hierarchical``: T_inter(n) + (m−1+s−1)(α_i + n/s·β_i).
- all-gather, ``hierarchical``: (m−1)(α_i + n/p·β_i) + T_inter(n) + (m−1+s−1)(α_i + n/s·β_i).
- reduce-scatter, ``hierarchical``: (m−1+s−1)(α_i + n/s·β_i) + (m−1)·n·γ + T_inter(n)
  + (m−1)(α_i + n/p·β_i).
Only L − 1 … 2(L−1) messages cross the network per leader instead of p − 1 … 2(p−1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ringtree.ir import program as ir
from ringtree.ir.program import Buf, Collective, Program, Ref, Step, copy, inp, out, scr
from ringtree.schedules.registry import Options, generate, register
from ringtree.schedules.tree_wiring import node_groups


@dataclass(frozen=True)
class _Place:
    """Where one buffer of the inter-node program lives in the rank's own buffers."""

    buf: Buf
    offset: int = 0
    scale: int = 1   # outer chunks per inter-node chunk
    stride: int = 0  # instead: inter-node chunk i is outer chunk offset + i·stride

    def ref(self, r: Ref) -> Ref:
        if self.stride:
            assert r.count == 1, "a strided place maps single chunks"
            return _ref(self.buf, self.offset + r.index * self.stride, 1)
        return _ref(self.buf, self.offset + r.index * self.scale, r.count * self.scale)


@lru_cache(maxsize=1 << 16)
def _ref(buf: Buf, index: int, count: int = 1) -> Ref:
    """``Ref(buf, index, count)`` made once (Refs are immutable), as the tree does: the
    chain ranks of one node then hold the same objects, and a simulator compiles each
    shape of Program once (it keys on reference identities). The Programs are equal."""
    return Ref(buf, index, count)


def _embed(sub: Program, leaders: list[int], where: dict[Buf, _Place]) -> list[list[Step]]:
    """The inter-node program's channels with peers and chunk references remapped."""
    chans = []
    for ch in sub.channels:
        steps = []
        for s in ch:
            src = where[s.src.buf].ref(s.src) if s.src is not None else None
            dst = where[s.dst.buf].ref(s.dst) if s.dst is not None else None
            if not s.recv_from and not s.send_to and src == dst and not s.reduce:
                continue                           # a copy that aliasing made a no-op
            steps.append(Step(src=src, dst=dst, reduce=s.reduce,
                              recv_from=tuple(leaders[p] for p in s.recv_from),
                              send_to=tuple(leaders[p] for p in s.send_to)))
        chans.append(steps)
    return chans


def _touched(ch: list[Step] | tuple[Step, ...]) -> list[tuple[int, int]]:
    """Runs of input/output chunks a channel of a one-block collective touches: the
    union of its references' ranges, merged where they overlap or meet (the runs of
    consecutive chunks they name, without listing the chunks)."""
    spans = sorted({(x.index, x.count) for s in ch for x in (s.src, s.dst)
                    if x is not None and x.buf is not Buf.SCRATCH and x.count > 0})
    runs: list[tuple[int, int]] = []
    for a, c in spans:
        if runs and a <= runs[-1][0] + runs[-1][1]:
            end = max(runs[-1][0] + runs[-1][1], a + c)
            runs[-1] = (runs[-1][0], end - runs[-1][0])
        else:
            runs.append((a, c))
    return runs


class _Layout:
    """Nodes, leaders and the position of each rank in its node's chain."""

    def __init__(self, n: int, r: int, opts: Options, root: int | None = None) -> None:
        inter = str(opts.param("inter", "ring")).lower()
        if inter == "hierarchical":
            raise ValueError("hierarchical cannot be its own inter-node algorithm")
        self.inter = inter
        self.groups = node_groups(n, opts.nodes)
        if root is not None:                       # the root leads its node
            self.groups = [[root] + [q for q in g if q != root] if root in g else g
                           for g in self.groups]
        self.leaders = [g[0] for g in self.groups]
        self.node = next(i for i, g in enumerate(self.groups) if r in g)
        self.chain = self.groups[self.node]
        self.pos = self.chain.index(r)
        self.M = max(len(g) for g in self.groups)
        self.L = len(self.groups)
        params = tuple((k, v) for k, v in opts.params if k not in ("inter", "pieces"))
        self.sub_params = params

    def sub(self, coll: Collective, channels: int, sub_root: int = 0) -> Program:
        """The leader of this rank's node's inter-node program."""
        o = Options(root=sub_root, channels=channels, nodes=tuple(range(self.L)),
                    params=self.sub_params)
        return generate(coll, self.inter, self.L, self.node, o)

    def chain_down(self, ref_at: Ref) -> Step | None:
        """One step of a pipelined chain broadcast leader → … → last, of ``ref_at``."""
        c, i = self.chain, self.pos
        if len(c) == 1:
            return None
        if i == 0:
            return ir.send(c[1], ref_at)
        if i == len(c) - 1:
            return ir.recv(c[i - 1], ref_at)
        return ir.recv_copy_send(c[i - 1], c[i + 1], ref_at)

    def chain_up(self, src: Ref, dst: Ref) -> Step | None:
        """One step of a pipelined chain reduce last → … → leader; the leader stores in dst."""
        c, i = self.chain, self.pos
        if len(c) == 1:
            return copy(src, dst) if src != dst else None
        if i == 0:
            return ir.recv_reduce_copy(c[1], src, dst)
        if i == len(c) - 1:
            return ir.send(c[i - 1], src)
        return ir.recv_reduce_send(c[i + 1], c[i - 1], src)

    def slot(self, q: int) -> int:
        """Position of rank q's block in the superblock layout (node-major, M per node)."""
        for node, g in enumerate(self.groups):
            if q in g:
                return node * self.M + g.index(q)
        raise ValueError(q)

    def identity(self, n: int) -> bool:
        return self.L * self.M == n and all(self.slot(q) == q for q in range(n))


def _program(coll: Collective, n: int, r: int, chunks: int, chans: list[list[Step]],
             lay: _Layout, root: int = 0, scratch: int = 0) -> Program:
    return Program(coll, "hierarchical", n, r, chunks, tuple(tuple(c) for c in chans),
                   root=root, scratch=scratch, meta={"inter": lay.inter})


PIECE_BYTES = 1 << 20  # pieces of at least this much (per leader block), ...
ALL_REDUCE_PIECE_BYTES = 256 << 10  # ... or this much for an all-reduce, ...
MAX_PIECES = 4         # ... and at most this many


def _sized(least: int):
    """The ``sized`` rule of a hierarchical collective (pieces of at least ``least``)."""
    def sized(nbytes: int, opts: Options) -> Options:
        extra = pieces_for(nbytes, opts.nodes, opts.channels, least)
        if not extra:
            return opts
        params = dict(opts.params) | dict(extra)
        return replace(opts, params=tuple(sorted(params.items())))
    return sized


def _hosts(opts: Options) -> int:
    return len(set(opts.nodes or (0,)))


def _all_reduce_fill(n: int, opts: Options) -> float:
    """The tuner's overlap of an all-reduce in P pieces over L hosts (``Algorithm.fill``):
    the link waits for the first 1/(P·L) of the chain reduce, and the last broadcast
    follows the link by as much."""
    p = int(opts.param("pieces", 1))
    return 1.0 if p <= 1 else 1.0 / (p * _hosts(opts))


def _reduce_scatter_fill(n: int, opts: Options) -> float:
    """... of a reduce-scatter in P pieces per block, block by block over L hosts of M
    ranks (:mod:`ringtree.schedules.hierarchical_blocks`): the link waits for the first
    1/(L·M·P) of the chain reduce, and the last piece's result follows it by as much."""
    from ringtree.schedules.hierarchical_blocks import reduce_scatter_pieces

    k = reduce_scatter_pieces(n, opts)
    return 1.0 / (_hosts(opts) * k) if k else 1.0


@register(Collective.ALL_REDUCE, "hierarchical",
          cost="2(m−1+s−1)(α_i + n/s·β_i) + (m−1)·n·γ + T_inter(n)",
          sized=_sized(ALL_REDUCE_PIECE_BYTES), fill=_all_reduce_fill)
def all_reduce(n: int, r: int, opts: Options) -> Program:
    """Chain-reduce to the leader, inter-node all-reduce, chain-broadcast.

    ``params["pieces"]`` = P > 1 pipelines the three phases: the inter-node program runs
    as P interleaved copies on 1/P of the data each (step-major, so the leaders' link
    carries one piece after another), the chain reduce delivers pieces in the order the
    inter-node steps first read them and the chain broadcast sends each piece as soon as
    its inter-node steps last wrote it. A step waits only for the steps that touch its
    memory, so the link starts after 1/(P·L) of the chain reduce instead of all of it and
    the broadcast ends 1/(P·L) after it (:func:`pieces_for` picks P by size)."""
    lay = _Layout(n, r, opts)
    pieces = int(opts.param("pieces", 1))
    if pieces < 1:
        raise ValueError(f"hierarchical: pieces={pieces}, need at least 1")
    sub = lay.sub(Collective.ALL_REDUCE, opts.channels * pieces)
    if len(sub.channels) != opts.channels * pieces or lay.M == 1:
        pieces, sub = 1, lay.sub(Collective.ALL_REDUCE, opts.channels)  # nothing to overlap
    C, alone, leader = sub.chunks, len(lay.chain) == 1, lay.pos == 0
    scratch, stage = sub.scratch, Buf.OUTPUT
    if alone:
        stage = Buf.INPUT
    elif not sub.in_place_ok:                      # stage the node's sum in scratch
        stage, scratch = Buf.SCRATCH, -(-sub.scratch // C) * C + C
    stage_off = scratch - C if stage is Buf.SCRATCH else 0
    where = {Buf.INPUT: _Place(stage, stage_off), Buf.OUTPUT: _Place(Buf.OUTPUT),
             Buf.SCRATCH: _Place(Buf.SCRATCH)}
    inter = _embed(sub, lay.leaders, where) if leader else [[] for _ in sub.channels]
    chans = []
    for c, (ups, downs) in enumerate(_chain_runs(sub, pieces)):
        steps = _interleave([inter[j] for j in range(c * pieces, (c + 1) * pieces)])
        up = [lay.chain_up(_ref(Buf.INPUT, a, ln), _ref(stage, stage_off + a, ln))
              for a, ln in ups]
        down = [lay.chain_down(_ref(Buf.OUTPUT, a, ln)) for a, ln in downs]
        chans.append([s for s in up if s is not None] + steps + [s for s in down if s is not None])
    return _program(Collective.ALL_REDUCE, n, r, C, chans, lay, scratch=scratch)


# the chain runs of the last few inter-node Programs, by identity (the Program is kept,
# so its identity cannot pass to another): every rank of a node reads its leader's
_CHAIN_RUNS: dict[int, tuple[Program, int, list]] = {}


def _chain_runs(sub: Program, pieces: int) -> list[tuple[list, list]]:
    """Per channel of an all-reduce in ``pieces`` pieces over the inter-node Program
    ``sub``: the (chunk, count) runs its chain reduce delivers, in the order the
    inter-node steps first read them, and those its chain broadcast sends, in the order
    they are last written (one piece: the runs the channel touches, both ways). Every
    rank of a node computes the same from the same ``sub`` (the registry's), so it is
    computed once per node."""
    got = _CHAIN_RUNS.get(id(sub))
    if got is not None and got[0] is sub and got[1] == pieces:
        return got[2]
    got_runs: list[tuple[list, list]] = []
    for c in range(len(sub.channels) // pieces):
        subs = [sub.channels[j] for j in range(c * pieces, (c + 1) * pieces)]
        if pieces == 1:
            runs = _touched(subs[0])
            got_runs.append((runs, runs))
        else:
            order = _interleave(subs)
            got_runs.append(([(j, 1) for j in _first_use(order)],
                             [(j, 1) for j in _first_use(order, last=True)]))
    if len(_CHAIN_RUNS) >= 16:
        _CHAIN_RUNS.clear()
    _CHAIN_RUNS[id(sub)] = (sub, pieces, got_runs)
    return got_runs


def pieces_for(nbytes: int, nodes: tuple[int, ...] | None, channels: int = 1,
               least: int = PIECE_BYTES) -> tuple[tuple[str, object], ...]:
    """``Options.params`` for a hierarchical collective of ``nbytes``: P pieces where
    ranks span hosts and share them (``()``, one piece, otherwise). Below ``least``
    bytes per piece and host the extra messages cost more than the overlap saves.

    All-reduces take ``ALL_REDUCE_PIECE_BYTES``: on the testbed (2×4, 1 Gbit/s,
    ``benchmarks/multihost.py --algos hierarchical,tree --reps 7``, runs alternated;
    the default and hierarchical forced, medians) pieces from 256 KiB took the
    all-reduce at 1 / 2 / 4 MiB from 10.1–10.2 / 20.9–21.7 / 39.6–40.3 ms (pieces from
    1 MiB: one piece below 4 MiB) to 9.2–9.6 / 18.9–19.8 / 37.4–39.6 ms, where the
    double binary tree, whose two half-trees overlap the same way, took 9.6–9.9 /
    19.3–19.8 / 40.6–42.3 ms."""
    if nodes is None:
        return ()
    hosts = len(set(nodes))
    if hosts < 2 or hosts == len(nodes):
        return ()
    p = min(MAX_PIECES, nbytes // (least * hosts * max(1, channels)))
    return (("pieces", int(p)),) if p > 1 else ()


def _interleave(chans: list) -> list[Step]:
    """Steps of equally long channels, step-major (step 0 of each, then step 1, ...)."""
    if len({len(ch) for ch in chans}) > 1:
        return [s for ch in chans for s in ch]
    return [ch[i] for i in range(len(chans[0]) if chans else 0) for ch in chans]


def _first_use(steps: list[Step], buf: Buf | None = None, last: bool = False) -> list[int]:
    """Chunks the steps touch (of ``buf``; of input and output if None), in the order of
    their first use, or with ``last`` of their last."""
    when: dict[int, int] = {}
    for i, s in enumerate(steps):
        for x in (s.src, s.dst):
            if x is None or x.buf is Buf.SCRATCH or (buf is not None and x.buf is not buf):
                continue
            for j in x.chunks():
                if last or j not in when:
                    when[j] = i
    return sorted(when, key=lambda j: when[j])


@register(Collective.BROADCAST, "hierarchical", cost="T_inter(n) + (m−1+s−1)(α_i + n/s·β_i)")
def broadcast(n: int, r: int, opts: Options) -> Program:
    """Inter-node broadcast among leaders (the root leads its node), then chains."""
    lay = _Layout(n, r, opts, root=opts.root)
    root_node = next(i for i, g in enumerate(lay.groups) if opts.root in g)
    sub = lay.sub(Collective.BROADCAST, opts.channels, root_node)
    where = {b: _Place(b) for b in Buf}
    inter = _embed(sub, lay.leaders, where) if lay.pos == 0 else [[] for _ in sub.channels]
    chans = []
    for ch, steps in zip(sub.channels, inter):
        down = [lay.chain_down(out(a, c)) for a, c in _touched(ch)]
        chans.append(steps + [s for s in down if s is not None])
    return _program(Collective.BROADCAST, n, r, sub.chunks, chans, lay, root=opts.root,
                    scratch=sub.scratch)


def _one_chunk_sub(lay: _Layout, coll: Collective) -> Program:
    sub = lay.sub(coll, 1)
    if sub.chunks != 1:
        raise ValueError(f"hierarchical {coll.value} needs a one-chunk inter-node algorithm; "
                         f"{lay.inter!r} uses {sub.chunks} chunks per block")
    return sub


@register(Collective.ALL_GATHER, "hierarchical",
          cost="(m−1)(α_i + n/p·β_i) + T_inter(n) + (m−1+s−1)(α_i + n/s·β_i)",
          sized=_sized(PIECE_BYTES))
def all_gather(n: int, r: int, opts: Options) -> Program:
    """Gather to the leader, inter-node all-gather of superblocks, chain-broadcast."""
    lay = _Layout(n, r, opts)
    if lay.M == 1:                                 # one rank per node: the flat algorithm
        sub = _one_chunk_sub(lay, Collective.ALL_GATHER)
        chans = _embed(sub, lay.leaders, {b: _Place(b) for b in Buf})
        return _program(Collective.ALL_GATHER, n, r, 1, chans, lay, scratch=sub.scratch)
    sub = _one_chunk_sub(lay, Collective.ALL_GATHER)
    from ringtree.schedules.hierarchical_blocks import per_block, pieced_all_gather
    if int(opts.param("pieces", 1)) > 1 and sub.in_place_ok \
            and per_block(lay, n, Collective.ALL_GATHER):
        return pieced_all_gather(n, r, lay, sub)
    M, L, leader = lay.M, lay.L, lay.pos == 0
    steps: list[Step] = []
    scratch = 0
    if not leader:
        steps.append(ir.send(lay.chain[0], inp(0)))
    else:
        direct = lay.identity(n) and sub.in_place_ok
        if direct:   # superblocks are the output itself
            blocks, stage, scratch = _Place(Buf.OUTPUT, 0, M), lay.node * M, 0
            where = {Buf.INPUT: _Place(Buf.OUTPUT, stage, M), Buf.OUTPUT: blocks,
                     Buf.SCRATCH: _Place(Buf.SCRATCH, 0, M)}
            home = Buf.OUTPUT
        else:        # superblocks in scratch [0, LM), own staged at [LM, LM+M)
            stage, scratch = L * M, L * M + M + sub.scratch * M
            where = {Buf.INPUT: _Place(Buf.SCRATCH, stage, M),
                     Buf.OUTPUT: _Place(Buf.SCRATCH, 0, M),
                     Buf.SCRATCH: _Place(Buf.SCRATCH, L * M + M, M)}
            home = Buf.SCRATCH
        steps.append(copy(inp(0), Ref(home, stage)))
        steps += [ir.recv(q, Ref(home, stage + i)) for i, q in enumerate(lay.chain) if i]
        steps += [copy(inp(0), Ref(home, stage + i)) for i in range(len(lay.chain), M)]
        steps += _embed(sub, lay.leaders, where)[0]
        if not direct:
            pairs = [(q, lay.slot(q)) for q in range(n)]
            i = 0
            while i < n:                           # unpack runs of consecutive slots
                j = i + 1
                while j < n and pairs[j][1] == pairs[i][1] + (j - i):
                    j += 1
                steps.append(copy(scr(pairs[i][1], j - i), out(i, j - i)))
                i = j
    if lay.identity(n):  # each superblock down the chain once it is final: own first
        order = [lay.node] + [b for b in _first_use(sub.channels[0], Buf.OUTPUT, last=True)
                              if b != lay.node]
        downs = [lay.chain_down(out(b * M, M)) for b in order]
    else:
        downs = [lay.chain_down(out(0, n))]
    steps += [d for d in downs if d is not None]
    return _program(Collective.ALL_GATHER, n, r, 1, [steps], lay, scratch=scratch)


@register(Collective.REDUCE_SCATTER, "hierarchical",
          cost="(m−1+s−1)(α_i + n/s·β_i) + (m−1)·n·γ + T_inter(n) + (m−1)(α_i + n/p·β_i)",
          sized=_sized(PIECE_BYTES), fill=_reduce_scatter_fill)
def reduce_scatter(n: int, r: int, opts: Options) -> Program:
    """Chain-reduce the input to the leader, inter-node reduce-scatter of superblocks,
    scatter the node's blocks from the leader."""
    lay = _Layout(n, r, opts)
    sub = _one_chunk_sub(lay, Collective.REDUCE_SCATTER)
    if lay.M == 1:
        chans = _embed(sub, lay.leaders, {b: _Place(b) for b in Buf})
        return _program(Collective.REDUCE_SCATTER, n, r, 1, chans, lay, scratch=sub.scratch)
    from ringtree.schedules.hierarchical_blocks import per_block, pieced_reduce_scatter
    pieces = int(opts.param("pieces", 1))
    if pieces > 1 and per_block(lay, n, Collective.REDUCE_SCATTER):
        return pieced_reduce_scatter(n, r, lay, sub, pieces)
    M, L, leader = lay.M, lay.L, lay.pos == 0
    res = L * M                                    # scratch: [0, LM) superblocks, then result
    scratch = res + M + sub.scratch * M
    steps: list[Step] = []
    slots = sorted((lay.slot(q), q) for q in range(n))
    first = {b: k for k, b in enumerate(_first_use(sub.channels[0], Buf.INPUT))}
    runs: list[tuple[int, int, int]] = []          # (slot, rank, length)
    for sl, q in slots:                            # runs of consecutive ranks and slots,
        if runs and (runs[-1][0] + runs[-1][2], runs[-1][1] + runs[-1][2]) == (sl, q) \
                and sl % M:                        # one superblock each
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((sl, q, 1))
    # chain-reduce the superblocks in the order the leaders' link first needs them
    for sl, q, ln in sorted(runs, key=lambda t: (first.get(t[0] // M, L), t[0])):
        s = lay.chain_up(inp(q, ln), scr(sl, ln))
        if s is not None:
            steps.append(s)
    if leader:
        used = {sl for sl, _ in slots}
        steps += [copy(inp(0), scr(sl)) for sl in range(L * M) if sl not in used]  # padding
        where = {Buf.INPUT: _Place(Buf.SCRATCH, 0, M), Buf.OUTPUT: _Place(Buf.SCRATCH, res, M),
                 Buf.SCRATCH: _Place(Buf.SCRATCH, res + M, M)}
        steps += _embed(sub, lay.leaders, where)[0]
        steps.append(copy(scr(res), out(0)))
        steps += [ir.send(q, scr(res + i)) for i, q in enumerate(lay.chain) if i]
    else:
        steps.append(ir.recv(lay.chain[0], out(0)))
    return _program(Collective.REDUCE_SCATTER, n, r, 1, [steps], lay,
                    scratch=scratch if leader else 0)
