"""The simulator's caches of pure answers, one kind of object instead of a dict each.

What the compilers and the folding prove of a Program, a template or a topology does not
depend on the byte count, and a sweep asks it again at every size: each such question
keeps its last few answers in a :class:`Recent`, named for ``clear()``. Keys may hold
``id()`` s of objects the caller passes as ``held``: they are kept with the answer and
compared by identity on every read, so an id reused by a new object is never mistaken
for the old one. Nothing here changes an answer; it only saves asking again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Recent", "clear"]

CACHES: dict[str, Recent] = {}


class Recent:
    """The last ``keep`` answers by key (emptied when full: a sweep's working set is
    small, and an old answer is only ever recomputed)."""

    def __init__(self, name: str, keep: int) -> None:
        self.name, self.keep = name, keep
        self.kept: dict[Hashable, tuple[tuple, Any]] = {}
        CACHES[name] = self

    def peek(self, key: Hashable, *held: object) -> Any:
        """The answer kept under ``key`` for these ``held`` objects, else None."""
        got = self.kept.get(key)
        if got is None or len(got[0]) != len(held) or \
                any(a is not b for a, b in zip(got[0], held)):
            return None
        return got[1]

    def put(self, key: Hashable, value: Any, *held: object) -> Any:
        if len(self.kept) >= self.keep:
            self.kept.clear()
        self.kept[key] = (held, value)
        return value

    def lookup(self, key: Hashable, make: Callable[[], Any], *held: object) -> Any:
        """The kept answer, or ``make()`` kept (answers may be None: kept as such)."""
        got = self.kept.get(key)
        if got is not None and len(got[0]) == len(held) and \
                all(a is b for a, b in zip(got[0], held)):
            return got[1]
        return self.put(key, make(), *held)

    def clear(self) -> None:
        self.kept.clear()


def clear() -> None:
    """Forget every kept answer (memory back, nothing else changes)."""
    for c in CACHES.values():
        c.clear()
