"""Schedules synthesized for a modeled cluster: its graph, packed into trees.

:func:`graph_of` turns a :class:`~ringtree.sim.machine.cluster.Topology` into the plain
graph of :mod:`ringtree.schedules.forest` (ranks first, every other device a switch,
parallel links summed, rates in bytes/ns = GB/s) and the rule of which pairs a switch may
be split into: two ranks only if their route passes through it, so every direct edge of
the packing is a message the simulator (and the network) carries through that switch.
:func:`synthesize` packs the all-gather trees and the reduce-scatter trees (on the
reversed graph, with the same number per rank) and :func:`register` names the result
``synth:<topology name>`` for every reader of the registry.

Exact where a pair of ranks has one route (a switch, hosts with one NIC per GPU or per
host, direct links, tori); on multi-rail fabrics the simulator routes by channel, which
the packing does not model, so only the route of channel 0 is used there.
"""

from __future__ import annotations

from ringtree.schedules import synth
from ringtree.schedules.forest import Graph, Packing, fewest_units, pack, rank_graph
from ringtree.sim.machine.cluster import Topology


def graph_of(topo: Topology):
    """(graph, allow): the topology as a rank graph with switches, and the pair rule."""
    n = topo.nranks
    if len(set(topo.ranks)) != n:
        raise ValueError(f"{topo.name}: several ranks share a device; synthesis needs one "
                         "rank per device")
    index = {d: r for r, d in enumerate(topo.ranks)}
    for d in range(len(topo.devices)):
        index.setdefault(d, len(index))
    device = {v: d for d, v in index.items()}
    g = Graph(n)
    for li, lk in enumerate(topo.links):
        g.add(index[lk.src], index[lk.dst], topo.bytes_per_ns(li))

    def allow(u: int, w: int, v: int) -> bool:
        if u >= n or v >= n:
            return True
        route = topo.route(device[u], device[v], 0)
        return any(topo.links[li].dst == device[w] for li in route)

    return g, allow


def packings(topo: Topology, pieces: tuple[int, ...] = (0,)
             ) -> list[tuple[Packing, Packing]]:
    """The weighted all-gather trees of ``topo`` and its reduce-scatter trees (packed on
    the reversed graph), once for every tree size limit of ``pieces``
    (:func:`~ringtree.schedules.forest.pack`); the switches are split off once."""
    g, allow = graph_of(topo)

    def back(u: int, w: int, v: int) -> bool:
        return allow(v, w, u)

    r = g.reversed()
    fwd, rev = rank_graph(g, allow), rank_graph(r, back)
    return [(pack(g, split=fwd, pieces=k), pack(r, split=rev, pieces=k)) for k in pieces]


PIECES = (0, 1, 2, 4)   # trees as heavy as fit, or at most 1/k of a block: tried with size


def synthesize(topo: Topology, units: int | None = None, size: int | None = None
               ) -> synth.Forest:
    """The all-gather and reduce-scatter trees of ``topo`` at its bound, every block cut
    into ``units`` chunks (by default the fewest that give every tree its weight within
    1 %). With ``size``, trees as heavy as fit and trees of at most 1/k of a block
    (:data:`PIECES`) are all packed, and the gather trees whose all-gather of ``size``
    bytes the simulator finds fastest are kept, and likewise the reduce trees: the
    packings reach the same bound, but a light tree pipelines few slices over its depth
    and FIFO links favour some shapes (measured in ``benchmarks/synth.py``)."""
    options = packings(topo, (0,) if size is None else PIECES)
    fewest = [(units or fewest_units(g), units or fewest_units(r)) for g, r in options]
    if len(options) == 1:
        return synth.Forest.of(*options[0], fewest[0], topo.name)
    from ringtree.sim import simulate

    gather, reduce = [], []
    for (g, r), (ug, ur) in zip(options, fewest):
        trial = synth.define(f"{synth.PREFIX}trial", synth.Forest.of(g, r, (ug, ur)))
        gather.append((simulate("all_gather", trial, topo, size).time_ns, ug, g))
        reduce.append((simulate("reduce_scatter", trial, topo, size).time_ns, ur, r))
    synth.undefine(f"{synth.PREFIX}trial")
    (_, ug, g), (_, ur, r) = (min(gather, key=lambda x: x[0]),
                              min(reduce, key=lambda x: x[0]))
    return synth.Forest.of(g, r, (ug, ur), topo.name)


def register(topo: Topology, size: int | None = None) -> str:
    """Synthesize for ``topo`` (once per topology name) and register it as
    ``synth:<name>``; returns that name."""
    name = synth.PREFIX + topo.name.lower()
    if synth.forest_of(name) is None:
        synth.define(name, synthesize(topo, size=size))
    return name


def bound_ns(forest: synth.Forest, coll, nbytes: int) -> float:
    """The bandwidth bound of a call of ``nbytes`` (the larger buffer) in ns: blocks of
    b = nbytes/n bytes at the topology's x* (GB/s = bytes/ns); the all-reduce as the
    reduce-scatter then the all-gather it is built of (ForestColl's form)."""
    from ringtree.ir.program import Collective, parse_collective

    coll = parse_collective(coll)
    b = nbytes / forest.nranks
    gather, reduce = b / forest.bound, b / forest.reduce_bound
    return {Collective.ALL_GATHER: gather, Collective.REDUCE_SCATTER: reduce,
            Collective.ALL_REDUCE: gather + reduce}[coll]


def resolve_names(algos: list[str], topo: Topology) -> list[str]:
    """``ringtree sim --algo``'s names with ``synth`` made the schedule synthesized for
    ``topo`` and ``synth:FILE.json`` the forest file registered."""
    return [register(topo) if a == "synth" else
            synth.resolve(a) if a.startswith(synth.PREFIX) else a for a in algos]
