"""Hierarchical all-gather and reduce-scatter block by block (``params["pieces"]`` > 1,
contiguous equal nodes, an inter-node program of single chunks): the leaders run one copy
of the inter-node program per block of the superblocks (per chunk of them, for a
reduce-scatter in P chunks per block), interleaved step-major, so each piece goes through
the chain and over the link without waiting for the rest of its superblock.

Reduce-scatter, p ranks on L nodes of m ranks, n bytes, P pieces: the link waits for the
chain reduce of the first n/(L·m·P) bytes and the last piece's result follows it by one
shared-memory send of n/(L·m·P) bytes, instead of a whole n/(L·m) block each way. Every
element is reduced in the same order as without pieces (chain last → leader, then the
inter-node program), so the result is bitwise the same.
"""

from __future__ import annotations

from collections.abc import Callable

from ringtree.ir import program as ir
from ringtree.ir.program import Buf, Collective, Program, Step, copy, inp, out, scr
from ringtree.schedules.hierarchical import (
    _embed,
    _first_use,
    _interleave,
    _Layout,
    _Place,
    _program,
)
from ringtree.schedules.registry import Options, generate_all


def per_block(lay: _Layout, n: int, coll: Collective) -> bool:
    """The inter-node program can run block by block: contiguous equal nodes, and every
    leader's program touches single chunks (the same answer on every rank)."""
    if not lay.identity(n):
        return False
    o = Options(channels=1, nodes=tuple(range(lay.L)), params=lay.sub_params)
    return all(x is None or x.count == 1
               for p in generate_all(coll, lay.inter, lay.L, o) for ch in p.channels
               for s in ch for x in (s.src, s.dst))


def reduce_scatter_pieces(n: int, opts: Options) -> int:
    """The pieces a hierarchical reduce-scatter over n ranks cuts each superblock into
    (M ranks per node times P = ``pieces``) when it runs block by block, else 0."""
    pieces = int(opts.param("pieces", 1))
    if pieces <= 1:
        return 0
    lay = _Layout(n, 0, opts)
    return lay.M * pieces if lay.M > 1 and per_block(lay, n, Collective.REDUCE_SCATTER) else 0


def _copies(sub: Program, lay: _Layout, k: int,
            places: Callable[[int], dict[Buf, _Place]]) -> list[Step]:
    """k copies of the inter-node program, copy c on piece c of every superblock
    (``places(c)``), interleaved step-major: the link carries piece 0 of a superblock,
    then piece 1, ..., and each piece's intra-host work waits for that piece only."""
    return _interleave([_embed(sub, lay.leaders, places(c))[0] for c in range(k)])


def pieced_reduce_scatter(n: int, r: int, lay: _Layout, sub: Program, pieces: int) -> Program:
    """Reduce-scatter in M·P pieces (M ranks per node, P = ``pieces`` chunks per block):
    the chain reduces piece by piece in link order, the leaders' reduce-scatter runs per
    piece (:func:`_copies`) and each piece of a rank's result leaves the leader once it
    is final."""
    M, L, P, leader = lay.M, lay.L, pieces, lay.pos == 0
    k = M * P                                      # pieces per superblock
    res = L * k                                    # scratch chunks: superblocks, result, sub's
    order = _first_use(sub.channels[0], Buf.INPUT)
    steps = [lay.chain_up(inp(b * k + c), scr(b * k + c))
             for b in order + [b for b in range(L) if b not in order] for c in range(k)]
    chain = [s for s in steps if s is not None]
    if not leader:
        return _program(Collective.REDUCE_SCATTER, n, r, P,
                        [chain + [ir.recv(lay.chain[0], out(j)) for j in range(P)]], lay)
    chain += _copies(sub, lay, k, lambda c: {
        Buf.INPUT: _Place(Buf.SCRATCH, c, stride=k),
        Buf.OUTPUT: _Place(Buf.SCRATCH, res + c, stride=1),
        Buf.SCRATCH: _Place(Buf.SCRATCH, res + k + c * sub.scratch, stride=1)})
    chain += [copy(scr(res + j), out(j)) for j in range(P)]
    chain += [ir.send(q, scr(res + i * P + j)) for i, q in enumerate(lay.chain) if i
              for j in range(P)]
    return _program(Collective.REDUCE_SCATTER, n, r, P, [chain], lay,
                    scratch=res + k + sub.scratch * k)


def pieced_all_gather(n: int, r: int, lay: _Layout, sub: Program) -> Program:
    """All-gather with ``pieces``: the leaders' all-gather runs per block
    (:func:`_copies`) in the output, each block leaves the leader as soon as it has
    arrived, and the chains broadcast block by block, the node's own first."""
    M, leader, stage = lay.M, lay.pos == 0, lay.node * lay.M
    steps: list[Step] = []
    if not leader:
        steps.append(ir.send(lay.chain[0], inp(0)))
    else:
        steps.append(copy(inp(0), out(stage)))
        steps += [ir.recv(q, out(stage + i)) for i, q in enumerate(lay.chain) if i]
        steps += _copies(sub, lay, M, lambda j: {
            Buf.INPUT: _Place(Buf.OUTPUT, stage + j, stride=1),
            Buf.OUTPUT: _Place(Buf.OUTPUT, j, stride=M),
            Buf.SCRATCH: _Place(Buf.SCRATCH, j * sub.scratch, stride=1)})
    order = [lay.node] + [b for b in _first_use(sub.channels[0], Buf.OUTPUT, last=True)
                          if b != lay.node]
    downs = [lay.chain_down(out(b * M + j)) for b in order for j in range(M)]
    steps += [d for d in downs if d is not None]
    return _program(Collective.ALL_GATHER, n, r, 1, [steps], lay,
                    scratch=M * sub.scratch if leader else 0)
