"""The simple schedules every collective library starts with.

- gather / scatter, ``direct``: the root exchanges one block with every rank, all
  concurrently — (p−1)·α + (p−1)/p·n·β at the root.
- all-to-all, ``pairwise``: in round i rank r sends block r+i to r+i and receives block
  r−i from r−i (Thakur et al. 2005, §4.6): (p−1)·α + (p−1)/p·n·β.
- barrier, ``dissemination``: in round k rank r signals r+2^k and waits for r−2^k
  (Hensgen, Finkel & Manber 1988): ⌈lg p⌉·α.
"""

from __future__ import annotations

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, copy, inp, out, scr
from ringtree.schedules.registry import Options, register


@register(Collective.GATHER, "direct",
          cost="(p−1)·α + (p−1)/p·n·β at the root (n = gathered bytes)")
def gather(n: int, r: int, opts: Options) -> Program:
    root = opts.root
    if r == root:
        steps = [copy(inp(0), out(root))]
        steps += [ir.recv(q, out(q)) for q in range(n) if q != root]
    else:
        steps = [ir.send(root, inp(0))]
    return Program(Collective.GATHER, "direct", n, r, 1, (tuple(steps),), root=root)


@register(Collective.SCATTER, "direct",
          cost="(p−1)·α + (p−1)/p·n·β at the root (n = scattered bytes)")
def scatter(n: int, r: int, opts: Options) -> Program:
    root = opts.root
    if r == root:
        steps = [ir.send(q, inp(q)) for q in range(n) if q != root]
        steps.append(copy(inp(root), out(0)))
    else:
        steps = [ir.recv(root, out(0))]
    return Program(Collective.SCATTER, "direct", n, r, 1, (tuple(steps),), root=root)


@register(Collective.ALL_TO_ALL, "pairwise",
          cost="(p−1)·α + (p−1)/p·n·β (n = bytes each rank sends)")
def all_to_all(n: int, r: int, opts: Options) -> Program:
    steps = [copy(inp(r), out(r))]
    for i in range(1, n):
        dst, src = (r + i) % n, (r - i) % n
        steps.append(ir.send(dst, inp(dst)))
        steps.append(ir.recv(src, out(src)))
    return Program(Collective.ALL_TO_ALL, "pairwise", n, r, 1, (tuple(steps),),
                   in_place_ok=False)


@register(Collective.BARRIER, "dissemination", cost="⌈lg p⌉·α")
def barrier(n: int, r: int, opts: Options) -> Program:
    """A one-chunk scratch token; each round ORs in what the partner knew."""
    steps = []
    dist = 1
    while dist < n:
        steps.append(ir.send((r + dist) % n, scr(0)))
        steps.append(ir.recv_reduce_copy((r - dist) % n, scr(0)))
        dist *= 2
    return Program(Collective.BARRIER, "dissemination", n, r, 1, (tuple(steps),), scratch=1)
