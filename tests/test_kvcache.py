"""KV cache units: LRU/LFU order and O(1) cost, the block pool, hash chains, pins."""

from __future__ import annotations

import pytest

from ringtree.apps.kvcache import (
    BlockPool,
    LFUPolicy,
    LRUCache,
    LRUPolicy,
    PoolExhausted,
    block_hashes,
    ideal_hit_tokens,
)

# ---- LRU --------------------------------------------------------------------------


def test_lru_cache_order_and_eviction():
    c = LRUCache(3)
    for k in "abc":
        c.put(k, k.upper())
    assert c.keys() == ["a", "b", "c"]
    assert c.get("a") == "A"                       # a becomes most recent
    assert c.keys() == ["b", "c", "a"]
    assert c.put("d", "D") == ("b", "B")           # least recently used goes
    assert c.keys() == ["c", "a", "d"]
    c.put("c", "C2")                               # update refreshes
    assert c.keys() == ["a", "d", "c"] and c.get("c") == "C2"
    assert c.get("zz", 7) == 7 and c.evictions == 1
    with pytest.raises(ValueError, match="capacity"):
        LRUCache(0)


def _workload_ops(cache_size: int) -> int:
    c = LRUCache(cache_size)
    for i in range(cache_size):
        c.put(i, i)
    before = c.ops
    for i in range(100):                           # 100 gets, puts and evictions
        c.get(i % 50)
        c.put(cache_size + i, i)
    return c.ops - before


def test_lru_cache_cost_does_not_grow_with_size():
    assert _workload_ops(64) == _workload_ops(10_000) == _workload_ops(100_000)


@pytest.mark.parametrize("cls", [LRUPolicy, LFUPolicy])
def test_policy_cost_does_not_grow_with_size(cls):
    def ops(n: int) -> int:
        p = cls()
        for b in range(n):
            p.add(b)
        before = p.ops
        for i in range(100):
            p.touch(i)
            p.remove(i)
            p.add(i)
            p.add(p.victim())
        return p.ops - before

    assert ops(200) == ops(20_000)


def test_lru_policy_order():
    p = LRUPolicy()
    for b in (5, 3, 9):
        p.add(b)
    p.remove(3)
    p.add(3)
    assert p.order() == [5, 9, 3]
    assert [p.victim(), p.victim(), p.victim()] == [5, 9, 3]
    with pytest.raises(LookupError):
        p.victim()


def test_lfu_policy_order_counts_and_ties():
    p = LFUPolicy()
    for b in (1, 2, 3, 4):
        p.add(b)
    p.touch(3)                          # 3 and 1 hit while evictable
    p.touch(3)
    p.touch(1)
    p.remove(2)                         # 2 is reused (hit) twice, then freed again
    p.touch(2)
    p.touch(2)
    p.add(2)
    assert p.count(4) == 1 and p.count(1) == 2 and p.count(2) == 3 == p.count(3)
    # fewest hits first; equal counts in the order they became evictable
    assert p.order() == [4, 1, 3, 2]
    assert [p.victim() for _ in range(4)] == [4, 1, 3, 2]
    p.forget(3)
    assert p.count(3) == 1              # evicted content starts counting again


# ---- hash chains ------------------------------------------------------------------


def test_hash_chain_same_prefix_same_hashes_one_token_changes_the_rest():
    a = list(range(64))
    b = list(a)
    b[37] = 999                         # inside block 2 (block size 16)
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(ha) == 4
    assert ha[:2] == hb[:2]
    assert all(x != y for x, y in zip(ha[2:], hb[2:]))
    assert block_hashes(a + [1, 2, 3], 16) == ha          # partial tail: no hash
    assert block_hashes(a[16:], 16)[0] != ha[1]           # position matters via the chain


def _prefill(pool: BlockPool, tokens: list[int]) -> list[int]:
    """A request's admission: hit the cached prefix, allocate the rest, commit."""
    bs = pool.block_size
    hashes = block_hashes(tokens, bs)
    hit = pool.match(hashes[:(len(tokens) - 1) // bs])
    pool.acquire(hit)
    pool.record_query(len(tokens), len(hit) * bs)
    blocks = hit + pool.allocate(-(-len(tokens) // bs) - len(hit))
    for b, h in zip(blocks, hashes):
        pool.commit(b, h)
    return blocks


def test_pool_prefix_hits_and_misses_in_tokens():
    pool = BlockPool(16, 4)
    a = list(range(10))                       # 2 full blocks + 2 tokens
    ba = _prefill(pool, a)
    assert pool.metrics.hit_tokens == 0 and pool.metrics.miss_tokens == 10
    b = a[:8] + [50, 51, 52, 53, 54]          # same 2 full blocks, different tail
    bb = _prefill(pool, b)
    assert bb[:2] == ba[:2] and bb[2] != ba[2]        # partial block never shared
    assert pool.metrics.hit_tokens == 8
    c = a[:5] + [77] + a[6:]                  # differs at token 5: block 1 on misses
    bc = _prefill(pool, c)
    assert bc[0] == ba[0] and bc[1] != ba[1]
    assert pool.metrics.hit_tokens == 12 and pool.metrics.query_tokens == 33
    assert pool.ref[ba[0]] == 3
    # a prompt that is exactly 2 full blocks hits only one: its last token is recomputed
    d = _prefill(pool, a[:8])
    assert d[0] == ba[0] and d[1] != ba[1]


def test_pool_ref_counted_blocks_are_never_evicted():
    pool = BlockPool(4, 2)
    held = _prefill(pool, [1, 2, 3, 4])              # 2 blocks, in use
    freed = _prefill(pool, [9, 8, 7, 6])             # 2 blocks, then released
    pool.release(freed)
    assert pool.num_free == 2 and pool.num_cached == 4
    got = pool.allocate(2)                           # must evict exactly the freed ones
    assert sorted(got) == sorted(freed)
    assert pool.metrics.evicted_blocks == 2 and pool.metrics.evicted_tokens == 4
    assert pool.match(block_hashes([1, 2, 3, 4], 2)) == held
    with pytest.raises(PoolExhausted):
        pool.allocate(1)
    with pytest.raises(ValueError, match="released more often"):
        pool.release([got[0], got[0]])


def test_pool_frees_deepest_block_first_and_uncached_blocks_first():
    pool = BlockPool(8, 2)
    blocks = _prefill(pool, [1, 2, 3, 4, 5, 6, 7])   # 3 full blocks + a partial one
    pool.release(blocks)
    # the partial block went back to the free list; cached ones wait, deepest first
    assert pool.policy.order() == blocks[:3][::-1]
    fresh = pool.allocate(5)
    assert pool.metrics.evicted_blocks == 0 and blocks[3] in fresh
    pool.allocate(1)
    assert pool.metrics.evicted_blocks == 1
    assert pool.match(block_hashes([1, 2, 3, 4, 5, 6], 2)) == blocks[:2]


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_pins_are_honoured_and_capped(policy):
    pool = BlockPool(10, 2, policy, pin_cap_ratio=0.3)    # at most 3 pinned blocks
    system = [1, 2, 3, 4, 5, 6]
    assert pool.pin(block_hashes(system, 2)) == 3
    pinned = _prefill(pool, system + [7])
    pool.release(pinned)
    assert pool.metrics.pinned_tokens == 6
    assert all(pool.is_pinned(b) for b in pinned[:3])
    for i in range(5):                                     # pressure: churn the rest
        pool.release(_prefill(pool, [100 + 10 * i + j for j in range(13)]))
    assert pool.metrics.evicted_blocks > 0
    assert pool.match(block_hashes(system, 2)) == pinned[:3]
    with pytest.raises(ValueError, match="pin cap of 3 blocks"):
        pool.pin(block_hashes([9, 9], 2))
    pool.unpin_all()
    assert pool.metrics.pinned_tokens == 0
    pool.allocate(pool.num_free)                           # now they can go
    assert pool.match(block_hashes(system, 2)) == []


def test_pool_without_prefix_cache_never_hits():
    pool = BlockPool(8, 2, prefix_cache=False)
    pool.release(_prefill(pool, [1, 2, 3, 4, 5]))
    assert _prefill(pool, [1, 2, 3, 4, 5]) and pool.metrics.hit_tokens == 0


def test_pool_bad_arguments():
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'"):
        BlockPool(4, 2, "fifo")
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, 2)
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(4, 0)


def test_ideal_hit_tokens():
    sys_prompt = list(range(40))
    prompts = [sys_prompt + [100 + i] * 5 for i in range(4)]
    # block 16: 2 shared full blocks; requests 1..3 hit 32 tokens each
    assert ideal_hit_tokens(prompts, 16) == 96
    assert ideal_hit_tokens([[1, 2, 3]] * 3, 16) == 0
