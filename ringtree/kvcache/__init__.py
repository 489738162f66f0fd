"""A paged KV cache with hash-chained prefix caching and pluggable eviction.

- :mod:`ringtree.kvcache.lru`: the O(1) LRU (linked list + hash map) and the
  :class:`EvictionPolicy` interface;
- :mod:`ringtree.kvcache.lfu`: an O(1) LFU policy;
- :mod:`ringtree.kvcache.pool`: the block pool (ref counts, prefix index, pins, metrics).
"""

from ringtree.kvcache.lfu import LFUPolicy
from ringtree.kvcache.lru import EvictionPolicy, LinkedMap, LRUCache, LRUPolicy
from ringtree.kvcache.pool import (
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
