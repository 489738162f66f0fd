"""Choosing what to simulate: the whole run, or one representative per class of
equivalent ranks (:mod:`.symmetry`), read off a shared template Program
(:mod:`.symbolic`) when the schedule has one, so that a folded run never generates the
Programs of the ranks it does not simulate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ringtree.ir.program import Collective, Program
from ringtree.schedules import Options, generate
from ringtree.sim import budget
from ringtree.sim.compile import (
    ring_chain,
    sparse,
    symbolic,
    template,
    tree_wired,
    xor_symbolic,
)
from ringtree.sim.compile.compiled import Compiled, compile_programs
from ringtree.sim.compile.ranks import Made
from ringtree.sim.compile.recent import Recent
from ringtree.sim.compile.structure import Sweep
from ringtree.sim.fold import moved, symmetry
from ringtree.sim.machine.cluster import Topology


@dataclass
class Plan:
    """What one simulation runs: compiled Programs (or a shared template for the batched
    engine), their devices, and how it was folded."""

    compiled: Compiled | None
    devices: list[int]
    rank_fold: int = 0          # representatives simulated (0 = every rank)
    shared: bool = False        # Programs read off one template (never all generated)
    batch: template.Template | None = None
    template: Program | None = None
    ring: ring_chain.RingChain | None = None     # a ring in chains (:mod:`.compile.ring_chain`)
    fallback: Callable[[], Plan] | None = None   # the plan without the chains


def options(topo: Topology, root: int = 0, channels: int | None = None,
            params: tuple = ()) -> Options:
    """The generator options a simulation on ``topo`` uses."""
    return Options(root=root, channels=channels or topo.channels, nodes=topo.nodes(),
                   params=tuple(sorted(dict(topo.params + tuple(params)).items())))


def programs_for(coll: Collective, algo: str, topo: Topology, opts: Options) -> list[Program]:
    """Programs of every real rank, then of every virtual rank (CollNet switches)."""
    return list(Lazy(coll, algo, topo.nranks, opts))


class Lazy(Made):
    """The Programs of :func:`programs_for`, each generated when it is read, so that
    compiling them one after another never holds every rank's Program at once (the
    compiled run is a fraction of their size). Reading one again regenerates it
    (generators are pure; the registry caches the recent ones)."""

    def __init__(self, coll: Collective, algo: str, n: int, opts: Options) -> None:
        self.args = (coll, algo, n, opts)
        self.n = n
        p0 = generate(coll, algo, n, 0, opts)
        self.virtual = tuple(p0.meta.get("virtual_programs", ()))

    def __len__(self) -> int:
        return self.n + len(self.virtual)

    def make(self, i: int) -> Program:
        if i >= self.n:
            return self.virtual[i - self.n]
        coll, algo, n, opts = self.args
        return generate(coll, algo, n, i, opts)


def _shared(coll: Collective, algo: str, topo: Topology, opts: Options, count: int,
            itemsize: int, slice_bytes: int, aware: bool, in_place: bool,
            prune: bool = True) -> Plan | None:
    """A batched plan from the schedule's template (folded when the run is symmetric)."""
    n = topo.nranks
    t = symbolic.template(coll, algo, n, opts)
    if t is None:
        return None
    devices = list(topo.ranks)
    g = symmetry.template_period(t, topo, devices, count, aware, in_place)
    p0 = generate(coll, algo, n, 0, opts)
    last = generate(coll, algo, n, (g or n) - 1, opts)
    if not symbolic.reads(t, p0) or not symbolic.reads(t, last):
        return None                              # the template misread the generator
    try:
        tk, pk = template.moving(t, p0, count, in_place) if prune else (t, p0)
        tp = template.Template(tk, pk, g or n, count, itemsize, slice_bytes, in_place)
        tp.share_offs = template.declared_offsets(t)
        tp.order = tp.levels()
    except (template.Unordered, symbolic.NotSymmetric):
        return None
    return Plan(None, devices, g, True, tp, t)


# the batched engine holds (template steps × ranks) cells: from this many on, a template
# whose moving steps are at most a tenth of them runs only those (:mod:`.compile.sparse`)
SPARSE_FROM_CELLS = 1 << 24
SPARSE_SHARE = 10


def sparse_plan(coll: Collective, algo: str, topo: Topology, opts: Options, count: int,
                itemsize: int, slice_bytes: int, aware: bool, in_place: bool,
                from_cells: int = SPARSE_FROM_CELLS, share: int = SPARSE_SHARE
                ) -> Plan | None:
    """The template's moving steps only (:func:`.compile.sparse.compile_sparse`), when
    the template holds at least ``from_cells`` cells and at most one in ``share`` moves
    data (None: the other plans)."""
    n = topo.nranks
    t = symbolic.template(coll, algo, n, opts)
    if t is None:
        return None
    cells = sum(map(len, t.channels)) * n
    if cells < from_cells:
        return None
    p0 = generate(coll, algo, n, 0, opts)
    if not symbolic.reads(t, p0) or not symbolic.reads(t, generate(coll, algo, n, n - 1,
                                                                    opts)):
        return None                              # the template misread the generator
    tk, pk = template.moving(t, p0, count, in_place)
    cp = sparse.compile_sparse(tk, pk, count, itemsize, slice_bytes, in_place, unpruned=t,
                               limit=min(sparse.MAX_STEPS, cells // share),
                               shares=not aware)
    return None if cp is None else Plan(cp, list(topo.ranks), 0, True)


def compile_plan(plan: Plan, coll: Collective, algo: str, topo: Topology, opts: Options,
                 count: int, itemsize: int, slice_bytes: int, in_place: bool) -> Plan:
    """The event engine's form of a batched plan (when the batch cannot keep order)."""
    g = plan.rank_fold
    progs = [generate(coll, algo, topo.nranks, r, opts) for r in range(g or topo.nranks)]
    cp = compile_programs(progs, count, itemsize, slice_bytes, in_place, fold=g)
    return Plan(cp, plan.devices, g, True)


def prepare(coll: Collective, algo: str, topo: Topology, count: int, itemsize: int,
            slice_bytes: int, *, aware: bool, in_place: bool = False, symmetry_: bool = True,
            opts: Options, programs: list[Program] | None = None, place=None,
            prune: bool = True, sweep: Sweep | None = None, max_work: int = 0,
            sparse: bool = True, ring: int | None = SPARSE_FROM_CELLS) -> Plan:
    """Decide how to simulate ``coll``/``algo`` on ``topo`` and compile for it
    (``prune``: leave out channels that move no data, :func:`.compiled.moving`;
    ``sweep``: keep what does not depend on ``count`` for the next call,
    :mod:`.structure`; ``max_work``: refuse runs over this many steps and slices,
    :mod:`.budget`; ``sparse``: the moving steps only where they are few,
    :func:`sparse_plan`; not for an engine forced that reads templates or many messages;
    ``ring``: a ring all-reduce of one-element blocks in chains, from this many template
    cells on, :mod:`.compile.ring_chain`; None: never)."""
    if symmetry_ and programs is None and ring is not None and aware:
        rc = ring_chain.ring_chain(coll, algo, topo.nranks, opts, count, itemsize,
                                   slice_bytes, in_place)
        if rc is not None and opts.channels * (2 * rc.n - 1) * rc.n >= ring:
            def fallback() -> Plan:
                return prepare(coll, algo, topo, count, itemsize, slice_bytes, aware=aware,
                               in_place=in_place, opts=opts, place=place, prune=prune,
                               sweep=sweep, max_work=max_work, sparse=sparse, ring=None)

            return Plan(None, list(topo.ranks), 0, True, ring=rc, fallback=fallback)
    if symmetry_ and programs is None:
        got = sparse_plan(coll, algo, topo, opts, count, itemsize, slice_bytes, aware,
                          in_place) if sparse else None
        got = got or _shared(coll, algo, topo, opts, count, itemsize, slice_bytes, aware,
                             in_place, prune)
        if got is not None:
            return got
    progs: Sequence[Program] = programs if programs is not None else \
        Lazy(coll, algo, topo.nranks, opts)
    devices = place(progs, topo)
    key = (coll, algo, topo.nranks, opts, id(topo), tuple(devices), aware, in_place,
           moved.pattern(progs[0], count)) if symmetry_ and programs is None else None
    got = _FOLDS.peek(key, topo) if key is not None else None
    if got is not None:
        bound, f = got
    else:
        bound = symmetry.fold_bound(progs, topo, devices, count, aware, in_place) \
            if symmetry_ else 0
        f = None
    if programs is None and bound:               # over the limit even at the best fold
        budget.check(progs[0], bound, count, itemsize, slice_bytes, in_place, max_work,
                     f"folded onto {bound} at best")
    if got is None:
        f = symmetry.find(progs, topo, devices, count, aware, in_place,
                          key[:-1] if key else None) if bound else None
        if key is not None:
            _FOLDS.put(key, (bound, f), topo)
    g = f.g if f else 0
    if programs is None:
        budget.check(progs[0], g or topo.nranks, count, itemsize, slice_bytes, in_place,
                     max_work, f"folded onto {g}" if g else "no symmetry to fold")
    run = progs[:g] if g else progs
    xor = bool(f and f.xor)
    cp = _unfolded(coll, algo, topo, opts, progs, count, itemsize, slice_bytes, sweep) \
        if programs is None and not g and prune and aware and not in_place else None
    if cp is None and sweep is not None and programs is None:
        cp = sweep.compile((coll, algo, topo.nranks, opts), run, count, itemsize,
                           slice_bytes, in_place, g, prune, not aware, xor)
    elif cp is None:
        cp = compile_programs(run, count, itemsize, slice_bytes, in_place, fold=g,
                              prune=prune, shares=not aware, xor=xor)
    cp.link_rep = f.links if f else None
    return Plan(cp, devices, g)


def _unfolded(coll: Collective, algo: str, topo: Topology, opts: Options,
              progs: Sequence[Program], count: int, itemsize: int, slice_bytes: int,
              sweep: Sweep | None) -> Compiled | None:
    """A large unfolded run (pruned, congestion-aware, out of place) compiled without
    generating every rank's whole Program where it can be: from the tree's wiring
    (:mod:`.compile.tree_wired`), or read off the XOR template with the channels of no
    data never made (:class:`.compile.xor_symbolic.Emptied`); else None."""
    steps = topo.nranks * progs[0].steps
    cp = tree_wired.compile_tree(coll, algo, topo.nranks, opts, count, itemsize,
                                 slice_bytes) if steps >= tree_wired.FROM_STEPS else None
    if cp is None and steps >= max(xor_symbolic.EMPTIED_FROM_STEPS,
                                   sweep.max_steps if sweep else 0):
        emptied = xor_symbolic.Emptied.of(coll, algo, topo.nranks, opts, count, progs)
        if emptied is not None:
            cp = compile_programs(emptied, count, itemsize, slice_bytes, False, shares=False)
    return cp


# what the last few runs' folds were, per chunk-length pattern (:func:`.moved.pattern`):
# a sweep over sizes proves each pattern's fold once
_FOLDS = Recent("folds", symbolic.KEEP)
