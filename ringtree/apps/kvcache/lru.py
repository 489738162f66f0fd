"""LRU in O(1): a doubly linked list for recency plus a hash map from key to list node.

This is the classic structure (and vLLM v1's ``FreeKVCacheBlockQueue``): the map finds a
key's node in O(1), the list moves, inserts or unlinks it in O(1) with fake head and tail
sentinels, and the least recently used key is always the first real node.

:class:`LRUCache` is the general key → value cache (get / put / evict). :class:`LRUPolicy`
is the same list used as a KV-cache :class:`EvictionPolicy`: it orders *evictable* blocks
(cached, no request holds them, not pinned) and names the victim when the pool needs room.

Every structural step (map lookup or update, pointer relink) increments ``ops``, so tests
show the O(1) bound by counting operations instead of timing them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any, Protocol


class EvictionPolicy(Protocol):
    """Orders the evictable blocks of a :class:`~ringtree.apps.kvcache.pool.BlockPool`.

    A block enters with :meth:`add` when its last reference is dropped, leaves with
    :meth:`remove` when a request hits it again, and :meth:`victim` removes and returns
    the block to evict. :meth:`touch` records a hit (frequency-based policies use it).
    """

    ops: int

    def add(self, block: int) -> None: ...
    def remove(self, block: int) -> None: ...
    def victim(self) -> int: ...
    def touch(self, block: int) -> None: ...
    def forget(self, block: int) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, block: object) -> bool: ...


class _Node:
    __slots__ = ("key", "value", "prev", "next")

    def __init__(self, key: Any = None, value: Any = None):
        self.key, self.value = key, value
        self.prev: _Node = self
        self.next: _Node = self


class LinkedMap:
    """Hash map + doubly linked list with sentinels; the front is the oldest entry."""

    def __init__(self) -> None:
        self._head = _Node()               # sentinel: head.next is the oldest node
        self._map: dict[Hashable, _Node] = {}
        self.ops = 0

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        self.ops += 1
        return key in self._map

    def __iter__(self) -> Iterator[Any]:
        """Keys from oldest to newest."""
        node = self._head.next
        while node is not self._head:
            yield node.key
            node = node.next

    def _link_back(self, node: _Node) -> None:
        tail = self._head.prev
        node.prev, node.next = tail, self._head
        tail.next = node
        self._head.prev = node
        self.ops += 1

    def _unlink(self, node: _Node) -> None:
        node.prev.next = node.next
        node.next.prev = node.prev
        self.ops += 1

    def push_back(self, key: Hashable, value: Any = None) -> None:
        """Insert ``key`` as the newest entry (or move it there and replace its value)."""
        self.ops += 1
        node = self._map.get(key)
        if node is None:
            node = _Node(key, value)
            self._map[key] = node
        else:
            self._unlink(node)
            node.value = value
        self._link_back(node)

    def move_back(self, key: Hashable) -> Any:
        """Make ``key`` the newest entry; returns its value (KeyError if absent)."""
        self.ops += 1
        node = self._map[key]
        self._unlink(node)
        self._link_back(node)
        return node.value

    def pop(self, key: Hashable) -> Any:
        self.ops += 1
        node = self._map.pop(key)
        self._unlink(node)
        return node.value

    def pop_front(self) -> tuple[Any, Any]:
        """Remove and return the oldest ``(key, value)`` (KeyError when empty)."""
        node = self._head.next
        if node is self._head:
            raise KeyError("pop_front from an empty LinkedMap")
        self._unlink(node)
        self.ops += 1
        del self._map[node.key]
        return node.key, node.value

    def front(self) -> Hashable:
        if not self._map:
            raise KeyError("front of an empty LinkedMap")
        return self._head.next.key


class _OnLinkedMap:
    """Size, membership and the operation count of the :class:`LinkedMap` ``_list``."""

    _list: LinkedMap

    @property
    def ops(self) -> int:
        return self._list.ops

    def __len__(self) -> int:
        return len(self._list)

    def __contains__(self, key: object) -> bool:
        return key in self._list


class LRUCache(_OnLinkedMap):
    """A bounded key → value cache evicting the least recently used key, all O(1)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"LRUCache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._list = LinkedMap()
        self.evictions = 0

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        return list(self._list)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for ``key`` (now the most recently used), or ``default``."""
        if key not in self._list:
            return default
        return self._list.move_back(key)

    def put(self, key: Hashable, value: Any) -> tuple[Hashable, Any] | None:
        """Insert or update ``key``; returns the evicted ``(key, value)`` if one was."""
        evicted = None
        if key not in self._list and len(self._list) >= self.capacity:
            evicted = self.evict()
        self._list.push_back(key, value)
        return evicted

    def evict(self) -> tuple[Hashable, Any]:
        """Remove and return the least recently used entry."""
        self.evictions += 1
        return self._list.pop_front()

    def pop(self, key: Hashable) -> Any:
        return self._list.pop(key)


class LRUPolicy(_OnLinkedMap):
    """Evict the block whose last reference was dropped longest ago (vLLM's default).

    Blocks freed together are added in reverse chain order by the pool, so within one
    request the deepest block goes first and shared prefixes outlive their suffixes.
    """

    name = "lru"

    def __init__(self) -> None:
        self._list = LinkedMap()

    def order(self) -> list[int]:
        """Evictable blocks, next victim first."""
        return list(self._list)

    def add(self, block: int) -> None:
        self._list.push_back(block)

    def remove(self, block: int) -> None:
        self._list.pop(block)

    def victim(self) -> int:
        if not len(self._list):
            raise LookupError("no evictable block")
        return self._list.pop_front()[0]

    def touch(self, block: int) -> None:
        """Recency is set when the block is re-added; a hit needs no bookkeeping here."""

    def forget(self, block: int) -> None:
        """The block's cached content is gone; LRU keeps nothing about absent blocks."""
