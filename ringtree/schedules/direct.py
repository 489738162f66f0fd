"""Direct (one-shot and two-shot) algorithms: every rank exchanges with every rank at once.
One round of messages, so the latency is one α however many ranks there are — what small
messages over shared memory reward (NCCL's one-shot/two-shot all-reduce for NVLS and
TensorRT-LLM's custom all-reduce follow the same idea).

Determinism: a reduction happens on several ranks only in ``direct`` all-reduce, and there
every rank reduces in rank order ((x0 ⊕ x1) ⊕ x2) ⊕ …, so all ranks get the same bits.
In place, the output is (part of) the input: the all-reduce sums in scratch and copies
out last; two-shot and reduce-scatter save the rank's own block in scratch first.

Costs, p ranks, n bytes:
- all-reduce, ``direct`` (one-shot: everyone sends everything to everyone, each rank
  reduces all p inputs): α + (p−1)·n·β + (p−1)·n·γ.
- all-reduce, ``direct2`` (two-shot: direct reduce-scatter, then direct all-gather):
  2α + 2(p−1)/p·n·β + (p−1)/p·n·γ.
- all-gather, ``direct``: α + (p−1)/p·n·β (n = gathered bytes).
- reduce-scatter, ``direct``: α + (p−1)/p·n·β + (p−1)/p·n·γ (n = input bytes).
- reduce, ``direct``: every rank sends its input to the root, which reduces the p inputs
  in rank order: α + (p−1)·n·β + (p−1)·n·γ at the root.
- broadcast, ``direct``: the root sends to every rank: α + (p−1)·n·β at the root.
- barrier, ``direct``: every rank signals every rank: α (with p−1 messages a rank).

These one-round schedules are the semantics of the LL protocol too
(:mod:`ringtree.runtime.protocols.ll`), which runs them through one shared segment: a
rank's "send to every rank" is one write to its area, a "receive from q" a read of q's.
Reduce, broadcast and barrier were added for it and are ``tuned=False``: Simple runs
them where named, as their costs over messages were never measured.

The β terms assume a rank can drive all its p − 1 connections at full rate; over one link
per rank they become (p−1) times the per-message cost.
"""

from __future__ import annotations

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, Ref, Step, copy, inp, out, scr
from ringtree.schedules.registry import Options, register


def _others(n: int, r: int) -> list[int]:
    """Every other rank, starting after r (so that not everybody hits rank 0 first)."""
    return [(r + i) % n for i in range(1, n)]


def _reduce_in_rank_order(n: int, r: int, mine: Ref, save: Ref, dst: Ref) -> list[Step]:
    """dst = ((x0 ⊕ x1) ⊕ x2) ⊕ … where x_q arrives from q and x_r is ``mine``.
    Rank r ≠ 0 first copies ``mine`` to ``save``: ``dst`` may alias it (in place)."""
    steps: list[Step] = []
    if r != 0:
        steps.append(copy(mine, save))
        mine = save
    steps.append(copy(mine, dst) if r == 0 else ir.recv(0, dst))
    for q in range(1, n):
        steps.append(ir.reduce(mine, dst) if q == r else ir.recv_reduce_copy(q, dst))
    return steps


@register(Collective.ALL_REDUCE, "direct", cost="α + (p−1)·n·β + (p−1)·n·γ")
def all_reduce(n: int, r: int, opts: Options) -> Program:
    """One-shot: send the input to every rank, reduce all inputs in rank order.

    The sum is built in scratch and copied out last: in place, the output is the input
    being sent, and a receive into it would wait for every send to drain first."""
    k = opts.channels
    channels = []
    for c in range(k):
        acc = scr(c)
        steps = [ir.send(q, inp(c)) for q in _others(n, r)]
        steps.append(copy(inp(c), acc) if r == 0 else ir.recv(0, acc))
        for q in range(1, n):
            steps.append(ir.reduce(inp(c), acc) if q == r else ir.recv_reduce_copy(q, acc))
        steps.append(copy(acc, out(c)))
        channels.append(tuple(steps))
    return Program(Collective.ALL_REDUCE, "direct", n, r, k, tuple(channels), scratch=k)


@register(Collective.ALL_REDUCE, "direct2", cost="2α + 2(p−1)/p·n·β + (p−1)/p·n·γ")
def all_reduce_two_shot(n: int, r: int, opts: Options) -> Program:
    """Two-shot: rank r reduces chunk r of everybody's input, then sends it to everybody."""
    k = opts.channels
    channels = []
    for c in range(k):
        base = c * n
        mine = base + r
        steps = [ir.send(q, inp(base + q)) for q in _others(n, r)]
        steps += _reduce_in_rank_order(n, r, inp(mine), scr(mine), out(mine))
        steps += [ir.send(q, out(mine)) for q in _others(n, r)]
        steps += [ir.recv(q, out(base + q)) for q in _others(n, r)]
        channels.append(tuple(steps))
    return Program(Collective.ALL_REDUCE, "direct2", n, r, n * k, tuple(channels),
                   scratch=n * k)


@register(Collective.ALL_GATHER, "direct", cost="α + (p−1)/p·n·β (n = gathered bytes)")
def all_gather(n: int, r: int, opts: Options) -> Program:
    """Send the input to every rank; receive every rank's block into its place."""
    k = opts.channels
    channels = []
    for c in range(k):
        steps: list[Step] = [copy(inp(c), out(r * k + c))]
        steps += [ir.send(q, inp(c)) for q in _others(n, r)]
        steps += [ir.recv(q, out(q * k + c)) for q in _others(n, r)]
        channels.append(tuple(steps))
    return Program(Collective.ALL_GATHER, "direct", n, r, k, tuple(channels))


@register(Collective.REDUCE_SCATTER, "direct",
          cost="α + (p−1)/p·n·β + (p−1)/p·n·γ (n = input bytes)")
def reduce_scatter(n: int, r: int, opts: Options) -> Program:
    """Send block q to rank q; reduce the p copies of block r in rank order."""
    k = opts.channels
    channels = []
    for c in range(k):
        steps = [ir.send(q, inp(q * k + c)) for q in _others(n, r)]
        steps += _reduce_in_rank_order(n, r, inp(r * k + c), scr(c), out(c))
        channels.append(tuple(steps))
    return Program(Collective.REDUCE_SCATTER, "direct", n, r, k, tuple(channels), scratch=k)


@register(Collective.REDUCE, "direct", cost="α + (p−1)·n·β + (p−1)·n·γ at the root",
          tuned=False)
def reduce(n: int, r: int, opts: Options) -> Program:
    """Every rank sends its input to the root; the root reduces in rank order."""
    root = opts.root
    if r != root:
        steps = [ir.send(root, inp(0))]
    elif n == 1:
        steps = [copy(inp(0), out(0))]
    else:
        steps = _reduce_in_rank_order(n, r, inp(0), scr(0), out(0))
    return Program(Collective.REDUCE, "direct", n, r, 1, (tuple(steps),), root=root, scratch=1)


@register(Collective.BROADCAST, "direct", cost="α + (p−1)·n·β at the root", tuned=False)
def broadcast(n: int, r: int, opts: Options) -> Program:
    """The root sends its buffer to every rank at once."""
    root = opts.root
    if r == root:
        step = Step(src=inp(0), dst=out(0), send_to=tuple(_others(n, r)))
    else:
        step = ir.recv(root, out(0))
    return Program(Collective.BROADCAST, "direct", n, r, 1, ((step,),), root=root)


@register(Collective.BARRIER, "direct", cost="α (p−1 messages a rank)", tuned=False)
def barrier(n: int, r: int, opts: Options) -> Program:
    """Every rank signals every rank, then waits for every rank's signal."""
    if n == 1:
        return Program(Collective.BARRIER, "direct", n, r, 1, ((),), scratch=1)
    others = tuple(_others(n, r))
    steps = (Step(src=scr(0), send_to=others),
             Step(src=scr(0), dst=scr(0), recv_from=others, reduce=True))
    return Program(Collective.BARRIER, "direct", n, r, 1, (steps,), scratch=1)
