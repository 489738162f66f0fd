"""Registry of algorithms: ``(collective, algorithm) -> Algorithm``, one record each.

A record holds the generator (a pure function ``gen(nranks, rank, opts) -> Program``), its
per-size options, the tuner's refinement for pipelined schedules, where it may run, and
its printed cost. Adding an algorithm is one new module that decorates its generators with
:func:`register` and one import line in ``ringtree/schedules/__init__.py``; the planner,
the tuner and the simulator read the record and name no algorithm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from ringtree.ir.check import CheckReport, check_programs
from ringtree.ir.program import Collective, Program, parse_collective
from ringtree.ir.wire import algo_code


@dataclass(frozen=True)
class Options:
    """Inputs a generator may use beyond (nranks, rank).

    ``root``: root rank of rooted collectives. ``channels``: parallel channels to spread
    data over. ``nodes``: node id of every rank (from the host identities published at
    rendezvous), for hierarchical algorithms; ``None`` means one node. ``params``: extra
    algorithm-specific knobs as sorted (key, value) pairs so Options stays hashable.
    """

    root: int = 0
    channels: int = 1
    nodes: tuple[int, ...] | None = None
    params: tuple[tuple[str, object], ...] = field(default=())

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """Hashed once: ``nodes`` has an entry per rank, and every rank's generator call
        is looked up by its Options (hashing it per call made n calls O(n²))."""
        return hash((self.root, self.channels, self.nodes, self.params))


Generator = Callable[[int, int, Options], Program]
Sized = Callable[[int, Options], Options]
Fill = Callable[[int, Options], float]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of one collective: everything the planner, the tuner, the simulator
    and ``ringtree algo list`` know about it, in one place (NCCL keeps the same facts
    apart: the algorithm's kernel, its entry in ``src/graph/tuning.cc``'s latency and
    bandwidth tables, and the checks that disable it per communicator).

    - ``generate(nranks, rank, opts) -> Program``: the schedule, a pure function;
    - ``sized(nbytes, opts) -> Options``: the options a call of ``nbytes`` runs with
      (hierarchical's pieces); None: ``opts`` as given. Every reader refines options
      through :meth:`options`, so the Program the planner runs, the one the tuner prices
      and the one the simulator times are the same;
    - ``fill(nranks, opts) -> float``: the tuner's refinement for a schedule pipelined in
      pieces: the part of the shorter of the intra-host and link phases that does not
      overlap the longer (1: one after the other; None: always 1);
    - ``switch``: it runs on an in-network aggregation switch (CollNet), so it is
      eligible only where a switch was set up, is never timed by the online choice,
      and yields to a host algorithm for calls the switch cannot reduce; ``"nvlink"``:
      on an NVSwitch (NVLS), which only the simulator models;
    - ``cost``: its α-β-γ cost as ``ringtree algo list`` prints it (p ranks, n bytes,
      s slices), for people: the tuner reads the Programs instead
      (:mod:`ringtree.schedules.stats`).
    """

    collective: Collective
    name: str
    generate: Generator
    cost: str = ""
    sized: Sized | None = None
    fill: Fill | None = None
    switch: bool | str = False
    tuned: bool = True  # the tuner offers it unasked (False: it runs where named)

    def options(self, nbytes: int, opts: Options) -> Options:
        """The options a call of ``nbytes`` runs with: ``opts`` refined by ``sized``."""
        return opts if self.sized is None else self.sized(nbytes, opts)

    def overlap(self, nranks: int, opts: Options) -> float:
        """``fill`` at (nranks, opts), or 1 (phases one after the other)."""
        return 1.0 if self.fill is None else self.fill(nranks, opts)


_RECORDS: dict[tuple[Collective, str], Algorithm] = {}


def register(collective: Collective | str, algo: str, *, cost: str = "",
             sized: Sized | None = None, fill: Fill | None = None,
             switch: bool | str = False, tuned: bool = True
             ) -> Callable[[Generator], Generator]:
    """Decorator: make ``gen`` the ``algo`` schedule of ``collective``, with the other
    fields of its :class:`Algorithm` record. Adding an algorithm is its module and one
    import line in ``ringtree/schedules/__init__.py``: nothing outside ``schedules/``
    names it."""
    coll = parse_collective(collective)

    def deco(gen: Generator) -> Generator:
        key = (coll, algo.lower())
        if key in _RECORDS:
            raise ValueError(f"algorithm {algo!r} registered twice for {coll.value}")
        _RECORDS[key] = Algorithm(coll, key[1], gen, cost, sized, fill, switch, tuned)
        algo_code(key[1])  # so a mismatch names it
        return gen

    return deco


def _lookup(collective: Collective | str, algo: str) -> Algorithm | None:
    """The record of ``algo``; an ``msccl:`` name (an MSCCL-IR file) is read, proven and
    registered the first time (:mod:`ringtree.msccl.catalog`), a ``synth:`` forest file
    read and registered (:mod:`ringtree.schedules.synth`)."""
    coll = parse_collective(collective)
    rec = _RECORDS.get((coll, algo.lower()))
    if rec is None and algo.lower().startswith("msccl:"):
        from ringtree.msccl.catalog import resolve

        entry = resolve(algo)
        if entry.collective is not coll:
            raise ValueError(f"{algo} is an MSCCL-IR {entry.collective.value}, not "
                             f"{coll.value}")
        rec = _RECORDS.get((coll, entry.name))
    elif rec is None and algo.lower().startswith("synth:"):
        from ringtree.schedules.synth import resolve as synthesized

        rec = _RECORDS.get((coll, synthesized(algo)))
    return rec


def unregister(collective: Collective | str, algo: str) -> None:
    """Forget ``algo`` (an algorithm registered at run time: an MSCCL-IR file)."""
    key = (parse_collective(collective), algo.lower())
    _RECORDS.pop(key, None)
    _generate.cache_clear()


def record(collective: Collective | str, algo: str) -> Algorithm:
    """The :class:`Algorithm` registered as ``algo`` for ``collective``."""
    coll = parse_collective(collective)
    rec = _lookup(coll, algo)
    if rec is None:
        known = ", ".join(algorithms(coll)) or "none"
        raise ValueError(f"no algorithm {algo!r} for {coll.value} (known: {known})")
    return rec


def options_for(collective: Collective | str, algo: str, nbytes: int,
                opts: Options) -> Options:
    """The options ``algo`` generates a call of ``nbytes`` with: ``opts`` refined by the
    algorithm's per-size rule (hierarchical's pieces), or ``opts`` itself (also for a
    name that is not registered, which :func:`generate` then reports)."""
    rec = _lookup(collective, algo)
    return opts if rec is None else rec.options(nbytes, opts)


def needs_switch(collective: Collective | str, algo: str) -> bool:
    """Does ``algo`` run on an in-network aggregation switch (``Algorithm.switch``)?"""
    rec = _lookup(collective, algo)
    return rec is not None and bool(rec.switch)


def generator(collective: Collective | str, algo: str) -> Generator | None:
    """The registered generator (None if there is none)."""
    rec = _lookup(collective, algo)
    return None if rec is None else rec.generate


def cost(collective: Collective | str, algo: str) -> str:
    """The cost ``algo`` was registered with ('' if none, or not registered)."""
    rec = _lookup(collective, algo)
    return "" if rec is None else rec.cost


def algorithms(collective: Collective | str | None = None) -> list[str]:
    """Names of the algorithms registered for ``collective`` (all algorithms if None)."""
    if collective is None:
        return sorted({a for _, a in _RECORDS})
    coll = parse_collective(collective)
    return sorted(a for c, a in _RECORDS if c is coll)


def has(collective: Collective | str, algo: str) -> bool:
    return _lookup(collective, algo) is not None


@lru_cache(maxsize=4096)
def _generate(coll: Collective, algo: str, nranks: int, rank: int, opts: Options) -> Program:
    return _RECORDS[(coll, algo)].generate(nranks, rank, opts)


def generate(collective: Collective | str, algo: str, nranks: int, rank: int,
             opts: Options | None = None) -> Program:
    """The Program of ``rank`` for ``collective`` run with ``algo`` over ``nranks`` ranks."""
    rec = record(collective, algo)
    if nranks < 1 or not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} out of range for {nranks} ranks")
    opts = opts or Options()
    if not 0 <= opts.root < nranks:
        raise ValueError(f"root {opts.root} out of range for {nranks} ranks")
    return _generate(rec.collective, rec.name, nranks, rank, opts)


def build(collective: Collective | str, algo: str, nranks: int, rank: int, nbytes: int,
          opts: Options | None = None) -> Program:
    """The Program ``rank`` runs for a call of ``nbytes`` (the larger of the input and
    output buffers, as the planner sizes a call) with ``algo`` over ``nranks`` ranks:
    :func:`generate` with the options the algorithm's record refines ``opts`` to for
    that size. The one way the planner builds a call's Program, and the way the
    simulator and the online choice must, so all three run the same schedule."""
    return generate(collective, algo, nranks, rank,
                    options_for(collective, algo, nbytes, opts or Options()))


def build_all(collective: Collective | str, algo: str, nranks: int, nbytes: int,
              opts: Options | None = None) -> list[Program]:
    """:func:`build` for every rank."""
    return generate_all(collective, algo, nranks,
                        options_for(collective, algo, nbytes, opts or Options()))


def generate_all(collective: Collective | str, algo: str, nranks: int,
                 opts: Options | None = None) -> list[Program]:
    """Programs of every rank (what the checker, simulator and visualizer read)."""
    return [generate(collective, algo, nranks, r, opts) for r in range(nranks)]


def check(collective: Collective | str, algo: str, nranks: int,
          opts: Options | None = None) -> list[CheckReport]:
    """Check a registered algorithm out of place and (when it allows) in place
    (:func:`ringtree.ir.check.check_programs`)."""
    programs = generate_all(collective, algo, nranks, opts)
    reports = [check_programs(programs, in_place=False)]
    if all(p.in_place_ok for p in programs) and programs[0].collective.spec.in_place:
        reports.append(check_programs(programs, in_place=True))
    return reports
