"""A paged KV cache with hash-chained prefix caching and pluggable eviction.

- :mod:`ringtree.apps.kvcache.lru`: the O(1) LRU (linked list + hash map) and the
  :class:`EvictionPolicy` interface;
- :mod:`ringtree.apps.kvcache.lfu`: an O(1) LFU policy;
- :mod:`ringtree.apps.kvcache.pool`: the block pool (ref counts, prefix index, pins, metrics).
"""

from ringtree.apps.kvcache.lfu import LFUPolicy
from ringtree.apps.kvcache.lru import EvictionPolicy, LinkedMap, LRUCache, LRUPolicy
from ringtree.apps.kvcache.pool import (
    ROOT_HASH,
    BlockPool,
    CacheMetrics,
    PoolExhausted,
    block_hash,
    block_hashes,
    ideal_hit_tokens,
)

__all__ = [
    "ROOT_HASH", "BlockPool", "CacheMetrics", "EvictionPolicy", "LFUPolicy", "LRUCache",
    "LRUPolicy", "LinkedMap", "PoolExhausted", "block_hash", "block_hashes", "ideal_hit_tokens",
]
