"""Registry of schedule generators: ``(collective, algorithm) -> generator``.

A generator is a pure function ``gen(nranks, rank, opts) -> Program``. Adding an algorithm
is one new module that decorates its generators with :func:`register` and one import line
in ``ringtree/schedules/__init__.py``.
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

_REGISTRY: dict[tuple[Collective, str], Generator] = {}


_COSTS: dict[tuple[Collective, str], str] = {}
Sized = Callable[[int, Options], Options]
_SIZED: dict[tuple[Collective, str], Sized] = {}


def register(collective: Collective | str, algo: str, *, cost: str = "",
             sized: Sized | None = None) -> Callable[[Generator], Generator]:
    """Decorator: make ``gen`` the ``algo`` schedule for ``collective``; ``cost`` is its
    α-β-γ cost in the notation of ``ringtree algo list`` (p ranks, n bytes, s slices);
    ``sized(nbytes, opts)`` refines the options for a call of ``nbytes`` (read by
    :func:`options_for`, so the runtime and the simulator generate the same Program)."""
    coll = parse_collective(collective)

    def deco(gen: Generator) -> Generator:
        key = (coll, algo.lower())
        if key in _REGISTRY:
            raise ValueError(f"algorithm {algo!r} registered twice for {coll.value}")
        _REGISTRY[key] = gen
        _COSTS[key] = cost
        algo_code(key[1])  # so a mismatch names it
        if sized is not None:
            _SIZED[key] = sized
        return gen

    return deco


def options_for(collective: Collective | str, algo: str, nbytes: int,
                opts: Options) -> Options:
    """The options ``algo`` generates a call of ``nbytes`` with: ``opts`` refined by the
    algorithm's per-size rule (hierarchical's pieces), or ``opts`` itself."""
    sized = _SIZED.get((parse_collective(collective), algo.lower()))
    return opts if sized is None else sized(nbytes, opts)


def generator(collective: Collective | str, algo: str) -> Generator | None:
    """The registered generator (None if there is none)."""
    return _REGISTRY.get((parse_collective(collective), algo.lower()))


def cost(collective: Collective | str, algo: str) -> str:
    """The cost ``algo`` was registered with ('' if none, or not registered)."""
    return _COSTS.get((parse_collective(collective), algo.lower()), "")


def algorithms(collective: Collective | str | None = None) -> list[str]:
    """Names of the algorithms registered for ``collective`` (all algorithms if None)."""
    if collective is None:
        return sorted({a for _, a in _REGISTRY})
    coll = parse_collective(collective)
    return sorted(a for c, a in _REGISTRY if c is coll)


def has(collective: Collective | str, algo: str) -> bool:
    return (parse_collective(collective), algo.lower()) in _REGISTRY


@lru_cache(maxsize=4096)
def _generate(coll: Collective, algo: str, nranks: int, rank: int, opts: Options) -> Program:
    return _REGISTRY[(coll, algo)](nranks, rank, opts)


def generate(collective: Collective | str, algo: str, nranks: int, rank: int,
             opts: Options | None = None) -> Program:
    """The Program of ``rank`` for ``collective`` run with ``algo`` over ``nranks`` ranks."""
    coll = parse_collective(collective)
    key = (coll, algo.lower())
    if key not in _REGISTRY:
        known = ", ".join(algorithms(coll)) or "none"
        raise ValueError(f"no algorithm {algo!r} for {coll.value} (known: {known})")
    if nranks < 1 or not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} out of range for {nranks} ranks")
    opts = opts or Options()
    if not 0 <= opts.root < nranks:
        raise ValueError(f"root {opts.root} out of range for {nranks} ranks")
    return _generate(coll, key[1], nranks, rank, opts)


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
