"""Continuous-batching scheduler over a :class:`~ringtree.apps.kvcache.pool.BlockPool`.

One scheduler per replica (on its first tensor-parallel rank) makes each step's decision
— which sequences run, which tokens each computes, and its block table — and the engine
ships that :class:`Plan` to the other ranks, so every rank writes the same blocks.

Per step (the policy of vLLM's v1 scheduler, without chunked prefill):

1. Running requests decode one token each, oldest first. One that needs a new block
   and finds none preempts the *newest* running request (its blocks are released, it
   returns to the front of the queue and is recomputed later), itself if it is newest.
2. If nothing was preempted, waiting requests are admitted in order while the batch,
   the step's prefill-token budget and the pool allow. Admission looks up the longest
   cached prefix of full blocks (capped one token short of the sequence, so the last
   token is computed and yields logits), takes references on those blocks and
   allocates the rest. The first one that does not fit stops admission (FIFO).
3. Blocks the step will fill are indexed by their chained hashes when planned (see
   :meth:`Scheduler._commit`). After the model step, :meth:`Scheduler.update` appends
   each sampled token and frees finished requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ringtree.apps.kvcache.pool import ROOT_HASH, BlockPool, block_hashes


@dataclass
class Request:
    """One generation request and its progress."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0           # seconds after serving starts
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    num_computed: int = 0          # tokens whose keys/values are in the cache
    num_committed: int = 0         # leading blocks handed to the prefix index
    preemptions: int = 0
    prefill_computed: int = 0      # tokens computed by prefills (including recomputes)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


@dataclass
class SeqStep:
    """One sequence's share of a step: compute ``tokens`` at positions ``start...``."""

    seq: int
    start: int
    tokens: list[int]
    table: list[int]


@dataclass
class Plan:
    seqs: list[SeqStep]
    preempted: list[int] = field(default_factory=list)

    def encode(self) -> list[int]:
        """Flat int list: ``[n, (seq, start, ntok, nblk, tokens..., table...)*n]``."""
        out = [len(self.seqs)]
        for s in self.seqs:
            out += [s.seq, s.start, len(s.tokens), len(s.table)]
            out += s.tokens
            out += s.table
        return out

    @staticmethod
    def decode(flat: Sequence[int]) -> Plan:
        seqs, i = [], 1
        for _ in range(int(flat[0])):
            seq, start, nt, nb = (int(v) for v in flat[i:i + 4])
            i += 4
            toks = [int(v) for v in flat[i:i + nt]]
            i += nt
            table = [int(v) for v in flat[i:i + nb]]
            i += nb
            seqs.append(SeqStep(seq, start, toks, table))
        return Plan(seqs)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Scheduler:
    """Decides each step's batch and block allocations (see the module docstring)."""

    def __init__(self, pool: BlockPool, max_batch: int = 16, max_prefill_tokens: int = 2048):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.pool = pool
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.requests: dict[int, Request] = {}
        self.preemptions = 0

    def add(self, req: Request) -> None:
        if req.id in self.requests:
            raise ValueError(f"request {req.id} was already added")
        self.requests[req.id] = req
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _hashes(self, req: Request) -> list[bytes]:
        """Chained hashes of the request's full blocks (extended incrementally)."""
        toks = req.tokens
        if len(req.hashes) < len(toks) // self.pool.block_size:
            parent = req.hashes[-1] if req.hashes else ROOT_HASH
            req.hashes += block_hashes(toks, self.pool.block_size, parent, len(req.hashes))
        return req.hashes

    def _commit(self, req: Request) -> None:
        """Index the blocks this step fills. Their keys and values are written in each
        layer before any attention of that layer reads, so a request admitted in the
        same step may already share them."""
        hashes = self._hashes(req)
        for b in range(req.num_committed, len(hashes)):
            self.pool.commit(req.blocks[b], hashes[b])
        req.num_committed = len(hashes)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.release(req.blocks)
        req.blocks, req.num_computed, req.num_committed = [], 0, 0
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self) -> Plan:
        """The next step's plan (empty when nothing can run)."""
        bs = self.pool.block_size
        plan = Plan([])
        for req in list(self.running):
            if req not in self.running:          # preempted by an older request
                continue
            need = blocks_for(len(req.tokens), bs) - len(req.blocks)
            while need > self.pool.num_free:
                victim = self.running[-1]
                self._preempt(victim)
                plan.preempted.append(victim.id)
                if victim is req:
                    break
            if req not in self.running:
                continue
            req.blocks += self.pool.allocate(need)
            self._commit(req)
            plan.seqs.append(SeqStep(req.id, req.num_computed,
                                     req.tokens[req.num_computed:], list(req.blocks)))
        if plan.preempted:
            return plan
        budget = self.max_prefill_tokens
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            toks = req.tokens
            hit = self.pool.match(self._hashes(req)[:(len(toks) - 1) // bs])
            todo = len(toks) - len(hit) * bs
            if todo > budget and plan.seqs:
                break
            need = blocks_for(len(toks), bs) - len(hit)
            if need > self.pool.num_free - self.pool.evictable_among(hit):
                break
            self.waiting.popleft()
            self.pool.acquire(hit)
            self.pool.record_query(len(toks), len(hit) * bs)
            req.blocks = hit + self.pool.allocate(need)
            req.num_computed, req.num_committed = len(hit) * bs, len(hit)
            budget -= todo
            self._commit(req)
            self.running.append(req)
            plan.seqs.append(SeqStep(req.id, req.num_computed, toks[req.num_computed:],
                                     list(req.blocks)))
        return plan

    def update(self, plan: Plan, sampled: Sequence[int]) -> list[Request]:
        """Apply the step's sampled tokens (one per planned sequence, in order); returns
        the requests that finished."""
        if len(sampled) != len(plan.seqs):
            raise ValueError(f"{len(sampled)} sampled tokens for {len(plan.seqs)} sequences")
        done = []
        for s, tok in zip(plan.seqs, sampled):
            req = self.requests[s.seq]
            if len(s.tokens) > 1 or req.num_computed == 0:
                req.prefill_computed += len(s.tokens)
            req.num_computed = s.start + len(s.tokens)
            req.output.append(int(tok))
            if req.done:
                self.running.remove(req)
                self.pool.release(req.blocks)
                req.blocks = []
                self.finished.append(req)
                done.append(req)
        return done
