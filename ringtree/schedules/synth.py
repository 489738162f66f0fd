"""Synthesized schedules: Programs from packed trees (:mod:`ringtree.schedules.forest`).

A :class:`Forest` holds, for one topology, the out-trees of the all-gather (a few per
rank, each carrying a run of chunks of its root's block) and the in-trees of the
reduce-scatter (trees of the reversed graph, each reducing a run of chunks of its root's
block towards the root). The collectives are those trees run as NCCL runs a tree
(ForestColl, Zhao et al. 2024):

- all-gather: the root copies its chunk into its output and sends it to its children;
  every other rank receives it from its parent, stores it and forwards it (``recvCopySend``);
- reduce-scatter: a leaf sends its input chunk to its parent; an inner rank receives its
  children's partial sums, adds its own chunk and sends on (``recvReduceSend``); the root
  stores the sum (``recvReduceCopy``). One rank reduces each chunk, in one order;
- all-reduce: the reduce-scatter tree of a chunk, then its all-gather tree from the same
  root (the root's ``recvReduceCopySend`` joins them), so every rank gets the root's bits.

Every run of chunks that one gather tree and one reduce tree carry has its own channel
(:meth:`Forest.segments`), so the trees' messages never queue behind each other on a
connection (in one channel a tree's slices would wait for every earlier tree's: the
simulator measured 1.35× the bound on a torus that way, 1.12× with a channel per
tree). Within a channel, steps are ordered by phase, then level (reduce trees from
their leaves up, gather trees from the root down): every step waits only for steps
earlier in that order, so no cycle can form.

Named ``synth:NAME``: :func:`define` registers a forest under a name in this process
(the simulator's adapter does, for a topology); ``synth:PATH`` reads a forest file
written by :func:`save` (``ringtree algo synth -o FILE.json``), on every rank alike.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ringtree.ir.program import Collective, Program, Step, inp, out
from ringtree.schedules.forest import Packing, rounded

PREFIX = "synth:"
COLLECTIVES = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE)


Tree = tuple[int, tuple[int, ...], int]      # (root, parent of every rank, units)


@dataclass(frozen=True)
class Forest:
    """The gather trees and reduce trees of one topology: every rank's block is cut into
    ``units`` chunks, and each root's trees, in order, carry consecutive runs of them."""

    nranks: int
    units: int
    gather: tuple[Tree, ...]
    reduce: tuple[Tree, ...]
    gather_rate: float = 0.0      # GB/s per unit (units · rate: x* of the rank graph)
    reduce_rate: float = 0.0
    bound: float = 0.0            # x* of the topology (all-gather, per root), GB/s
    reduce_bound: float = 0.0     # x* of the reversed topology
    topology: str = ""

    @classmethod
    def of(cls, gather: Packing, reduce: Packing, units: int | tuple[int, int],
           topology: str = "") -> Forest:
        """Both packings' trees with every block cut into ``units`` chunks (or the
        gather trees' and the reduce trees' counts, one dividing the other)."""
        if gather.nranks != reduce.nranks:
            raise ValueError("gather and reduce packings differ in ranks")
        ug, ur = (units, units) if isinstance(units, int) else units
        u = max(ug, ur)
        if u % ug or u % ur:
            raise ValueError(f"chunk counts {ug} and {ur}: one must divide the other")
        return cls(gather.nranks, u, _scaled(rounded(gather, ug), u // ug),
                   _scaled(rounded(reduce, ur), u // ur), gather.ranks_bound / u,
                   reduce.ranks_bound / u, gather.bound, reduce.bound, topology)

    def to_dict(self) -> dict:
        return {"nranks": self.nranks, "units": self.units, "topology": self.topology,
                "gather_rate": self.gather_rate, "reduce_rate": self.reduce_rate,
                "bound": self.bound, "reduce_bound": self.reduce_bound,
                "gather": [[r, list(p), c] for r, p, c in self.gather],
                "reduce": [[r, list(p), c] for r, p, c in self.reduce]}

    @classmethod
    def from_dict(cls, d: dict) -> Forest:
        def trees(key: str) -> tuple[Tree, ...]:
            return tuple((int(r), tuple(int(x) for x in p), int(c)) for r, p, c in d[key])

        f = cls(int(d["nranks"]), int(d["units"]), trees("gather"), trees("reduce"),
                float(d.get("gather_rate", 0)), float(d.get("reduce_rate", 0)),
                float(d.get("bound", 0)), float(d.get("reduce_bound", 0)),
                str(d.get("topology", "")))
        f.validate()
        return f

    def validate(self) -> None:
        """Every tree spans the ranks from its root; every root's trees carry its units."""
        n, k = self.nranks, self.units
        for kind, trees in (("gather", self.gather), ("reduce", self.reduce)):
            got = [0] * n
            for i, (root, parent, count) in enumerate(trees):
                if not 0 <= root < n or len(parent) != n or count < 1:
                    raise ValueError(f"{kind} tree {i}: root {root}, {len(parent)} parents, "
                                     f"{count} units (for {n} ranks)")
                _depths(root, parent, f"{kind} tree {i}")
                got[root] += count
            if got != [k] * n:
                raise ValueError(f"{kind}: units per root {got}, expected {k} each")

    def segments(self) -> list[tuple[int, int, int, Tree, Tree]]:
        """(root, first unit, units, gather tree, reduce tree): every root's block cut
        where either its gather or its reduce trees change, a channel each."""
        out = []
        for r in range(self.nranks):
            cuts: dict[int, list] = {}
            for kind, trees in ((0, self.gather), (1, self.reduce)):
                at = 0
                for t in (t for t in trees if t[0] == r):
                    for u in range(at, at + t[2]):
                        cuts.setdefault(u, [None, None])[kind] = t
                    at += t[2]
            u = 0
            while u < self.units:
                g, red = cuts[u]
                v = u
                while v < self.units and cuts[v][0] is g and cuts[v][1] is red:
                    v += 1
                out.append((r, u, v - u, g, red))
                u = v
        return out


def _scaled(trees: tuple[Tree, ...], by: int) -> tuple[Tree, ...]:
    return tuple((r, p, c * by) for r, p, c in trees)


def _depths(root: int, parent: tuple[int, ...], what: str = "tree") -> list[int]:
    n = len(parent)
    depth = [-1] * n
    depth[root] = 0
    for v in range(n):
        path, x = [], v
        while depth[x] < 0:
            path.append(x)
            x = parent[x]
            if not 0 <= x < n or len(path) > n:
                raise ValueError(f"{what}: rank {v} does not reach root {root}")
        for y in reversed(path):
            depth[y] = depth[parent[y]] + 1
    return depth


def _children(parent: tuple[int, ...], v: int) -> tuple[int, ...]:
    return tuple(c for c, p in enumerate(parent) if p == v)


def _gather_step(root: int, parent, r: int, src, dst) -> Step:
    kids = _children(parent, r)
    if r == root:
        return Step(src=src, dst=dst, send_to=kids)
    return Step(dst=dst, recv_from=(parent[r],), send_to=kids)


def _reduce_step(root: int, parent, r: int, src, dst, then: tuple[int, ...] = ()) -> Step:
    """Rank r's part of reducing ``src`` towards ``root`` (at the root into ``dst``, sent
    on to ``then``)."""
    kids = _children(parent, r)
    if r != root:
        return Step(src=src, recv_from=kids, send_to=(parent[r],), reduce=bool(kids))
    return Step(src=src, dst=dst, recv_from=kids, send_to=then, reduce=bool(kids))


def program(forest: Forest, coll: Collective, rank: int, name: str = "synth") -> Program:
    """Rank ``rank``'s Program of ``coll`` on ``forest``'s trees, a channel per segment
    (:meth:`Forest.segments`), steps ordered by phase, then level, within it."""
    n, k = forest.nranks, forest.units
    chans = []
    for root, a, m, (_, gpar, _), (_, rpar, _) in forest.segments():
        c = root * k + a            # the segment's first chunk in an n-block buffer
        gd, rd = _depths(root, gpar)[rank], _depths(root, rpar)[rank]
        keyed: list[tuple[tuple, Step]] = []
        if coll is Collective.ALL_GATHER:
            keyed.append(((1, gd), _gather_step(root, gpar, rank, inp(a, m), out(c, m))))
        elif coll is Collective.REDUCE_SCATTER:
            keyed.append(((0, n - rd), _reduce_step(root, rpar, rank, inp(c, m), out(a, m))))
        elif coll is Collective.ALL_REDUCE:
            if n == 1:
                chans.append((Step(src=inp(c, m), dst=out(c, m)),))
                continue
            then = _children(gpar, rank) if rank == root else ()
            keyed.append(((0, n - rd), _reduce_step(root, rpar, rank, inp(c, m), out(c, m),
                                                    then)))
            if rank != root:
                keyed.append(((1, gd), _gather_step(root, gpar, rank, None, out(c, m))))
        else:
            raise ValueError(f"no synthesized {coll.value} (only "
                             f"{', '.join(c.value for c in COLLECTIVES)})")
        chans.append(tuple(st for _, st in sorted(keyed, key=lambda x: x[0])))
    chunks = n * k if coll is Collective.ALL_REDUCE else k
    return Program(coll, name, n, rank, chunks, tuple(chans), meta={"forest": forest.topology})


_FORESTS: dict[str, Forest] = {}
_FILES: dict[str, str] = {}   # synth:<stem> -> the forest file it was read from


def define(name: str, forest: Forest) -> str:
    """Register ``forest``'s collectives as ``synth:NAME`` (again: replaced)."""
    from ringtree.schedules.registry import register, unregister

    forest.validate()
    full = (name if name.startswith(PREFIX) else PREFIX + name).lower()
    for coll in COLLECTIVES:
        unregister(coll, full)

        def generate(nranks: int, rank: int, opts, coll=coll) -> Program:
            if nranks != forest.nranks:
                raise ValueError(f"{full} was synthesized for {forest.nranks} ranks, "
                                 f"not {nranks}")
            return program(forest, coll, rank, full)

        register(coll, full, cost=f"trees packed on {forest.topology or full}",
                 tuned=False)(generate)
    _FORESTS[full] = forest
    return full


def undefine(name: str) -> None:
    """Unregister ``synth:NAME``."""
    from ringtree.schedules.registry import unregister

    full = (name if name.startswith(PREFIX) else PREFIX + name).lower()
    for coll in COLLECTIVES:
        unregister(coll, full)
    _FORESTS.pop(full, None)
    _FILES.pop(full, None)


def forest_of(name: str) -> Forest | None:
    return _FORESTS.get(name.lower())


def save(forest: Forest, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(forest.to_dict(), f)


def load(path: str) -> Forest:
    try:
        with open(path, encoding="utf-8") as f:
            return Forest.from_dict(json.load(f))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a synthesized forest: {e}") from None


def resolve(spec: str) -> str:
    """The registered name of ``synth:PATH`` (a forest file, read and registered as
    ``synth:<file stem>`` the first time) or ``synth:NAME`` (defined before)."""
    ref = spec[len(PREFIX):]
    if spec.lower() in _FORESTS:
        return spec.lower()
    stem = PREFIX + os.path.splitext(os.path.basename(ref))[0].lower()
    if stem in _FORESTS and _FILES.get(stem) == os.path.realpath(ref):
        return stem
    if not os.path.exists(ref):
        raise ValueError(f"{spec}: no synthesized schedule of that name in this process, "
                         f"and no forest file {ref!r} (write one with `ringtree algo synth "
                         f"COLL --topology T -o FILE.json`)")
    name = define(stem, load(ref))
    _FILES[name] = os.path.realpath(ref)
    return name


def forget() -> None:
    """Unregister every synthesized schedule of this process."""
    for name in list(_FORESTS):
        undefine(name)
