"""What every engine is: the contract the dispatcher (:mod:`.dispatch`) runs them by.

An engine is an object with

- ``name``: how ``ringtree sim --engine`` / ``RINGTREE_SIM_ENGINE`` and ``-v`` call it;
- ``accepts(job, rules) -> str | None``: None when it can run ``job`` under ``rules``
  (:class:`~ringtree.sim.machine.model.Rules`) with exactly the reference engine's
  answer, else the reason it declines, read off the job before anything is run;
- ``run(job) -> Outcome | Declined``: the answer, or :class:`Declined` when the engine
  found out while running that it cannot keep the reference's order (the batched
  engine's levels, the rounds' links) or does not settle (the fixed point). A decline
  with ``remember`` set is kept with the compiled structure (``Compiled.declined``), so
  a sweep's other sizes of that structure skip the engine at once.

Every engine gives the reference engine's (:mod:`.reference`) floats, bit for bit;
``tests/test_sim_conformance.py`` runs each on every registered schedule against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ringtree.sim.compile.compiled import Compiled
from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.model import Rules

if TYPE_CHECKING:
    from ringtree.sim.fold.choice import Plan

__all__ = ["Result", "Outcome", "Declined", "Job", "Engine", "MANY_MSGS_PER_RANK",
           "aware_untraced", "many_at_once"]

# The array engines (fixed point, rounds) pay where ranks send many messages at once
# (one-shot and two-shot direct: 63 and 126 per channel on 64 ranks); a tree's rounds
# carry a few chunks each and cost more in array set-up than its heap events (tree 8 B on
# 131,072 ranks: 52 s in rounds, 29 s on the heap)
MANY_MSGS_PER_RANK = 64


@dataclass
class Result:
    """Every step's times of a run, as the reference engine leaves them. ``time_ns``:
    when the last rank finished."""

    time_ns: float
    rank_done: list[float]
    messages: int
    bytes: int
    events: int
    step_start: list[float]
    step_done: list[float]
    transfers: list[tuple[int, int, float, float, int]] | None = None  # msg, slice, t0, t1, B
    compiled: Compiled | None = None     # with ``trace``: what ran, and where
    devices: list[int] | None = None


@dataclass
class Outcome:
    """An engine's answer: the last rank's finish (without the launch cost), the chunks
    it carried, and every step's times where the engine keeps them (else None)."""

    time_ns: float
    events: int
    result: Result | None = None


@dataclass
class Declined:
    """An engine that stopped while running: why, and whether a sweep's other sizes of the
    same structure should skip it."""

    reason: str
    remember: bool = False


@dataclass
class Job:
    """One simulation as the engines see it: the plan (:class:`~.fold.choice.Plan`: a
    shared template, compiled Programs, or both), the topology, the rules, and what the
    caller wants besides the time (``trace``: every transfer; ``progress(events)``).
    ``compile()`` gives the compiled form of a plan that has only a template."""

    plan: Plan
    topo: Topology
    rules: Rules
    trace: bool = False
    progress: Callable[[int], None] | None = None
    compile: Callable[[], Plan] | None = None
    declined: list[tuple[str, str]] = field(default_factory=list)   # (engine, why)

    @property
    def devices(self) -> list[int]:
        return self.plan.devices

    @property
    def compiled(self) -> Compiled:
        """The compiled Programs (compiled now if the plan had only a template)."""
        if self.plan.compiled is None:
            if self.compile is None:
                raise ValueError("a template plan without a way to compile it")
            self.plan = self.compile()
        assert self.plan.compiled is not None
        return self.plan.compiled

    def many(self) -> bool:
        """Whether ranks send many messages at once (:data:`MANY_MSGS_PER_RANK`)."""
        cp = self.compiled
        return cp.nmsgs >= MANY_MSGS_PER_RANK * max(1, cp.nranks)

    def remembered(self, name: str) -> str | None:
        """Why ``name`` declined this structure under these rules before (None: it did
        not)."""
        return self.compiled.declined.get((name, self.rules))


def aware_untraced(job: Job, rules: Rules) -> str | None:
    """Why an engine of the aware network that keeps no transfers declines ``job`` (None:
    it need not)."""
    if not rules.aware or rules.alpha_beta:
        return "unaware model (no links to carry)"
    if job.trace:
        return "a trace keeps every transfer (the reference engine does)"
    return None


def many_at_once(job: Job, rules: Rules) -> str | None:
    """Why an array engine declines ``job``: :func:`aware_untraced`, or ranks sending few
    messages at once (:data:`MANY_MSGS_PER_RANK`; the heap is cheaper then)."""
    return aware_untraced(job, rules) or (None if job.many() else
                                          "few messages a rank (the heap is cheaper)")


class Engine(Protocol):
    """The engine contract (see the module's docstring)."""

    name: str

    def accepts(self, job: Job, rules: Rules) -> str | None: ...

    def run(self, job: Job) -> Outcome | Declined: ...
