"""Send each request to one of R replicas: cache-aware (prefix affinity) or round-robin.

The cache-aware router follows vLLM production-stack PR #1035 and SGLang's router
(sgl-project/sglang#2114): it keeps, per replica, an approximate picture of that
replica's cache built from the requests it routed there — the chained block hashes of
each prompt, in an :class:`~ringtree.apps.kvcache.lru.LRUCache` bounded by the replica's
pool — and scores

    score_r = matched_tokens_r / prompt_tokens − β · load_r / (mean_load + batch)

where ``matched_tokens_r`` is the longest block-aligned prefix of the prompt found in
replica r's picture and ``load_r`` its outstanding requests. The load is relative to
the mean plus one batch (``batch``: sequences a replica runs at once), so affinity wins
while a replica is less than about a batch ahead of the others and balance wins beyond
that; normalising by the total load instead would make the first request's replica
look fully loaded and alternate replicas from the start. The best score wins (ties to
the least loaded, then the lowest index). β = 1 as in the production stack.
"""

from __future__ import annotations

from collections.abc import Sequence

from ringtree.apps.kvcache.lru import LRUCache
from ringtree.apps.kvcache.pool import block_hashes

ROUTERS = ("cache", "round-robin")


class Router:
    def __init__(self, replicas: int, block_size: int, kind: str = "cache",
                 beta: float = 1.0, capacity_blocks: int = 1 << 16, batch: int = 16):
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if kind not in ROUTERS:
            raise ValueError(f"unknown router {kind!r}; choose from {list(ROUTERS)}")
        self.replicas, self.block_size, self.kind, self.beta = replicas, block_size, kind, beta
        self.batch = batch
        self.load = [0] * replicas
        self.seen = [LRUCache(capacity_blocks) for _ in range(replicas)]
        self._next = 0

    def matched_tokens(self, replica: int, hashes: Sequence[bytes]) -> int:
        seen, n = self.seen[replica], 0
        for h in hashes:
            if h not in seen:
                break
            n += 1
        return n * self.block_size

    def route(self, tokens: Sequence[int]) -> int:
        """The replica for a prompt; counts it as outstanding load there."""
        hashes = block_hashes(tokens, self.block_size)
        if self.kind == "round-robin":
            r = self._next
            self._next = (self._next + 1) % self.replicas
        else:
            norm = sum(self.load) / self.replicas + self.batch
            scores = [self.matched_tokens(i, hashes) / max(1, len(tokens))
                      - self.beta * self.load[i] / norm for i in range(self.replicas)]
            r = max(range(self.replicas), key=lambda i: (scores[i], -self.load[i], -i))
        for h in hashes:
            self.seen[r].get(h)          # refresh recency of the shared part
            self.seen[r].put(h, True)
        self.load[r] += 1
        return r

    def finished(self, replica: int) -> None:
        """A request on ``replica`` completed (its load drops)."""
        self.load[replica] -= 1


def route_all(prompts: Sequence[Sequence[int]], replicas: int, block_size: int,
              kind: str = "cache", beta: float = 1.0,
              capacity_blocks: int = 1 << 16, batch: int = 16) -> list[int]:
    """Replica of each prompt, routed in order (every request outstanding at once)."""
    router = Router(replicas, block_size, kind, beta, capacity_blocks, batch)
    return [router.route(p) for p in prompts]
