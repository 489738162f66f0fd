"""The one place that chooses an engine: the engines in a declared order, the first that
accepts a run and answers it wins.

:data:`ORDER` lists the engines from the most specialised to the reference, each behind
the contract of :mod:`.contract` (``accepts(job, rules)``, ``run(job)``):

1. ``batched`` (:mod:`.batched`) — a shared template run for every simulated rank at
   once; declines a plan without a template, and a run whose levels leave the order;
   ``ring_chain`` (:mod:`.ring_chain`) — a ring all-reduce of one-element blocks as
   block chains, without Programs; declines any other plan, and a run where links are
   shared or a FIFO could hold a message back (the engines after it then run the plan
   the run had without chains);
2. ``alpha_beta`` (:mod:`.alpha_beta`) — the unaware model as a longest path, asked for
   with ``model="fast"``;
3. ``fixed_point`` (:mod:`.fixed_point`) — the aware model settled as a fixed point of
   arrays, where ranks send many messages at once; declines what does not settle;
4. ``rounds`` (:mod:`.rounds`) — the aware network carried a round at a time; declines
   a round that would leave the heap's order;
5. ``native`` (:mod:`.native`) — the aware heap compiled;
6. ``reference`` (:mod:`.reference`) — the event engine, every model, the specification.

An engine that declines after trying (:class:`~.contract.Declined`) leaves nothing
behind: the next starts from the job as it was (a batched plan is compiled for the
engines after it). A decline marked ``remember`` is kept with the compiled structure
(``Compiled.declined``, by engine and rules), so a sweep's other sizes skip it. One engine
is forced with ``ringtree sim --engine NAME`` or ``RINGTREE_SIM_ENGINE``; a forced engine
that declines is an error (:class:`EngineDeclined`), never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Callable

from ringtree import settings
from ringtree.sim.compile.compiled import Compiled
from ringtree.sim.engines.alpha_beta import AlphaBeta
from ringtree.sim.engines.batched import Batched
from ringtree.sim.engines.contract import Declined, Engine, Job, Outcome, Result
from ringtree.sim.engines.fixed_point import FixedPoint
from ringtree.sim.engines.native import NativeHeap
from ringtree.sim.engines.reference import Reference
from ringtree.sim.engines.ring_chain import RingChainEngine
from ringtree.sim.engines.rounds import RoundsEngine
from ringtree.sim.fold.choice import Plan
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Aware, Rules, Unaware

__all__ = ["ORDER", "ENGINES", "EngineDeclined", "run", "run_compiled", "engine", "forced"]

ORDER: tuple[Engine, ...] = (Batched(), RingChainEngine(), AlphaBeta(), FixedPoint(), RoundsEngine(),
                             NativeHeap(), Reference())
ENGINES: dict[str, Engine] = {e.name: e for e in ORDER}


class EngineDeclined(ValueError):
    """The engine forced (``--engine``, ``RINGTREE_SIM_ENGINE``) declined the run."""


def engine(name: str) -> Engine:
    """The engine called ``name``."""
    try:
        return ENGINES[name.lower()]
    except KeyError:
        raise ValueError(f"no simulator engine {name!r} (known: {', '.join(ENGINES)})"
                         ) from None


def forced(name: str | None = None) -> str | None:
    """The engine to force: ``name``, else ``RINGTREE_SIM_ENGINE`` (None: ``auto``)."""
    if name is None:
        name = settings.current().sim_engine
    return None if name in (None, "", "auto") else engine(name).name


def run(job: Job, force: str | None = None) -> tuple[Outcome, str]:
    """``job``'s answer and the name of the engine that gave it: the engines of
    :data:`ORDER` tried in turn (only ``force``, or ``RINGTREE_SIM_ENGINE``, if set).
    Why each one before it declined is appended to ``job.declined``."""
    name = forced(force)
    for e in (engine(name),) if name else ORDER:
        why = e.accepts(job, job.rules)
        if why is None:
            got = e.run(job)
            if isinstance(got, Outcome):
                return got, e.name
            assert isinstance(got, Declined)
            why = got.reason
            if got.remember:
                job.compiled.declined[(e.name, job.rules)] = why
        job.declined.append((e.name, why))
    raise EngineDeclined(f"engine {name} declines: {job.declined[-1][1]}" if name else
                         "every engine declined: " + "; ".join(f"{n}: {w}" for n, w in
                                                               job.declined))


def run_compiled(cp: Compiled, topo: Topology, devices: list[int],
                 model: str | Aware | Unaware | Rules, *, trace: bool = False,
                 progress: Callable[[int], None] | None = None,
                 engine: str | None = None) -> Result:
    """Every step's times of compiled Programs (``devices[r]``: the device of real or
    virtual rank r) under ``model``, without the topology's launch cost: the first engine
    of :data:`ORDER` that accepts and keeps them, or ``engine``."""
    rules = model if isinstance(model, Rules) else Rules.of(model, topo)
    job = Job(Plan(cp, devices), topo, rules, trace, progress)
    out, _ = run(job, engine)
    if out.result is None:
        raise EngineDeclined(f"engine {engine} keeps no step times")
    if trace:
        out.result.compiled, out.result.devices = cp, devices
    return out.result
