"""The paged block pool: fixed blocks, ref counts, hash-chained prefix caching, pins.

Design (vLLM v1 prefix caching, ``vllm/v1/core/block_pool.py``; PagedAttention, Kwon et
al., SOSP 2023):

- ``num_blocks`` blocks of ``block_size`` tokens are made once. A request's block table
  lists block ids; the KV tensors of every tensor-parallel rank are indexed by the same
  ids, so one pool (on the scheduler) decides for all ranks.
- A *full* block is named by ``hash(parent_hash, its tokens)`` (:func:`block_hashes`),
  so a hash names the whole prefix up to and including that block. Equal prefixes find
  the same blocks; a one-token difference changes that block's hash and all after it.
  Partial blocks have no hash and are never shared.
- A block is *free* (no content), *in use* (ref count > 0), *evictable* (cached, ref 0)
  or *pinned* (cached, kept even at ref 0). Allocation takes a free block, else the
  eviction policy's victim; both are O(1). Releasing a request's blocks walks its table
  in reverse, so the deepest block of a chain becomes evictable first.
- Pinning (vLLM PRs #27046/#27097): a prefix's block hashes are pinned, capped at
  ``pin_cap_ratio`` of the pool; pinned blocks are never evicted until unpinned.

Metrics are in tokens (``vllm:prefix_cache_queries/hits``): cumulative and per run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, fields

from ringtree.apps.kvcache.lfu import LFUPolicy
from ringtree.apps.kvcache.lru import EvictionPolicy, LRUPolicy

ROOT_HASH = b"ringtree-kv-root"
POLICIES: dict[str, type] = {"lru": LRUPolicy, "lfu": LFUPolicy}


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The 16-byte BLAKE2b digest of a parent block's hash and this block's token ids."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens))
    return h.digest()


def block_hashes(tokens: Sequence[int], block_size: int, parent: bytes = ROOT_HASH,
                 start: int = 0) -> list[bytes]:
    """Chained hashes of every full block of ``tokens``, beginning at block ``start``
    whose parent hash is ``parent``."""
    out = []
    for b in range(start, len(tokens) // block_size):
        parent = block_hash(parent, tokens[b * block_size:(b + 1) * block_size])
        out.append(parent)
    return out


def ideal_hit_tokens(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """The most prefix-cache hit tokens block-granular caching can get on ``prompts``
    served in order: an unbounded cache, each prompt hitting every full block (one
    token short of its end) whose chained hash an earlier prompt produced."""
    seen: set[bytes] = set()
    total = 0
    for p in prompts:
        hashes = block_hashes(p, block_size)
        for h in hashes[:(len(p) - 1) // block_size]:
            if h not in seen:
                break
            total += block_size
        seen.update(hashes)
    return total


@dataclass
class CacheMetrics:
    """Token-granular prefix cache counters (``hit_tokens / query_tokens`` = hit rate)."""

    query_tokens: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    evicted_blocks: int = 0
    evicted_tokens: int = 0
    pinned_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def as_dict(self) -> dict[str, int | float]:
        d: dict[str, int | float] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["hit_rate"] = self.hit_rate
        return d


class PoolExhausted(RuntimeError):
    """Asked for more blocks than are free or evictable."""


class BlockPool:
    """``num_blocks`` KV blocks with ref counts, a prefix-hash index and an eviction
    policy (``"lru"``, ``"lfu"`` or an :class:`EvictionPolicy` instance)."""

    def __init__(self, num_blocks: int, block_size: int,
                 policy: str | EvictionPolicy = "lru", *, prefix_cache: bool = True,
                 pin_cap_ratio: float = 0.2):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= pin_cap_ratio <= 1.0:
            raise ValueError(f"pin_cap_ratio must be in [0, 1], got {pin_cap_ratio}")
        if isinstance(policy, str):
            if policy not in POLICIES:
                raise ValueError(f"unknown eviction policy {policy!r}; "
                                 f"choose from {sorted(POLICIES)}")
            policy = POLICIES[policy]()
        self.num_blocks, self.block_size = num_blocks, block_size
        self.policy: EvictionPolicy = policy
        self.prefix_cache = prefix_cache
        self.ref = [0] * num_blocks
        self.hash: list[bytes | None] = [None] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))   # stack; block 0 on top
        self._cached: dict[bytes, int] = {}
        self._pinned: set[bytes] = set()
        self.pin_cap_blocks = int(pin_cap_ratio * num_blocks)
        self.metrics = CacheMetrics()
        self.run = CacheMetrics()

    # ---- state ---------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (free plus evictable)."""
        return len(self._free) + len(self.policy)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def is_pinned(self, block: int) -> bool:
        h = self.hash[block]
        return h is not None and h in self._pinned

    def reset_run(self) -> None:
        """Start a new per-run metrics window (cumulative ``metrics`` keep counting)."""
        self.run = CacheMetrics()

    def _count(self, **deltas: int) -> None:
        for m in (self.metrics, self.run):
            for k, v in deltas.items():
                setattr(m, k, getattr(m, k) + v)

    # ---- lookup and references -----------------------------------------------------

    def match(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes`` (no references taken)."""
        if not self.prefix_cache:
            return []
        out = []
        for h in hashes:
            b = self._cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def evictable_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are evictable now (an acquire would take them out)."""
        return sum(1 for b in blocks if b in self.policy)

    def acquire(self, blocks: Sequence[int]) -> None:
        """Take a reference on each matched block (a prefix hit)."""
        for b in blocks:
            if self.ref[b] == 0 and b in self.policy:
                self.policy.remove(b)
            self.ref[b] += 1
            self.policy.touch(b)

    def record_query(self, query_tokens: int, hit_tokens: int) -> None:
        self._count(query_tokens=query_tokens, hit_tokens=hit_tokens,
                    miss_tokens=query_tokens - hit_tokens)

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with ref count 1, evicting cached blocks if needed."""
        if n > self.num_free:
            raise PoolExhausted(f"need {n} blocks, {self.num_free} free or evictable "
                                f"of {self.num_blocks}")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b = self.policy.victim()
                self._evict(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def _evict(self, b: int) -> None:
        h = self.hash[b]
        assert h is not None and self.ref[b] == 0
        del self._cached[h]
        self.policy.forget(b)
        self.hash[b] = None
        self._count(evicted_blocks=1, evicted_tokens=self.block_size)

    def commit(self, block: int, h: bytes) -> None:
        """``block`` is now full with the prefix named ``h``: make it findable.

        If another block already holds ``h`` (two requests computed the same prefix at
        once) the index keeps that one and ``block`` stays private to its request.
        """
        if not self.prefix_cache or h in self._cached or self.hash[block] is not None:
            return
        self._cached[h] = block
        self.hash[block] = h
        if h in self._pinned:
            self._count(pinned_tokens=self.block_size)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference per block, deepest first (reverse of the block table)."""
        for b in reversed(blocks):
            if self.ref[b] <= 0:
                raise ValueError(f"block {b} released more often than acquired")
            self.ref[b] -= 1
            if self.ref[b]:
                continue
            h = self.hash[b]
            if h is None:
                self._free.append(b)
            elif h not in self._pinned:
                self.policy.add(b)

    # ---- pinning -------------------------------------------------------------------

    def pin(self, hashes: Sequence[bytes]) -> int:
        """Pin a prefix's block hashes (present now or cached later); returns how many
        are pinned in all. Raises ``ValueError`` past the pin cap, pinning nothing."""
        new = [h for h in dict.fromkeys(hashes) if h not in self._pinned]
        if len(self._pinned) + len(new) > self.pin_cap_blocks:
            raise ValueError(
                f"pinning {len(new)} more blocks would exceed the pin cap of "
                f"{self.pin_cap_blocks} blocks ({len(self._pinned)} pinned)")
        for h in new:
            self._pinned.add(h)
            b = self._cached.get(h)
            if b is not None:
                self._count(pinned_tokens=self.block_size)
                if b in self.policy:
                    self.policy.remove(b)
        return len(self._pinned)

    def unpin_all(self) -> None:
        """Release every pin; pinned blocks nobody uses become evictable."""
        for h in self._pinned:
            b = self._cached.get(h)
            if b is not None:
                self._count(pinned_tokens=-self.block_size)
                if self.ref[b] == 0:
                    self.policy.add(b)
        self._pinned.clear()
