"""LFU in O(1): per-frequency LRU lists plus a bitmap of non-empty frequencies.

The O(1) LFU of Shah, Mitra and Matani ("An O(1) algorithm for implementing the LFU
cache eviction scheme", 2010) keeps one list per access count. Here a block leaves the
evictable set while requests use it and comes back with a count that may have grown by
more than one, so the next non-empty frequency is not always a neighbour. Counts are
therefore capped at :data:`MAX_COUNT` (255, the width of Redis's LFU counter) and a
Python int bitmap marks the non-empty lists: the least frequent list is the lowest set
bit, ``(mask & -mask).bit_length() - 1``, one word-level operation.

Ties within a frequency go to the least recently released block (each list is a
:class:`~ringtree.apps.kvcache.lru.LinkedMap`). Counts survive while a block stays cached,
across any number of reuse cycles, and are dropped by :meth:`LFUPolicy.forget` when the
pool evicts or overwrites the block.
"""

from __future__ import annotations

from ringtree.apps.kvcache.lru import LinkedMap

MAX_COUNT = 255


class LFUPolicy:
    """Evict the evictable block with the fewest hits (then the least recently freed)."""

    name = "lfu"

    def __init__(self) -> None:
        self._lists = [LinkedMap() for _ in range(MAX_COUNT + 1)]
        self._mask = 0                     # bit f set <=> self._lists[f] is non-empty
        self._count: dict[int, int] = {}   # access count of every cached block seen
        self._where: dict[int, int] = {}   # evictable block -> the count list it is in
        self._ops = 0

    @property
    def ops(self) -> int:
        return self._ops + sum(lst.ops for lst in self._lists)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block: object) -> bool:
        self._ops += 1
        return block in self._where

    def count(self, block: int) -> int:
        """The block's access count (1 when first cached)."""
        return self._count.get(block, 1)

    def order(self) -> list[int]:
        """Evictable blocks, next victim first."""
        out: list[int] = []
        for lst in self._lists:
            out.extend(lst)
        return out

    def add(self, block: int) -> None:
        self._ops += 2
        f = self._count.setdefault(block, 1)
        self._lists[f].push_back(block)
        self._where[block] = f
        self._mask |= 1 << f

    def remove(self, block: int) -> None:
        self._ops += 2
        f = self._where.pop(block)
        lst = self._lists[f]
        lst.pop(block)
        if not len(lst):
            self._mask &= ~(1 << f)

    def victim(self) -> int:
        if not self._mask:
            raise LookupError("no evictable block")
        self._ops += 2
        f = (self._mask & -self._mask).bit_length() - 1
        lst = self._lists[f]
        block = lst.pop_front()[0]
        if not len(lst):
            self._mask &= ~(1 << f)
        del self._where[block]
        return block

    def touch(self, block: int) -> None:
        """One more hit on ``block`` (moves it to the next list if it is evictable)."""
        self._ops += 2
        f = min(self._count.get(block, 1) + 1, MAX_COUNT)
        if block in self._where:
            self.remove(block)
            self._count[block] = f
            self.add(block)
        else:
            self._count[block] = f

    def forget(self, block: int) -> None:
        """The block's content was evicted: its count starts again when re-cached."""
        self._ops += 1
        self._count.pop(block, None)
