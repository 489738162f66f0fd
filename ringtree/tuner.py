"""Algorithm selection: ``RINGTREE_ALGO`` (NCCL_ALGO syntax) plus a small cost model.

Syntax (NCCL ``tuning.cc::parseList``): ``"ring,tree;allreduce:^tree;broadcast:ring"`` —
semicolon-separated entries; only the first may omit its ``collective:`` prefix and then
applies to every collective that has one of the listed algorithms; a list starting with ``^`` disables the listed algorithms
instead of enabling only them. Unknown collectives or algorithms are errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringtree.ir import Collective, parse_collective
from ringtree.schedules import algorithms

# The default algorithm of each collective, used when the cost model has no opinion.
DEFAULTS: dict[Collective, str] = {
    Collective.ALL_REDUCE: "ring",
    Collective.ALL_GATHER: "ring",
    Collective.REDUCE_SCATTER: "ring",
    Collective.BROADCAST: "ring",
    Collective.REDUCE: "ring",
    Collective.GATHER: "direct",
    Collective.SCATTER: "direct",
    Collective.ALL_TO_ALL: "pairwise",
    Collective.BARRIER: "dissemination",
}


def parse_algo_spec(spec: str) -> dict[Collective, set[str]]:
    """Enabled algorithms per collective after applying ``spec`` (all enabled initially)."""
    enabled = {c: set(algorithms(c)) for c in Collective}
    entries = [e.strip() for e in spec.split(";") if e.strip()]
    for i, entry in enumerate(entries):
        if ":" in entry:
            prefix, _, body = entry.partition(":")
            colls = [parse_collective(prefix.strip())]
        elif i == 0:
            colls, body = list(Collective), entry
        else:
            raise ValueError(f"RINGTREE_ALGO: all entries except the first must have a "
                             f"'collective:' prefix (got {entry!r})")
        body = body.strip()
        negate = body.startswith("^")
        names = {n.strip().lower() for n in body.lstrip("^").split(",") if n.strip()}
        known = set(algorithms())
        unknown = names - known
        if unknown:
            raise ValueError(f"RINGTREE_ALGO: unknown algorithm(s) {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        for c in colls:
            avail = set(algorithms(c))
            if negate:
                enabled[c] = avail - names
            elif ":" in entry or avail & names:
                # A prefix-less list only constrains collectives it names an algorithm of,
                # so "ring" does not disable gather's only algorithm.
                enabled[c] = avail & names
    return enabled


@dataclass(frozen=True)
class LinkModel:
    """α (s per message), β (s per byte), γ (s per byte reduced): defaults for loopback TCP
    between Python processes on one host, measured with ``ringtree perf``."""

    alpha: float = 40e-6
    beta: float = 1 / 1.5e9
    gamma: float = 1 / 4e9


def estimate(coll: Collective, algo: str, nbytes: int, n: int,
             m: LinkModel = LinkModel()) -> float:
    """Predicted seconds for ``algo`` (Thakur, Rabenseifner & Gropp 2005 formulas)."""
    if n == 1:
        return 0.0
    lg = math.ceil(math.log2(n))
    a, b, g = m.alpha, m.beta, m.gamma
    frac = (n - 1) / n
    if coll is Collective.ALL_REDUCE:
        return {
            "ring": 2 * (n - 1) * a + 2 * frac * nbytes * b + frac * nbytes * g,
            "recursive_doubling": lg * (a + nbytes * b + nbytes * g),
            "rabenseifner": 2 * lg * a + 2 * frac * nbytes * b + frac * nbytes * g,
            "direct": 2 * a + (n - 1) * nbytes * b + (n - 1) * nbytes * g,
            "tree": 2 * lg * a + 2 * nbytes * b + nbytes * g,
        }.get(algo, math.inf)
    return math.inf


def choose(coll: Collective, nbytes: int, n: int, enabled: set[str] | None) -> str:
    """The algorithm to run: the cheapest enabled one, else the collective's default."""
    cands = set(algorithms(coll)) if enabled is None else set(enabled)
    if not cands:
        raise ValueError(f"RINGTREE_ALGO leaves no algorithm enabled for {coll.value}")
    best = min(sorted(cands), key=lambda a: estimate(coll, a, nbytes, n))
    if math.isinf(estimate(coll, best, nbytes, n)):
        default = DEFAULTS.get(coll)
        return default if default in cands else sorted(cands)[0]
    return best
