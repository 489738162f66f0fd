"""Tree algorithms: NCCL's double binary tree all-reduce, and pipelined binary-tree
broadcast and reduce.

All-reduce (``src/device/all_reduce.h``): the data is cut in two halves, one per tree of
:func:`~ringtree.schedules.tree_wiring.nccl_trees` (NCCL duplicates its channels: channel c
uses tree 0, channel c + nChannels tree 1). On each tree every rank reduces what its
children send into its input and passes the partial sum up (``recvReduceSend``); the root
reduces, stores and sends the result straight back down (``recvReduceCopySend``), and the
rest forward it (``recvCopySend``) to the leaves (``recv``). The result is computed once, at
the root, so every rank gets the same bits. Each half is cut into ``pipeline`` chunks
(param, default 2); the executor further slices each step.

- ``tree``: NCCL's split mode (``runTreeSplit``), where reduce-up and broadcast-down run
  concurrently. A step cannot span two IR channels (the root's fused step receives from
  and sends to the same peers), so the split is expressed by issue order on one channel:
  all up-steps, then all down-steps; the executor, which waits only on memory conflicts,
  overlaps the broadcast of chunk i with the reduction of chunk i+1.
- ``tree_updown``: ``runTreeUpDown``, up then down per chunk.

Placement: ``Options.nodes`` places ranks on nodes; each node is a chain and the nodes form
NCCL's inter-node double binary tree, attached per ``params["pattern"]`` (``tree``,
``split_tree``, ``balanced_tree`` = default). ``nodes=None`` is one node, i.e. a chain,
exactly as NCCL; ``params["flat"] = True`` makes every rank its own node (a double binary
tree over ranks).

Costs (Sanders, Speck & Träff 2009; NCCL 2.4), p ranks, n bytes, d = tree depth
(⌈lg p⌉ with one rank per node, ppn − 1 + lg(nodes) in general), s pipeline slices:
- all-reduce, ``tree``/``tree_updown``: 2(d + s − 1)·α + 2·n·β + n·γ (each rank sends
  ≈ n up and n down, half on each tree — nccl#457: "for tree it would be 2*S"; an
  interior rank reduces its two children's halves; pipeline fill ignored).
- broadcast / reduce, ``tree`` (one binary tree from the root, s slices):
  (d + s − 1)·(α + 2·n/s·β) (+ 2·n/s·γ per slice for reduce); interior ranks send twice.
"""

from __future__ import annotations

from functools import lru_cache

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, Ref, Step, copy, inp, out
from ringtree.schedules.registry import Options, register
from ringtree.schedules.tree_wiring import TreeRank, nccl_trees, rooted_btree


def _pipeline(opts: Options) -> int:
    c = int(opts.param("pipeline", 2))
    if c < 1:
        raise ValueError(f"pipeline must be >= 1, got {c}")
    return c


def double_tree(n: int, opts: Options) -> tuple[list[TreeRank], list[TreeRank]]:
    """The two trees the all-reduce runs on, from ``opts.nodes`` and the params."""
    nodes = tuple(range(n)) if opts.param("flat", False) else opts.nodes
    return nccl_trees(n, nodes, str(opts.param("pattern", "balanced_tree")))


@lru_cache(maxsize=8)
def _refs(chunks: int) -> tuple[tuple[Ref, ...], tuple[Ref, ...]]:
    """inp(j) and out(j) of every chunk, made once (Refs are immutable): every rank's
    generator names the same ones, which matters when a simulator builds 100,000."""
    return tuple(inp(j) for j in range(chunks)), tuple(out(j) for j in range(chunks))


def _up(me: TreeRank, i: Ref, o: Ref) -> Step:
    """Reduce chunk i towards the root; the root stores it (o) and starts the broadcast."""
    if me.up == -1:
        if not me.down:
            return copy(i, o)
        return Step(src=i, dst=o, recv_from=me.down, send_to=me.down, reduce=True)
    if not me.down:
        return ir.send(me.up, i)
    return Step(src=i, recv_from=me.down, send_to=(me.up,), reduce=True)


def _down(me: TreeRank, o: Ref) -> Step | None:
    """Receive the result of chunk o from the parent and forward it to the children."""
    if me.up == -1:
        return None
    return Step(dst=o, recv_from=(me.up,), send_to=me.down)


def _all_reduce(n: int, r: int, opts: Options, algo: str, split: bool) -> Program:
    k, c = opts.channels, _pipeline(opts)
    trees = double_tree(n, opts)
    ins, outs = _refs(2 * k * c)
    channels = []
    for t in range(2):
        me = trees[t][r]
        for ch in range(k):
            chunks = range((t * k + ch) * c, (t * k + ch + 1) * c)
            ups = [_up(me, ins[j], outs[j]) for j in chunks]
            downs = [_down(me, outs[j]) for j in chunks]
            if split:
                steps = ups + [s for s in downs if s is not None]
            else:
                steps = [s for pair in zip(ups, downs) for s in pair if s is not None]
            channels.append(tuple(steps))
    return Program(Collective.ALL_REDUCE, algo, n, r, 2 * k * c, tuple(channels),
                   meta={"trees": trees})


@register(Collective.ALL_REDUCE, "tree",
          cost="2(d + s − 1)·α + 2·n·β + n·γ (d = tree depth, s = slices)")
def all_reduce(n: int, r: int, opts: Options) -> Program:
    """Double binary tree, split mode: all reduce-up steps, then all broadcast-down steps."""
    return _all_reduce(n, r, opts, "tree", split=True)


@register(Collective.ALL_REDUCE, "tree_updown",
          cost="2(d + s − 1)·α + 2·n·β + n·γ (d = tree depth, s = slices)")
def all_reduce_updown(n: int, r: int, opts: Options) -> Program:
    """Double binary tree, up-down mode: reduce then broadcast, chunk after chunk."""
    return _all_reduce(n, r, opts, "tree_updown", split=False)


def _rooted(coll: Collective, n: int, r: int, opts: Options) -> Program:
    k, c = opts.channels, _pipeline(opts)
    me = rooted_btree(n, opts.root)[r]
    channels = []
    for ch in range(k):
        steps: list[Step] = []
        for j in range(ch * c, (ch + 1) * c):
            if coll is Collective.BROADCAST:
                if me.up == -1:
                    steps.append(Step(src=inp(j), dst=out(j), send_to=me.down))
                else:
                    steps.append(Step(dst=out(j), recv_from=(me.up,), send_to=me.down))
            elif me.up == -1:
                steps.append(Step(src=inp(j), dst=out(j), recv_from=me.down,
                                  reduce=bool(me.down)))
            elif not me.down:
                steps.append(ir.send(me.up, inp(j)))
            else:
                steps.append(Step(src=inp(j), recv_from=me.down, send_to=(me.up,),
                                  reduce=True))
        channels.append(tuple(steps))
    return Program(coll, "tree", n, r, k * c, tuple(channels), root=opts.root)


@register(Collective.BROADCAST, "tree", cost="(d + s − 1)·(α + 2·n/s·β)")
def broadcast(n: int, r: int, opts: Options) -> Program:
    """Pipelined binary tree from the root (NCCL's btree relabelled to start at root)."""
    return _rooted(Collective.BROADCAST, n, r, opts)


@register(Collective.REDUCE, "tree", cost="(d + s − 1)·(α + 2·n/s·β + 2·n/s·γ)")
def reduce(n: int, r: int, opts: Options) -> Program:
    """Pipelined binary tree into the root, reducing children into the input on the way."""
    return _rooted(Collective.REDUCE, n, r, opts)
