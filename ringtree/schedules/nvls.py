"""NVLink SHARP (NVLS): reductions inside the NVSwitch, alone or with InfiniBand SHARP or a
tree between nodes (NCCL ``NVLS`` and ``NVLSTree``, 2.17 / 2.18).

On Hopper NVSwitches a GPU reads a multicast address with ``multimem.ld_reduce``: the
switch pulls the addressed bytes from every GPU of the node, reduces them and returns the
sum to the reader; ``multimem.st`` writes once and the switch stores the bytes into every
GPU (NCCL ``ProtoSimple<…, MultimemSrcs, MultimemDsts>``, ``src/device/all_reduce.h``;
a maintainer confirmed that ``ld_reduce`` pulls from all GPUs, NVIDIA/nccl#828).

**How the NVSwitch appears in the IR.** As CollNet's network switches do
(:mod:`ringtree.schedules.collnet`): a *virtual rank* numbered from ``nranks`` up, listed
in every real Program's ``meta["virtual_programs"]``, with ``meta["domain"] = "nvlink"``
so that the simulator places it on the node's NVSwitch and never on a network switch.
The buffer is cut into ``channels × ppn`` parts; part p belongs to local rank
``p % ppn`` of each node, its *head*. For part p of node k the NVSwitch rank runs:

1. ``ld_reduce``: receive part p from every local rank, reduce (member order, so every
   rank gets the same bits), send the sum to the head;
2. ``st``: receive the finished part from the head and multicast it to the others.

On one node the two are merged: the NVSwitch multicasts the sum to every GPU at once.
The head's round trip (its ``ld_reduce`` result in, its ``st`` out: n/m more bytes each
way) is left out of the schedule because the simulator issues sends without
back-pressure, so a head's ``st`` would queue behind all of its contributions on its
NVLink and the two directions would not overlap as NCCL's chunked loop makes them; the
simulator charges those bytes instead by pricing NVLS's NVLink at m/(m+1) of its rate
(:mod:`ringtree.sim.machine.protocols`). Between nodes the head owns the node's sum: with
``nvls`` across nodes the head sends it up an InfiniBand SHARP switch tree (the same
switch Programs as CollNetDirect, NCCL's multi-node NVLS runs over CollNet); with
``nvls_tree`` the heads of part p run a reduce/broadcast over NCCL's double binary tree
of nodes (``ncclGetDtree``; even parts on tree 0, odd on tree 1, as NCCL doubles its
channels). Per GPU and n bytes: ≈ n(m+1)/m out and in over NVLink, n/m over the network
for the heads (m GPUs per node).

``all_gather`` and ``reduce_scatter`` (NCCL runs them on NVLS too, ``generate.py``): one
NVSwitch rank per (channel, owner) multicasts the owner's block (``st``) or reduces every
rank's copy of it and returns it to the owner (``ld_reduce``). Across nodes NCCL needs a
CollNet plugin's ``iallgather`` / ``ireducescatter`` for them; that is not built here,
so they refuse more than one node.
"""

from __future__ import annotations

from functools import lru_cache

from ringtree.ir.program import Collective, Program, Step, inp, out, scr
from ringtree.schedules.collnet import switch_programs
from ringtree.schedules.registry import Options, register
from ringtree.schedules.tree_wiring import dtree, node_groups

NVLINK = "nvlink"


def _nvswitch(coll: Collective, algo: str, n: int, v: int, part: int, parts: int,
              members: tuple[int, ...], steps: list[Step]) -> Program:
    """The Program of NVSwitch virtual rank ``v`` serving ``part`` for ``members``."""
    chans = tuple(() for _ in range(part)) + (tuple(steps),)
    return Program(coll, algo, n, v, parts, chans, scratch=2 * parts,
                   meta={"virtual": "switch", "members": members, "tree": part,
                         "domain": NVLINK})


@lru_cache(maxsize=64)
def _all_reduce_plan(algo: str, n: int, opts: Options) -> tuple:
    """(groups, parts, virtual Programs, NVSwitch rank of each (part, node), up-peer of
    each (head, part), node of each rank) of an all-reduce. A node of one GPU has no
    NVSwitch rank: its GPU is the head of every part and its input the node's sum."""
    groups = node_groups(n, opts.nodes)
    ppn = min(len(g) for g in groups)
    parts = opts.channels * ppn
    nn = len(groups)
    virtual: list[Program] = []
    nvs: dict[tuple[int, int], int] = {}
    for p in range(parts):
        for k, g in enumerate(groups):
            if len(g) == 1:
                continue
            head = g[p % ppn]
            others = tuple(q for q in g if q != head)
            if nn == 1:          # ld_reduce and st merged: the sum goes to every GPU
                steps = [Step(dst=scr(p), recv_from=tuple(g), send_to=tuple(g), reduce=True)]
            else:
                steps = [Step(dst=scr(p), recv_from=tuple(g), send_to=(head,), reduce=True),
                         Step(dst=scr(parts + p), recv_from=(head,), send_to=others)]
            nvs[(p, k)] = v = n + len(virtual)
            virtual.append(_nvswitch(Collective.ALL_REDUCE, algo, n, v, p, parts, tuple(g),
                                     steps))
    up: dict[tuple[int, int], int] = {}
    if nn > 1 and algo == "nvls":
        fanin = int(opts.param("collnet_fanin", 0) or 0)
        fanin = fanin if 0 < fanin < nn else 0
        base = n + len(virtual)
        for p in range(parts):
            heads = [g[p % ppn] for g in groups]
            ups, progs = switch_programs(algo, n, base, heads, p, parts, fanin)
            up.update({(h, p): u for h, u in ups.items()})
            virtual += progs
    virtual.sort(key=lambda q: q.rank)
    where = {q: k for k, g in enumerate(groups) for q in g}
    return groups, parts, tuple(virtual), nvs, up, where


def _between_nodes(algo: str, groups: list[list[int]], k: int, p: int, head: int,
                   v: int | None, up: dict) -> list[Step]:
    """What the head of part p on node k does with the node's sum, which it receives
    from the NVSwitch rank v (or holds as its input when v is None)."""
    local = (v,) if v is not None else ()
    mine = inp(p) if v is None else None
    if algo == "nvls":
        u = up[(head, p)]
        first = Step(src=inp(p), send_to=(u,)) if v is None else \
            Step(dst=scr(p), recv_from=(v,), send_to=(u,))
        return [first, Step(dst=out(p), recv_from=(u,), send_to=local)]
    ppn = min(len(g) for g in groups)
    parent, *kids = dtree(len(groups), k)[p % 2]
    below = tuple(groups[c][p % ppn] for c in kids if c != -1)
    if parent == -1:
        return [Step(src=mine, dst=out(p), recv_from=(*local, *below),
                     send_to=(*below, *local), reduce=True)]
    above = groups[parent][p % ppn]
    gather = (*local, *below)
    up_step = Step(src=mine, dst=scr(p), recv_from=gather, send_to=(above,),
                   reduce=len(gather) > 1 or (mine is not None and bool(gather)))
    return [up_step, Step(dst=out(p), recv_from=(above,), send_to=(*below, *local))]


def _all_reduce(algo: str, n: int, r: int, opts: Options) -> Program:
    if n == 1:
        chans = tuple((Step(src=inp(c), dst=out(c)),) for c in range(opts.channels))
        return Program(Collective.ALL_REDUCE, algo, 1, 0, opts.channels, chans)
    groups, parts, virtual, nvs, up, where = _all_reduce_plan(algo, n, opts)
    k = where[r]
    g = groups[k]
    ppn = min(len(x) for x in groups)
    chans = []
    for p in range(parts):
        v = nvs.get((p, k))
        steps = [] if v is None else [Step(src=inp(p), send_to=(v,))]
        if r != g[p % ppn] or len(groups) == 1:
            steps.append(Step(dst=out(p), recv_from=(v,)))
        else:
            steps += _between_nodes(algo, groups, k, p, r, v, up)
        chans.append(tuple(steps))
    return Program(Collective.ALL_REDUCE, algo, n, r, parts, tuple(chans),
                   scratch=parts if len(groups) > 1 else 0, meta={"virtual_programs": virtual})


@register(Collective.ALL_REDUCE, "nvls", switch=NVLINK, tuned=False,
          cost="2α_i + n(m+1)/m·β_i (+ 2·levels·α_e + n/m·β_e across nodes)")
def all_reduce(n: int, r: int, opts: Options) -> Program:
    """NVLS: ld_reduce in the NVSwitch to each part's head, (SHARP between nodes,) st."""
    return _all_reduce("nvls", n, r, opts)


@register(Collective.ALL_REDUCE, "nvls_tree", switch=NVLINK, tuned=False,
          cost="2α_i + 2·log2(nodes)·α_e + n(m+1)/m·β_i + 2n/m·β_e")
def all_reduce_tree(n: int, r: int, opts: Options) -> Program:
    """NVLSTree: NVLS inside each node, a double binary tree of nodes between them."""
    return _all_reduce("nvls_tree", n, r, opts)


@lru_cache(maxsize=64)
def _owners(coll: Collective, n: int, k: int) -> tuple[Program, ...]:
    """One NVSwitch rank per (channel c, owner b), numbered n + c·n + b."""
    progs = []
    for c in range(k):
        for b in range(n):
            if coll is Collective.REDUCE_SCATTER:
                step = Step(dst=scr(c), recv_from=tuple(range(n)), send_to=(b,), reduce=True)
            else:
                step = Step(dst=scr(c), recv_from=(b,),
                            send_to=tuple(q for q in range(n) if q != b))
            progs.append(_nvswitch(coll, "nvls", n, n + c * n + b, c, k, tuple(range(n)),
                                   [step]))
    return tuple(progs)


def _one_node(coll: Collective, n: int, r: int, opts: Options, steps) -> Program:
    if len(node_groups(n, opts.nodes)) > 1:
        raise ValueError(f"nvls {coll.value} across nodes needs a CollNet plugin's "
                         f"{'iallgather' if coll is Collective.ALL_GATHER else 'ireducescatter'}"
                         " (NCCL); only one node is modeled")
    k = opts.channels
    if n == 1:
        chans = tuple((Step(src=inp(c), dst=out(c)),) for c in range(k))
        return Program(coll, "nvls", 1, 0, k, chans)
    return Program(coll, "nvls", n, r, k, tuple(tuple(steps(c)) for c in range(k)),
                   meta={"virtual_programs": _owners(coll, n, k)})


@register(Collective.ALL_GATHER, "nvls", switch=NVLINK, tuned=False,
          cost="α_i + (p−1)/p·n·β_i (one multicast st per block)")
def all_gather(n: int, r: int, opts: Options) -> Program:
    """Each rank stores its block once through the NVSwitch, which multicasts it."""
    k = opts.channels

    def steps(c: int) -> list[Step]:
        mine = Step(src=inp(c), dst=out(r * k + c), send_to=(n + c * n + r,))
        return [mine] + [Step(dst=out(b * k + c), recv_from=(n + c * n + b,))
                         for b in range(n) if b != r]

    return _one_node(Collective.ALL_GATHER, n, r, opts, steps)


@register(Collective.REDUCE_SCATTER, "nvls", switch=NVLINK, tuned=False,
          cost="α_i + n·β_i out, n/p·β_i in (ld_reduce of the own block)")
def reduce_scatter(n: int, r: int, opts: Options) -> Program:
    """Each rank ld_reduces its own block: the NVSwitch pulls it from every rank."""
    k = opts.channels

    def steps(c: int) -> list[Step]:
        return [Step(src=inp(b * k + c), send_to=(n + c * n + b,)) for b in range(n)] + \
            [Step(dst=out(c), recv_from=(n + c * n + r,))]

    return _one_node(Collective.REDUCE_SCATTER, n, r, opts, steps)
