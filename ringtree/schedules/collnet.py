"""CollNet all-reduce: in-network aggregation (SHArP) with NCCL's intra-node phases.

Each node's data goes up to aggregation switches, is reduced there once, and comes back
(NCCL ``CollNetDirect`` / ``CollNetChain``, ``src/device/all_reduce.h``,
``src/graph/connect.cc``). Inter-node traffic per GPU-NIC is n bytes each way instead of
a ring's 2(p−1)/p·n, and the latency is ≈ 2·(intra-node depth) + 2·(switch levels)
hops whatever the number of nodes (sjeaugey, NVIDIA/nccl#457: "for collnet … 2*S
intra-node and S inter-node").

**How switches appear in the IR.** The network is made of *virtual ranks* numbered from
``nranks`` up, like NCCL's ``collnetChain.up = nRanks``. Every real rank's Program lists
their Programs in ``meta["virtual_programs"]`` (``generate_all`` returns real ranks only).
A virtual rank's Program is ordinary IR: one step per part that receives from all its
children, reduces (a fixed order, so every rank gets identical bits), and sends the result
to its parent, or, at the root, back to all children; a second step multicasts what comes
down. Its ``meta`` says ``virtual="switch"``, its ``members`` (the ranks it aggregates,
real or virtual) and ``tree`` (the part it serves). Parts are carried on their own
channel on every rank, so a switch program has that channel only (others empty) and the
simulator can route part p through NIC p (``channel % nics``). The simulator places each
virtual rank on the reduction-capable switch that is the lowest common ancestor of its
members; the executor will run virtual ranks through a CollNet plugin (later issue).

Aggregation tree: ``params["collnet_fanin"] = k`` (from the topology: nodes per leaf
switch) gives two switch levels, one leaf aggregator per group of k nodes under a root;
0 or k ≥ nodes gives a single switch per part.

- ``collnet_direct``: H = min(ppn, ``params["collnet_heads"]`` or ppn) heads per node. The
  buffer is cut into ``channels × H`` parts; part p belongs to local head ``p % H``. Each
  rank sends part p to its head (scatter), the head reduces all local contributions and
  sends them up (``recvReduceSend``), receives the result and multicasts it to the
  node (``recvCopySend``), which receives it (gather).
- ``collnet_chain``: one part per channel; the node's ranks form a chain rotated by the
  channel, whose first rank talks to the network: reduce up the chain, up the switch
  tree, and broadcast back down the chain.

Cost (n bytes, m = ranks per node, B_i / B_e intra / inter bandwidth): direct ≈
2·α_i + 2·α_e·levels + n/H·(1/B_e) + 2·(m−1)/m·n/B_i; chain ≈ 2(m−1+s−1)(α_i + n/s·β_i)
+ 2·levels·α_e + n·β_e.
"""

from __future__ import annotations

from functools import lru_cache

from ringtree.ir.program import Collective, Program, Step, inp, out, scr
from ringtree.schedules.registry import Options, register
from ringtree.schedules.tree_wiring import node_groups


def _fanin(opts: Options, nnodes: int) -> int:
    k = int(opts.param("collnet_fanin", 0) or 0)
    return k if 0 < k < nnodes else 0


def _vrank(n: int, part: int, group: int, ngroups: int) -> int:
    """Virtual rank of (part, aggregator); ``group == ngroups`` is the part's root."""
    return n + part * (ngroups + 1) + group


def switch_tree(n: int, heads: list[int], part: int, parts: int, fanin: int
                 ) -> tuple[list[int], list]:
    """For one part: the up-peer of every head, and the switch Programs' step lists."""
    nnodes = len(heads)
    groups = [heads[i:i + fanin] for i in range(0, nnodes, fanin)] if fanin else [heads]
    ng = len(groups) if fanin else 0
    root = _vrank(n, part, ng, ng)
    up: list[int] = []
    progs: list[tuple[int, list[Step], tuple[int, ...]]] = []
    leaves = []
    for g, members in enumerate(groups if fanin else []):
        v = _vrank(n, part, g, ng)
        leaves.append(v)
        up += [v] * len(members)
        mem = tuple(members)
        reduce = len(mem) > 1
        progs.append((v, [Step(dst=scr(part), recv_from=mem, send_to=(root,), reduce=reduce),
                          Step(dst=scr(parts + part), recv_from=(root,), send_to=mem)], mem))
    children = tuple(leaves) if fanin else tuple(heads)
    if not fanin:
        up = [root] * len(heads)
    progs.append((root, [Step(dst=scr(part), recv_from=children, send_to=children,
                              reduce=len(children) > 1)], children))
    return up, progs


def switch_programs(algo: str, n: int, base: int, heads: list[int], part: int, parts: int,
                    fanin: int) -> tuple[dict[int, int], list[Program]]:
    """One part's aggregation tree over ``heads`` (one rank per node), its switches
    numbered from ``base``: every head's up-peer, and the switches' Programs."""
    ups, progs = switch_tree(base, heads, part, parts, fanin)
    out = []
    for v, steps, members in progs:
        chans = tuple(() for _ in range(part)) + (tuple(steps),)
        out.append(Program(Collective.ALL_REDUCE, algo, n, v, parts, chans,
                           scratch=2 * parts,
                           meta={"virtual": "switch", "members": members, "tree": part}))
    return dict(zip(heads, ups)), out


@lru_cache(maxsize=64)
def _plan(algo: str, n: int, opts: Options) -> tuple[list[list[int]], int, tuple, dict]:
    """Node groups, parts, virtual Programs and each head's up-peer for every part."""
    groups = node_groups(n, opts.nodes)
    ppn = min(len(g) for g in groups)
    if algo == "collnet_direct":
        h = int(opts.param("collnet_heads", 0) or ppn)
        heads_per_node = max(1, min(h, ppn))
    else:
        heads_per_node = 1
    parts = opts.channels * heads_per_node
    up: dict[tuple[int, int], int] = {}
    virtual: list[Program] = []
    if len(groups) > 1:
        fanin = _fanin(opts, len(groups))
        for p in range(parts):
            heads = [_head(algo, g, p, heads_per_node) for g in groups]
            ups, progs = switch_programs(algo, n, n, heads, p, parts, fanin)
            up.update({(hd, p): u for hd, u in ups.items()})
            virtual += progs
    virtual.sort(key=lambda q: q.rank)
    where = {q: g for g in groups for q in g}
    return groups, parts, tuple(virtual), {"up": up, "hpn": heads_per_node, "where": where}


def _head(algo: str, group: list[int], part: int, hpn: int) -> int:
    if algo == "collnet_direct":
        return group[part % hpn]
    return group[part % len(group)]


def _direct(n: int, r: int, opts: Options) -> Program:
    groups, parts, virtual, plan = _plan("collnet_direct", n, opts)
    group = plan["where"][r]
    hpn = plan["hpn"]
    multi = len(groups) > 1
    chans = []
    for p in range(parts):
        head = group[p % hpn]
        if r != head:
            chans.append((Step(src=inp(p), send_to=(head,)), Step(dst=out(p), recv_from=(head,))))
            continue
        others = tuple(q for q in group if q != head)
        if not multi:
            chans.append((Step(src=inp(p), dst=out(p), recv_from=others, send_to=others,
                               reduce=bool(others)),))
            continue
        u = plan["up"][(head, p)]
        chans.append((Step(src=inp(p), recv_from=others, send_to=(u,), reduce=bool(others)),
                      Step(dst=out(p), recv_from=(u,), send_to=others)))
    return Program(Collective.ALL_REDUCE, "collnet_direct", n, r, parts, tuple(chans),
                   meta={"virtual_programs": virtual})


def _chain(n: int, r: int, opts: Options) -> Program:
    groups, parts, virtual, plan = _plan("collnet_chain", n, opts)
    group = plan["where"][r]
    multi = len(groups) > 1
    chans = []
    for p in range(parts):
        k = p % len(group)
        chain = group[k:] + group[:k]
        pos = chain.index(r)
        below = (chain[pos + 1],) if pos + 1 < len(chain) else ()
        if pos > 0:
            above = chain[pos - 1]
            upstep = Step(src=inp(p), recv_from=below, send_to=(above,), reduce=bool(below))
            down = Step(dst=out(p), recv_from=(above,), send_to=below)
            chans.append((upstep, down))
        elif multi:
            u = plan["up"][(r, p)]
            chans.append((Step(src=inp(p), recv_from=below, send_to=(u,), reduce=bool(below)),
                          Step(dst=out(p), recv_from=(u,), send_to=below)))
        else:
            chans.append((Step(src=inp(p), dst=out(p), recv_from=below, send_to=below,
                               reduce=bool(below)),))
    return Program(Collective.ALL_REDUCE, "collnet_chain", n, r, parts, tuple(chans),
                   meta={"virtual_programs": virtual})


@register(Collective.ALL_REDUCE, "collnet_direct",
          cost="2·α_i + 2·levels·α_e + n/H·β_e + 2(m−1)/m·n·β_i",
          switch=True)
def all_reduce_direct(n: int, r: int, opts: Options) -> Program:
    """CollNetDirect: scatter to the node's heads, in-network all-reduce, gather."""
    return _direct(n, r, opts)


@register(Collective.ALL_REDUCE, "collnet_chain",
          cost="2(m−1+s−1)(α_i + n/s·β_i) + 2·levels·α_e + n·β_e",
          switch=True)
def all_reduce_chain(n: int, r: int, opts: Options) -> Program:
    """CollNetChain: reduce up the node chain, in-network all-reduce, broadcast down."""
    return _chain(n, r, opts)
