"""CollNet beyond all-reduce: broadcast and all-gather as switch multicasts, reduce-scatter
as per-owner in-network reductions (SHARP's multicast offload, ``SHARP_COLL_ENABLE_MCAST``,
and NCCL's CollNet AllGather / ReduceScatter).

Every rank is a member of the switch groups (a flat tree: one virtual rank per part and
role). A virtual rank's Program is one step per channel:

- ``broadcast`` (root R): ``v`` receives the root's part and sends it to every other rank.
  Per rank: the root sends its input once; every other rank receives once. Bytes per
  host link: n up at the root and n down elsewhere, one switch hop after another,
  whatever the number of hosts (a ring's chain is p − 1 hops).
- ``all_gather``: one virtual rank per (part, owner b): it receives b's block and
  multicasts it to the others. Per rank: its block up once, the p − 1 others down, in
  two hops (a ring needs p − 1 steps).
- ``reduce_scatter``: one virtual rank per (part, owner b): it reduces everybody's block
  b in member order and sends the result to b only. Per rank: everything up (n bytes),
  its block down (n/p). The reduction leaves the hosts, but a rank sends p/(p − 1) times
  what a ring sends: the switch helps where reducing, not sending, is the bottleneck.

The executor meets these virtual ranks through the CollNet transport, which gives every
(virtual rank, collective, root) its own switch group, so that within a group each rank
always sends and receives, only sends (its result comes back as DONE), or only receives
(it checks in without data), and the switch's slots stay clocked by every member.
On one host (or one rank) nothing reaches a switch: the host's direct and ring schedules
run under this name.

Costs (n bytes of the collective's result, p ranks, one switch hop h): broadcast and
all-gather ≈ 2α + 2h + n·β; reduce-scatter ≈ 2α + 2h + n·β up, n/p·β down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, Step, inp, out, scr
from ringtree.schedules import direct, ring
from ringtree.schedules.registry import Options, register
from ringtree.schedules.tree_wiring import node_groups

ALGO = "collnet_direct"


def _switch(coll: Collective, n: int, v: int, channel: int, k: int, step: Step) -> Program:
    chans = tuple(() for _ in range(channel)) + ((step,),)
    return Program(coll, ALGO, n, v, k, chans, scratch=k,
                   meta={"virtual": "switch", "members": tuple(range(n)), "tree": channel})


def _on_host(n: int, opts: Options) -> bool:
    return n == 1 or len(node_groups(n, opts.nodes)) == 1


@register(Collective.BROADCAST, ALGO, cost="2α + 2h + n·β (h: the switch's hop)",
          switch=True)
def broadcast(n: int, r: int, opts: Options) -> Program:
    """The root sends each part to its switch; the switch multicasts it to the rest."""
    if _on_host(n, opts):
        return replace(ring.broadcast(n, r, opts), algo=ALGO)
    k, root = opts.channels, opts.root
    others = tuple(q for q in range(n) if q != root)
    virtual = tuple(_switch(Collective.BROADCAST, n, n + c, c, k,
                            Step(dst=scr(c), recv_from=(root,), send_to=others))
                    for c in range(k))
    chans = tuple((Step(src=inp(c), dst=out(c), send_to=(n + c,)),) if r == root else
                  (ir.recv(n + c, out(c)),) for c in range(k))
    return Program(Collective.BROADCAST, ALGO, n, r, k, chans, root=root,
                   meta={"virtual_programs": virtual})


def _owner(n: int, c: int, b: int) -> int:
    """The virtual rank of owner ``b``'s switch group in part ``c``: n + c·n + b."""
    return n + c * n + b


def _per_owner(coll: Collective, n: int, r: int, opts: Options,
               channel: Callable[[int], list[Step]], on_host: Callable[..., Program]) -> Program:
    """The member program whose part c runs ``channel(c)`` against one switch group per
    owner (:func:`_owner_switches`); on one host, ``on_host``'s schedule under this name."""
    if _on_host(n, opts):
        return replace(on_host(n, r, opts), algo=ALGO)
    k = opts.channels
    return Program(coll, ALGO, n, r, k, tuple(tuple(channel(c)) for c in range(k)),
                   meta={"virtual_programs": _owner_switches(
                       coll, n, k, coll is Collective.REDUCE_SCATTER)})


def _owner_switches(coll: Collective, n: int, k: int, reduce: bool) -> tuple[Program, ...]:
    progs = []
    for c in range(k):
        for b in range(n):
            others = tuple(q for q in range(n) if q != b)
            step = Step(dst=scr(c), recv_from=tuple(range(n)), send_to=(b,), reduce=True) \
                if reduce else Step(dst=scr(c), recv_from=(b,), send_to=others)
            progs.append(_switch(coll, n, _owner(n, c, b), c, k, step))
    return tuple(progs)


@register(Collective.ALL_GATHER, ALGO, cost="2α + 2h + n·β (n = gathered bytes)", switch=True)
def all_gather(n: int, r: int, opts: Options) -> Program:
    """Each rank's block goes to its own switch group, which multicasts it."""
    k = opts.channels

    def channel(c: int) -> list[Step]:
        gathered = [ir.recv(_owner(n, c, q), out(q * k + c)) for q in range(n) if q != r]
        return [Step(src=inp(c), dst=out(r * k + c), send_to=(_owner(n, c, r),)), *gathered]

    return _per_owner(Collective.ALL_GATHER, n, r, opts, channel, direct.all_gather)


@register(Collective.REDUCE_SCATTER, ALGO,
          cost="2α + 2h + n·β up + n/p·β down (n = input bytes)",
          switch=True)
def reduce_scatter(n: int, r: int, opts: Options) -> Program:
    """Block b of every rank goes to b's switch group, which reduces and returns it to b."""
    k = opts.channels

    def channel(c: int) -> list[Step]:
        return [*(ir.send(_owner(n, c, b), inp(b * k + c)) for b in range(n)),
                ir.recv(_owner(n, c, r), out(c))]

    return _per_owner(Collective.REDUCE_SCATTER, n, r, opts, channel, direct.reduce_scatter)
