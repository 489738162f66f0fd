"""``ringtree.sim``: run ringtree's own schedules on modeled clusters.

>>> from ringtree.sim import simulate, presets
>>> r = simulate("all_reduce", "ring", presets.get("dgx_h100", nodes=2), 1 << 30)
>>> r.time_ns, r.busbw          # doctest: +SKIP

The same Programs the executor runs (``ringtree.schedules``) are executed on a
:class:`~ringtree.sim.topology.Topology` (:mod:`.topology`, :mod:`.routing`,
:mod:`.presets`) under a congestion-aware or -unaware network model (:mod:`.model`):

- :mod:`.compile` flattens Programs with the executor's own compiler, :mod:`.structure`
  keeps what of that a sweep's sizes share;
- :mod:`.engine` is the event engine (its answer settled as a fixed point of arrays by
  :mod:`.dataflow` with its network carried whole by :mod:`.stages`, or in rounds by
  :mod:`.feedforward`, where that is exact; its aware heap run as one loop over local
  names by :mod:`.heap`, the same operations in the same order, and that loop compiled by
  :mod:`.native` where the package built its extension), :mod:`.fast` the α-β model as
  one longest-path problem in numpy;
- :mod:`.symbolic` runs a schedule generator on a symbolic rank to get one shared
  template Program for every rank, :mod:`.symmetry` proves when the run is symmetric
  under shifts of ranks or XOR of aligned blocks of ranks, :mod:`.orbits` that the
  routes are kept (links shared between blocks simulated through their orbits'
  representatives), and :mod:`.fold` chooses what to simulate; :mod:`.wave` runs a
  template for all simulated ranks at once (numpy), falling back to the event engine
  when it cannot keep the engine's order.

Schedules without a template (trees, direct, recursive doubling: their generators
branch on the rank) run every rank's own Program on the event engine, folded when
:func:`.symmetry.find` proves it (butterflies fold under XOR onto one node: with the
fat-tree's destination-mod-k routes, :mod:`.routing`, XOR of node ids maps routes onto
routes). What keeps that
O(ranks × channels) rather than O(ranks²) or O(ranks × channels × steps) of memory:
Programs are generated when read (:class:`.fold.Lazy`) and dropped once compiled; a
channel that moves no data is left out of the compiled run (:func:`.compile.moving`,
exact); the generator options hash once, not once per rank. A tree all-reduce of 8 B on
131,072 ranks is then 1.2 M chunks and about 30 s (``benchmarks/sim_scale.py``).

The congestion-aware event engine carries its network in *rounds* when ranks send many
messages at once (at least 64 per rank, :data:`.engine.ROUNDS_MSGS_PER_RANK`; a
tree's rounds are too small to pay) (:mod:`.feedforward`): what can be injected before
anything more arrives is held, carried a link stage at a time with array arithmetic
(links that feed none of each other sorted and served together, each a FIFO in the
heap's order with the engine's own sums), delivered, and the receivers run until the
next round — checked on every link to be the heap's order, else the run goes to the
heap. A one-shot ``direct`` all-reduce
is one round: 1 GiB on 64 ranks (23 M chunk-hops) takes about 3.5 s instead of 80; a
step that sends many slices injects them as arrays. A sweep's sizes after one whose
rounds left the heap's order go to the heap at once (``direct2`` at 256 KiB and up).

A sweep over sizes (``ringtree sim -b 8 -e 1G``; :class:`.structure.Sweep` passed to
every :func:`simulate`) compiles the Programs' structure once (:mod:`.structure`): steps,
memory dependencies, names, message pairing, routes and what the engine derives from
them are kept; a size recomputes the step lengths, slices and pruning. What stays
expensive is the Python per step and per chunk received (``direct2`` on 64 ranks: about
1 s per size on the heap).

What no folding or template shortens is refused before it is built (:mod:`.budget`): a
run whose rank 0 has more steps and slices sent, times the ranks simulated, than
``max_work`` (2^25, about a minute of the event engine) raises
:class:`~ringtree.sim.budget.TooLarge`, and ``ringtree sim`` says so at once and goes
on (``direct`` on 1,024 ranks would carry 1.1 G slices at 1 GiB; ``--max-work 0``
lifts the limit).

CollNet Programs bring *virtual ranks* (in-network reduction switches, see
``ringtree.schedules.collnet``) which are placed on the topology's reduction-capable
switches.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ringtree.ir.program import Collective, Program, parse_collective
from ringtree.sim import budget, engine, fast, fold, template, wave
from ringtree.sim.model import Aware, Unaware, parse_model
from ringtree.sim.structure import Sweep
from ringtree.sim.topology import Topology

__all__ = ["SimRun", "simulate", "simulate_sizes", "Sweep", "programs_for", "place",
           "count_for", "busbw_factor", "Aware", "Unaware", "Topology"]


def count_for(coll: Collective, nbytes: int, nranks: int, itemsize: int = 4) -> int:
    """Elements per block for a test of ``nbytes`` total, as nccl-tests counts them
    (all-gather / reduce-scatter / all-to-all / gather / scatter split the total)."""
    per = nbytes // itemsize
    if coll in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL,
                Collective.GATHER, Collective.SCATTER):
        return per // nranks
    return per


def busbw_factor(coll: Collective, n: int) -> float:
    """nccl-tests' bus bandwidth factor (``src/*.cu::*GetBw``)."""
    if n <= 1:
        return 1.0 if coll not in (Collective.ALL_REDUCE,) else 0.0
    if coll is Collective.ALL_REDUCE:
        return 2 * (n - 1) / n
    if coll in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL,
                Collective.GATHER, Collective.SCATTER):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class SimRun:
    """One simulated collective: time in ns, nccl-tests bandwidths in GB/s (1e9)."""

    collective: Collective
    algo: str
    nranks: int
    nbytes: int
    time_ns: float
    result: engine.Result | None
    events: int = 0            # chunks carried (heap events for the event engine)
    simulated: int = 0         # ranks actually simulated (fewer when folded)

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time_ns if self.time_ns > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * busbw_factor(self.collective, self.nranks)


def programs_for(coll: Collective | str, algo: str, topo: Topology, *, root: int = 0,
                 channels: int | None = None, params: tuple = ()) -> list[Program]:
    """Programs of every real rank, then of every virtual rank (CollNet switches)."""
    return fold.programs_for(parse_collective(coll), algo.lower(), topo,
                             fold.options(topo, root, channels, params))


def place(programs: Sequence[Program], topo: Topology) -> list[int]:
    """Device of every rank: real ranks where the topology puts them; a virtual rank on
    the reduction-capable switch closest to its members (lowest common ancestor for
    hierarchical networks; ties broken by the virtual rank's ``meta['tree']``)."""
    n = topo.nranks
    devices = list(topo.ranks)
    cands = [i for i, d in enumerate(topo.devices) if d.reduce]
    for p in programs[n:]:
        if not cands:
            raise ValueError(f"{topo.name} has no in-network reduction switch "
                             f"(algorithm {p.algo} needs one; try a *_sharp preset)")
        members = [devices[m] for m in p.meta.get("members", ())]
        tie = int(p.meta.get("tree", 0))
        if topo.routing == "updown":
            common = set(cands)
            for d in members:
                common &= topo.ancestors(d) | {d}
            if common:
                lo = min(topo.devices[c].level for c in common)
                best = sorted(c for c in common if topo.devices[c].level == lo)
                devices.append(best[tie % len(best)])
                continue
        sample = members[:: max(1, len(members) // 16)]
        score = {c: sum(len(topo.route(d, c)) for d in sample) for c in cands}
        lo = min(score.values())
        best = [c for c in cands if score[c] == lo]
        devices.append(best[tie % len(best)])
    return devices


def simulate(coll: Collective | str, algo: str, topo: Topology, nbytes: int, *,
             model: str | Aware | Unaware = "aware", itemsize: int = 4, root: int = 0,
             channels: int | None = None, slice_bytes: int = engine.DEFAULT_SLICE_BYTES,
             in_place: bool = False, trace: bool = False, params: tuple = (),
             symmetry: bool = True, programs: list[Program] | None = None,
             sweep: Sweep | None = None, max_work: int = budget.MAX_WORK) -> SimRun:
    """Simulate ``coll`` with ``algo`` moving ``nbytes`` (nccl-tests size) on ``topo``.

    ``model``: ``aware`` / ``unaware`` (event engine) or ``fast`` (vectorised α-β, same
    result as ``unaware``). ``trace`` keeps every transfer for :mod:`.trace`.
    ``symmetry``: simulate one representative per class of ranks when the run is exactly
    symmetric (:func:`ringtree.sim.fast.period`); the answer is the same, only faster.
    ``sweep``: a :class:`~ringtree.sim.structure.Sweep` shared by the calls of a sweep
    over sizes, which then compile the Programs' structure once (same answers).
    ``max_work``: refuse (:class:`~ringtree.sim.budget.TooLarge`) a run of more steps and
    slices than this once folded (0: no limit).
    """
    coll = parse_collective(coll)
    with _no_gc():
        return _simulate(coll, algo, topo, nbytes, model, itemsize, root, channels,
                         slice_bytes, in_place, trace, params, symmetry, programs, sweep,
                         max_work)


# progress callback ``f(events)`` of the running simulation (set by the CLI)
_progress: ContextVar = ContextVar("sim_progress", default=None)


@contextmanager
def _no_gc():
    """Millions of small acyclic objects: the cyclic collector only costs time here."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _simulate(coll, algo, topo, nbytes, model, itemsize, root, channels, slice_bytes,
              in_place, trace, params, symmetry, programs, sweep, max_work) -> SimRun:
    m = Unaware() if model == "fast" else parse_model(model)
    opts = fold.options(topo, root, channels, params)
    plan = _plan(coll, algo, topo, nbytes, m, itemsize, opts, slice_bytes, in_place,
                 symmetry and not trace, programs, not trace, sweep, max_work)
    return _finish(plan, coll, algo, topo, nbytes, model, m, itemsize, opts, slice_bytes,
                   in_place, trace)


def _plan(coll, algo, topo, nbytes, m, itemsize, opts, slice_bytes, in_place, symmetry,
          programs, prune, sweep, max_work) -> fold.Plan:
    count = count_for(coll, nbytes, topo.nranks, itemsize)
    return fold.prepare(coll, algo.lower(), topo, count, itemsize, slice_bytes,
                        aware=isinstance(m, Aware), in_place=in_place, symmetry_=symmetry,
                        opts=opts, programs=programs, place=place, prune=prune,
                        sweep=sweep, max_work=max_work)


def _finish(plan, coll, algo, topo, nbytes, model, m, itemsize, opts, slice_bytes, in_place,
            trace) -> SimRun:
    """Run a plan: the batched engine for a template (the event engine when it cannot
    keep the order), else the event engine or the α-β model."""
    if plan.batch is not None:
        try:
            t, events = wave.run(plan.batch, plan.template, topo, plan.devices, m,
                                 progress=_progress.get())
            return SimRun(coll, algo, topo.nranks, nbytes, t + topo.launch_ns, None, events,
                          plan.rank_fold or topo.nranks)
        except wave.Unordered:
            plan = _compiled(plan, coll, algo, topo, nbytes, itemsize, opts, slice_bytes,
                             in_place)
    cp, devices = plan.compiled, plan.devices
    assert cp is not None
    simulated = plan.rank_fold or cp.nranks
    if model == "fast":
        t = fast.run(cp, topo, devices)
        chunks = sum(len(cp.step_slices[s]) for s in cp.msg_sstep)
        return SimRun(coll, algo, topo.nranks, nbytes, t + topo.launch_ns, None, chunks,
                      simulated)
    res = engine.run(cp, topo, devices, m, trace=trace, progress=_progress.get())
    res.time_ns += topo.launch_ns
    if trace:
        res.compiled, res.devices = cp, devices
    return SimRun(coll, algo, topo.nranks, nbytes, res.time_ns, res, res.events, simulated)


def _compiled(plan, coll, algo, topo, nbytes, itemsize, opts, slice_bytes, in_place):
    count = count_for(coll, nbytes, topo.nranks, itemsize)
    return fold.compile_plan(plan, coll, algo.lower(), topo, opts, count, itemsize,
                             slice_bytes, in_place)


# a sweep's sizes stacked into one batched run (:func:`simulate_sizes`): at most this
# many, and at most this many chunks in one level of the stacked run (ranks × channels ×
# slices per step, summed over the copies: what one level's arrays hold)
STACK_SIZES = 32
STACK_CHUNKS = 1 << 21


def simulate_sizes(coll: Collective | str, algo: str, topo: Topology, sizes: Sequence[int],
                   *, model: str | Aware | Unaware = "aware", itemsize: int = 4,
                   root: int = 0, channels: int | None = None,
                   slice_bytes: int = engine.DEFAULT_SLICE_BYTES, in_place: bool = False,
                   params: tuple = (), symmetry: bool = True, sweep: Sweep | None = None,
                   max_work: int = budget.MAX_WORK,
                   each: Callable[[int, SimRun], None] | None = None) -> list[SimRun]:
    """:func:`simulate` of every size of a sweep, in order: the same answers, bit for bit.

    Consecutive sizes whose runs read one shared template of one structure (a ring's
    sizes, once every rank's chunks are in every step) go through :mod:`.wave` *stacked*
    (:func:`.template.stacked`): one run of disjoint copies, one per size, so a level's
    Python is paid once for all of them instead of once per size. A copy that breaks the
    batch's order is taken out and simulated alone (the event engine), and the others
    stacked again. ``each(i, run)`` is called as the run of ``sizes[i]`` is known (the
    stacked ones when their batch ends)."""
    coll = parse_collective(coll)
    m = Unaware() if model == "fast" else parse_model(model)
    opts = fold.options(topo, root, channels, params)
    runs: list[SimRun | None] = [None] * len(sizes)

    def finish(i: int, plan: fold.Plan) -> None:
        runs[i] = _finish(plan, coll, algo, topo, sizes[i], model, m, itemsize, opts,
                          slice_bytes, in_place, False)
        if each is not None:
            each(i, runs[i])

    def flush(group: list[tuple[int, fold.Plan]]) -> None:
        while len(group) > 1:
            tp = template.stacked([p.batch for _, p in group])
            lead = group[0][1]
            try:
                times, events = wave.run_copies(tp, lead.template, topo, lead.devices, m,
                                                progress=_progress.get())
            except wave.Unordered as e:
                if e.copy is None:
                    break                    # the structure itself: every size alone
                finish(*group.pop(e.copy))
                continue
            for (i, plan), t, ev in zip(group, times, events):
                runs[i] = SimRun(coll, algo, topo.nranks, sizes[i], t + topo.launch_ns,
                                 None, ev, plan.rank_fold or topo.nranks)
                if each is not None:
                    each(i, runs[i])
            return
        for i, plan in group:
            finish(i, plan)

    group: list[tuple[int, fold.Plan]] = []
    key: tuple | None = None
    with _no_gc():
        for i, nbytes in enumerate(sizes):
            plan = _plan(coll, algo, topo, nbytes, m, itemsize, opts, slice_bytes, in_place,
                         symmetry, None, True, sweep, max_work)
            if plan.batch is None:
                flush(group)
                group, key = [], None
                finish(i, plan)
                continue
            k = (id(plan.template), tuple(plan.devices), template.structure(plan.batch))
            tp = plan.batch
            cells = tp.g * tp.nchan * max((x.shape[1] for x in tp.sl), default=1)
            if k != key or len(group) >= STACK_SIZES or (len(group) + 1) * cells > STACK_CHUNKS:
                flush(group)
                group, key = [], k
            group.append((i, plan))
        flush(group)
    return runs  # type: ignore[return-value]
