"""``ringtree.sim``: run ringtree's own schedules on modeled clusters.

>>> from ringtree.sim import simulate, presets
>>> r = simulate("all_reduce", "ring", presets.get("dgx_h100", nodes=2), 1 << 30)
>>> r.time_ns, r.busbw, r.engine          # doctest: +SKIP

The same Programs the executor runs (``ringtree.schedules``, generated with the options
the runtime uses for a call of that size, :func:`ringtree.schedules.options_for`) are
executed on a modeled machine. The package is laid out by role:

- :mod:`.machine` — the cluster graph (:mod:`.machine.cluster`), its routes
  (:mod:`.machine.routing`), named clusters (:mod:`.machine.presets`), where ranks run
  (:mod:`.machine.placement`), and the model (:mod:`.machine.model`): congestion-aware
  (FIFO links, store-and-forward) or -unaware (α-β), after ASTRA-sim 2.0's network
  backends, with its rules — integer rounding, per-transfer overhead, launch cost, γ's
  rates — defined once in :class:`~.machine.model.Rules` and read by every engine;
- :mod:`.compiled` — Programs flattened with the executor's own compiler
  (:mod:`.compile.compiled`), what a sweep's sizes share (:mod:`.compile.structure`,
  :mod:`.compile.pairing`), one symbolic template for every rank
  (:mod:`.compile.symbolic`, :mod:`.compile.template`);
- :mod:`.fold` — what to simulate (:mod:`.fold.choice`): every rank, or one
  representative per class when :mod:`.fold.symmetry` proves the run symmetric under
  shifts or XOR of ranks and :mod:`.fold.orbits` that the routes keep it;
- :mod:`.engines` — one reference engine, the specification (:mod:`.engines.reference`,
  the event engine: in-order issue, slices, FIFO connections, the executor's rules), and
  accelerators that reproduce its floats exactly where they accept a run: the batched
  template engine, the α-β longest path, the fixed point, the rounds, the compiled heap.
  Each is an object with ``name``, ``accepts(job, rules) -> str | None`` and
  ``run(job) -> Outcome | Declined`` (:mod:`.engines.contract`); the dispatcher
  (:mod:`.engines.dispatch`) tries them in one declared order and is the only place an
  engine is chosen. ``simulate(engine=...)``, ``ringtree sim --engine`` or
  ``RINGTREE_SIM_ENGINE`` force one; :attr:`SimRun.engine` and ``ringtree sim -v`` name
  the engine of every run and why the ones before it declined;
- the front: :func:`simulate`, :func:`simulate_sizes` (a sweep, its sizes stacked into one
  batched run where they share a template), ``ringtree sim`` (:mod:`.cli`, :mod:`.jobs`,
  :mod:`.progress`, :mod:`.malloc`), the work budget (:mod:`.budget`), traces
  (:mod:`.trace`) and training-step replay (:mod:`.workload`).

What no folding or template shortens is refused before it is built (:mod:`.budget`): a
run whose rank 0 has more steps and slices sent, times the ranks simulated, than
``max_work`` (2^25, about a minute of the event engine) raises
:class:`~ringtree.sim.budget.TooLarge`, and ``ringtree sim`` says so at once and goes
on (``--max-work 0`` lifts the limit).

CollNet and NVLS Programs bring *virtual ranks* (in-network reduction switches, see
``ringtree.schedules.collnet`` and ``ringtree.schedules.nvls``) which are placed on the
topology's reduction-capable switches (:func:`.machine.placement.place`).

``proto`` prices NCCL's GPU protocols (:mod:`.machine.protocols`): ``"LL"``, ``"LL128"``,
``"Simple"``, any ``NCCL_PROTO`` string, or ``"auto"`` (the fastest of those the
algorithm runs with, per size, as NCCL's tuner picks); :attr:`SimRun.proto` names the
one that answered. ``None`` (the default) keeps the topology's own costs. ``tests/test_sim_conformance.py`` runs
every engine against the reference on every registered schedule.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

from ringtree.ir.program import Collective, Program, parse_collective
from ringtree.schedules import Options, generate, options_for
from ringtree.sim import budget, egress
from ringtree.sim.compile import template
from ringtree.sim.compile.compiled import DEFAULT_SLICE_BYTES
from ringtree.sim.compile.structure import Sweep
from ringtree.sim.engines import batched, dispatch
from ringtree.sim.engines.contract import Job, Result
from ringtree.sim.fold import choice
from ringtree.sim.machine import presets, protocols
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Aware, Rules, Unaware
from ringtree.sim.machine.placement import place

__all__ = ["SimRun", "simulate", "simulate_sizes", "Sweep", "programs_for", "place",
           "count_for", "call_bytes", "busbw_factor", "Aware", "Unaware", "Topology",
           "Rules", "Result", "presets"]


def count_for(coll: Collective, nbytes: int, nranks: int, itemsize: int = 4) -> int:
    """Elements per block for a test of ``nbytes`` total, as nccl-tests counts them
    (a collective with a block per rank splits the total:
    :meth:`~ringtree.ir.collectives.CollectiveSpec.volume`)."""
    return nbytes // itemsize // coll.spec.volume(nranks)


def call_bytes(coll: Collective, count: int, itemsize: int, nranks: int) -> int:
    """The whole buffer of a call of ``count`` elements per block, as the runtime's
    planner computes it (``Planner._build``): what an algorithm's per-size options
    (:func:`ringtree.schedules.options_for`) are chosen by."""
    nin, nout = coll.blocks(nranks)
    return count * itemsize * max(nin, nout, 1)


def busbw_factor(coll: Collective, n: int) -> float:
    """nccl-tests' bus bandwidth factor (``src/*.cu::*GetBw``), as
    :class:`~ringtree.ir.collectives.CollectiveSpec` keeps it."""
    return coll.spec.busbw(n)


@dataclass(frozen=True)
class SimRun:
    """One simulated collective: time in ns, nccl-tests bandwidths in GB/s (1e9), and the
    engine that answered (:mod:`.engines.dispatch`) with why the ones before it declined."""

    collective: Collective
    algo: str
    nranks: int
    nbytes: int
    time_ns: float
    result: Result | None
    events: int = 0            # chunks carried (heap events for the event engine)
    simulated: int = 0         # ranks actually simulated (fewer when folded)
    engine: str = ""
    declined: tuple[tuple[str, str], ...] = ()
    proto: str = ""            # NCCL protocol priced (:mod:`.machine.protocols`); '' none

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time_ns if self.time_ns > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * busbw_factor(self.collective, self.nranks)


def programs_for(coll: Collective | str, algo: str, topo: Topology, *, root: int = 0,
                 channels: int | None = None, params: tuple = (),
                 nbytes: int | None = None) -> list[Program]:
    """Programs of every real rank, then of every virtual rank (CollNet switches); with
    ``nbytes`` (the call's whole buffer, :func:`call_bytes`) under the algorithm's options
    for that size."""
    coll = parse_collective(coll)
    opts = choice.options(topo, root, channels, params)
    if nbytes is not None:
        opts = options_for(coll, algo, nbytes, opts)
    return choice.programs_for(coll, algo.lower(), topo, opts)


@dataclass(frozen=True)
class _Call:
    """What every size of one simulated collective shares."""

    coll: Collective
    algo: str
    topo: Topology
    rules: Rules
    itemsize: int
    opts: Options               # before the algorithm's per-size options
    slice_bytes: int
    in_place: bool
    engine: str | None

    def count(self, nbytes: int) -> int:
        """Elements per block; for an imported MSCCL-IR file rounded up to a multiple of
        its chunks, the only counts its executors run it on (less than a chunk more)."""
        c = count_for(self.coll, nbytes, self.topo.nranks, self.itemsize)
        k = _equal_chunks(self.coll, self.algo, self.topo.nranks)
        return -(-c // k) * k

    def options(self, nbytes: int) -> Options:
        """The options the runtime would generate this size's Programs with."""
        n = call_bytes(self.coll, self.count(nbytes), self.itemsize, self.topo.nranks)
        return options_for(self.coll, self.algo, n, self.opts)

    def plan(self, nbytes: int, symmetry: bool, programs, prune: bool, sweep,
             max_work: int) -> choice.Plan:
        return choice.prepare(self.coll, self.algo, self.topo, self.count(nbytes),
                              self.itemsize, self.slice_bytes, aware=self.rules.aware,
                              in_place=self.in_place, symmetry_=symmetry,
                              opts=self.options(nbytes), programs=programs, place=place,
                              prune=prune, sweep=sweep, max_work=max_work,
                              sparse=self.engine in (None, "alpha_beta", "native", "reference"),
                              ring=_RING_FROM.get(self.engine, None))

    def finish(self, plan: choice.Plan, nbytes: int, trace: bool = False) -> SimRun:
        """Run a plan on the first engine that accepts it (:func:`.engines.dispatch.run`)."""
        def compile_() -> choice.Plan:            # the job's plan: chains declined, its own
            return choice.compile_plan(job.plan, self.coll, self.algo, self.topo,
                                       self.options(nbytes), self.count(nbytes),
                                       self.itemsize, self.slice_bytes, self.in_place)

        job = Job(plan, self.topo, self.rules, trace, _progress.get(), compile_)
        out, name = dispatch.run(job, self.engine)
        res = out.result
        if res is not None:
            res.time_ns += self.topo.launch_ns
            if trace:
                res.compiled, res.devices = job.compiled, job.devices
        cp = job.plan.compiled
        simulated = job.plan.rank_fold or (cp.nranks if cp is not None else self.topo.nranks)
        return self.run(nbytes, out.time_ns + self.topo.launch_ns, res, out.events,
                        simulated, name, tuple(job.declined))

    def run(self, nbytes: int, t: float, res, events: int, simulated: int, engine: str,
            declined: tuple = ()) -> SimRun:
        return SimRun(self.coll, self.algo, self.topo.nranks, nbytes, t, res, events,
                      simulated, engine, declined)


# from how many template cells a ring of one-element blocks runs in chains
# (:mod:`.compile.ring_chain`), by the engine forced: always when it is the chains'
_RING_FROM = {None: choice.SPARSE_FROM_CELLS, "ring_chain": 0}


def _equal_chunks(coll: Collective, algo: str, nranks: int) -> int:
    """The chunks per block an algorithm's count must be a multiple of (1: any count)."""
    if not algo.startswith("msccl:"):
        return 1
    from ringtree.schedules import generate

    p = generate(coll, algo, nranks, 0, Options())
    return p.chunks if p.meta.get("equal_chunks") else 1


def _call(coll, algo, topo, model, itemsize, root, channels, params, slice_bytes, in_place,
          engine, proto: str | None = None) -> _Call:
    coll = parse_collective(coll)
    topo = protocols.priced(topo, coll.value, algo.lower(), proto)
    return _Call(coll, algo.lower(), topo, Rules.of(model, topo), itemsize,
                 choice.options(topo, root, channels, params), slice_bytes, in_place,
                 dispatch.forced(engine))


def simulate(coll: Collective | str, algo: str, topo: Topology, nbytes: int, *,
             model: str | Aware | Unaware = "aware", itemsize: int = 4, root: int = 0,
             channels: int | None = None, slice_bytes: int = DEFAULT_SLICE_BYTES,
             in_place: bool = False, trace: bool = False, params: tuple = (),
             symmetry: bool = True, programs: list[Program] | None = None,
             sweep: Sweep | None = None, max_work: int = budget.MAX_WORK,
             engine: str | None = None, proto: str | None = None) -> SimRun:
    """Simulate ``coll`` with ``algo`` moving ``nbytes`` (nccl-tests size) on ``topo``.

    ``model``: ``aware`` / ``unaware`` or ``fast`` (the α-β engine: the unaware model's
    time). ``trace`` keeps every transfer for :mod:`.trace`. ``symmetry``: simulate one
    representative per class of ranks when the run is exactly symmetric
    (:mod:`.fold.symmetry`); the answer is the same, only faster. ``sweep``: a
    :class:`~ringtree.sim.compile.structure.Sweep` shared by the calls of a sweep over
    sizes, which then compile the Programs' structure once (same answers). ``max_work``:
    refuse (:class:`~ringtree.sim.budget.TooLarge`) a run of more steps and slices than
    this once folded (0: no limit). ``engine``: run on this engine only
    (:mod:`.engines.dispatch`; default ``RINGTREE_SIM_ENGINE``, else the first that
    accepts). The Programs are generated with the options the runtime would use for a
    call of this size (:func:`ringtree.schedules.options_for`). ``proto``: NCCL's
    protocol(s) to price (:mod:`.machine.protocols`; several: the fastest answers).
    """
    runs = []
    for p in _protos(coll, algo, proto, topo.nranks):
        call = _call(coll, algo, topo, model, itemsize, root, channels, params, slice_bytes,
                     in_place, engine, p)
        with _no_gc():
            plan = call.plan(nbytes, symmetry and not trace, programs, not trace,
                             sweep if p is None else None, max_work)
            runs.append(_named(call.finish(plan, nbytes, trace), p))
    return min(runs, key=lambda r: r.time_ns)


def _protos(coll: Collective | str, algo: str, proto: str | None, nranks: int
            ) -> tuple[str | None, ...]:
    """The protocols a call prices: none (the topology's own costs), or NCCL's."""
    if proto is None:
        return (None,)
    return protocols.choices(proto, parse_collective(coll).value, algo.lower(),
                             _declared(coll, algo, nranks))


def _declared(coll: Collective | str, algo: str, nranks: int) -> str | None:
    """The protocol an MSCCL-IR file was written for (its executors run that one)."""
    if not algo.lower().startswith("msccl:"):
        return None
    try:
        p = generate(coll, algo, nranks, 0).meta.get("proto")
    except ValueError:
        return None                      # simulate() says what is wrong with it
    return p.lower() if isinstance(p, str) and p.lower() in protocols.PROTOCOLS else None


def _named(run: SimRun, proto: str | None) -> SimRun:
    return run if proto is None else replace(run, proto=protocols.NAMES[proto])


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


# a sweep's sizes stacked into one batched run (:func:`simulate_sizes`): at most this
# many, and at most this many chunks in one level of the stacked run (ranks × channels ×
# slices per step, summed over the copies: what one level's arrays hold)
STACK_SIZES = 32
STACK_CHUNKS = 1 << 21


def simulate_sizes(coll: Collective | str, algo: str, topo: Topology, sizes: Sequence[int],
                   *, model: str | Aware | Unaware = "aware", itemsize: int = 4,
                   root: int = 0, channels: int | None = None,
                   slice_bytes: int = DEFAULT_SLICE_BYTES, in_place: bool = False,
                   params: tuple = (), symmetry: bool = True, sweep: Sweep | None = None,
                   max_work: int = budget.MAX_WORK,
                   each: Callable[[int, SimRun], None] | None = None,
                   engine: str | None = None, proto: str | None = None) -> list[SimRun]:
    """:func:`simulate` of every size of a sweep, in order: the same answers, bit for bit.

    Consecutive sizes whose runs read one shared template of one structure (a ring's
    sizes, once every rank's chunks are in every step) go through the batched engine
    *stacked* (:func:`.compile.template.stacked`): one run of disjoint copies, one per
    size, so a level's Python is paid once for all of them instead of once per size. A
    copy that breaks the batch's order is taken out and simulated alone (the dispatcher's
    next engines), and the others stacked again. ``each(i, run)`` is called as the run of
    ``sizes[i]`` is known (the stacked ones when their batch ends). ``proto`` as for
    :func:`simulate`: with several protocols each size's fastest is kept."""
    protos = _protos(coll, algo, proto, topo.nranks)
    if len(protos) > 1:
        shared = None if sweep is None else Sweep()     # the structures read no prices

        def priced(p: str, todo: list[int]) -> list[SimRun]:
            return simulate_sizes(coll, algo, topo, todo, model=model, itemsize=itemsize,
                                  root=root, channels=channels, slice_bytes=slice_bytes,
                                  in_place=in_place, params=params, symmetry=symmetry,
                                  sweep=shared,
                                  max_work=max_work, engine=engine, proto=p)

        calls = {p: _call(coll, algo, topo, model, itemsize, root, channels, params,
                          slice_bytes, in_place, engine, p) for p in protos}
        best = _fastest(calls, sizes, priced)
        for i, run in enumerate(best):
            if each is not None:
                each(i, run)
        return best
    call = _call(coll, algo, topo, model, itemsize, root, channels, params, slice_bytes,
                 in_place, engine, protos[0])
    runs: list[SimRun | None] = [None] * len(sizes)

    def done(i: int, run: SimRun) -> None:
        run = runs[i] = _named(run, protos[0])
        if each is not None:
            each(i, run)

    with _no_gc():
        for group in _groups(call, sizes, symmetry, sweep, max_work):
            _flush(call, group, sizes, done)
    return runs  # type: ignore[return-value]


def _fastest(calls: dict[str, _Call], sizes: Sequence[int],
             priced: Callable[[str, list[int]], list[SimRun]]) -> list[SimRun]:
    """Each size's fastest protocol (the first of ``calls``' order among equals): Simple
    first, then each other protocol at the sizes where :mod:`.egress`'s lower bound of
    its time does not already exceed the fastest so far (congestion-aware, real-valued
    time only; else at every size). The answers are those of pricing every protocol at
    every size: a protocol left out is slower than one run."""
    order = sorted(calls, key=lambda p: p != "simple")
    runs: dict[str, dict[int, SimRun]] = {}
    for p in order:
        todo = [i for i in range(len(sizes)) if not runs or not _slower(calls[p], sizes[i], [
            r[i].time_ns for r in runs.values() if i in r])]
        runs[p] = dict(zip(todo, priced(p, [sizes[i] for i in todo]))) if todo else {}
    return [min((runs[p][i] for p in calls if i in runs[p]), key=lambda r: r.time_ns)
            for i in range(len(sizes))]


def _slower(call: _Call, nbytes: int, times: list[float]) -> bool:
    """Is ``call`` at ``nbytes`` surely slower than the fastest of ``times``
    (:func:`.egress.exceeds` on ranks 0 and n − 1)?"""
    if not times or not call.rules.aware or call.rules.integer_ns:
        return False
    n, count, opts = call.topo.nranks, call.count(nbytes), call.options(nbytes)
    bound = max(egress.lower_bound_ns(generate(call.coll, call.algo, n, r, opts), call.topo,
                                      count, call.itemsize) for r in {0, n - 1})
    return egress.exceeds(bound, min(times))


def _groups(call: _Call, sizes: Sequence[int], symmetry: bool, sweep, max_work):
    """The sizes' plans in order, in runs that may be stacked (one shared template of one
    structure, within :data:`STACK_SIZES` and :data:`STACK_CHUNKS`)."""
    stack = call.engine in (None, "batched")
    group: list[tuple[int, choice.Plan]] = []
    key: tuple | None = None
    for i, nbytes in enumerate(sizes):
        plan = call.plan(nbytes, symmetry, None, True, sweep, max_work)
        if plan.batch is None or not stack:
            yield group
            yield [(i, plan)]
            group, key = [], None
            continue
        k = (id(plan.template), tuple(plan.devices), template.structure(plan.batch))
        tp = plan.batch
        cells = tp.g * tp.nchan * max((x.shape[1] for x in tp.sl), default=1)
        if k != key or len(group) >= STACK_SIZES or (len(group) + 1) * cells > STACK_CHUNKS:
            yield group
            group, key = [], k
        group.append((i, plan))
    yield group


def _flush(call: _Call, group: list[tuple[int, choice.Plan]], sizes: Sequence[int],
           done: Callable[[int, SimRun], None]) -> None:
    """Run a group of plans: stacked while more than one keeps the batch's order, each
    alone through the dispatcher otherwise."""
    while len(group) > 1:
        tp = template.stacked([p.batch for _, p in group])
        lead = group[0][1]
        try:
            times, events = batched.run_copies(tp, lead.template, call.topo, lead.devices,
                                               call.rules, progress=_progress.get())
        except batched.Unordered as e:
            if e.copy is None:
                break                    # the structure itself: every size alone
            i, plan = group.pop(e.copy)
            done(i, call.finish(plan, sizes[i]))
            continue
        for (i, plan), t, ev in zip(group, times, events):
            done(i, call.run(sizes[i], t + call.topo.launch_ns, None, ev,
                             plan.rank_fold or call.topo.nranks, "batched"))
        return
    for i, plan in group:
        done(i, call.finish(plan, sizes[i]))
