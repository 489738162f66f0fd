"""Serving loop of one replica: the scheduler's rank plans, every rank computes.

Group rank 0 owns the :class:`~ringtree.apps.serve.scheduler.Scheduler` and its block pool.
Each step it broadcasts the encoded plan (``[-1]`` means stop), all ranks run
:meth:`TPEngine.forward`, and rank 0 applies the sampled tokens. A request joins the
scheduler at its ``arrival`` time (seconds after serving starts; 0 for a prompt file)
and its time to first token runs from then to the end of the step that produced its
first token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ringtree.apps.kvcache.pool import BlockPool, block_hashes
from ringtree.apps.models.gpt import GPTConfig
from ringtree.apps.serve.engine import TPEngine
from ringtree.apps.serve.scheduler import Plan, Request, Scheduler, blocks_for
from ringtree.apps.serve.tpcomm import TPComm

STOP = [-1]


@dataclass
class CacheOptions:
    num_blocks: int = 256
    block_size: int = 16
    policy: str = "lru"
    prefix_cache: bool = True
    max_batch: int = 16
    max_prefill_tokens: int = 2048
    pin_cap_ratio: float = 0.2
    pin_tokens: list[int] | None = None     # a prefix (e.g. a system prompt) to pin


@dataclass
class ReplicaResult:
    outputs: dict[int, list[int]]
    ttft_ms: dict[int, float]
    cache: dict[str, int | float]
    wall_s: float
    steps: int
    generated: int
    decode_tokens: int
    decode_s: float
    preemptions: int
    prefill_tokens: int
    all_reduces: int = 0
    extra: dict = field(default_factory=dict)


def validate(requests: Sequence[Request], cfg: GPTConfig, opts: CacheOptions) -> None:
    """Reject requests the engine cannot serve, naming the request."""
    usable = opts.num_blocks - (int(opts.pin_cap_ratio * opts.num_blocks)
                                if opts.pin_tokens else 0)
    for r in requests:
        if not r.prompt:
            raise ValueError(f"request {r.id}: empty prompt")
        if r.max_new_tokens < 1:
            raise ValueError(f"request {r.id}: max_new_tokens must be >= 1, "
                             f"got {r.max_new_tokens}")
        bad = [t for t in r.prompt if not 0 <= t < cfg.vocab_size]
        if bad:
            raise ValueError(f"request {r.id}: token id {bad[0]} is outside the "
                             f"vocabulary of {cfg.vocab_size}")
        total = len(r.prompt) + r.max_new_tokens
        if total > cfg.block_size:
            raise ValueError(
                f"request {r.id}: prompt of {len(r.prompt)} tokens + {r.max_new_tokens} new "
                f"tokens exceeds the model's context of {cfg.block_size}")
        need = blocks_for(total, opts.block_size)
        if need > usable:
            raise ValueError(
                f"request {r.id}: needs {need} blocks of {opts.block_size} tokens but the "
                f"pool holds {usable} usable blocks (--cache-blocks {opts.num_blocks}); "
                f"it cannot hold even this one request")


def _warm_up(engine: TPEngine, comm: TPComm, rounds: int = 3) -> None:
    """Open the group's connections before the clock starts (both ranks call it)."""
    import torch

    t = torch.zeros(1, engine.cfg.n_embd, dtype=engine.dtype)
    for _ in range(rounds):
        comm.all_reduce(t)
        comm.broadcast_ints([0] if comm.rank == 0 else None)


def serve(engine: TPEngine, comm: TPComm, requests: Sequence[Request] | None,
          opts: CacheOptions) -> ReplicaResult | None:
    """Serve ``requests`` (given on group rank 0) to completion; rank 0 gets the result."""
    _warm_up(engine, comm)
    if comm.rank != 0:
        while True:
            words = comm.broadcast_ints(None)
            if words == STOP:
                return None
            engine.forward(Plan.decode(words))
    assert requests is not None
    pool = BlockPool(opts.num_blocks, opts.block_size, opts.policy,
                     prefix_cache=opts.prefix_cache, pin_cap_ratio=opts.pin_cap_ratio)
    if opts.pin_tokens and opts.prefix_cache:
        pool.pin(block_hashes(opts.pin_tokens, opts.block_size))
    sched = Scheduler(pool, opts.max_batch, opts.max_prefill_tokens)
    arrivals = sorted(requests, key=lambda r: r.arrival)
    ttft: dict[int, float] = {}
    steps = generated = decode_tokens = 0
    decode_s = 0.0
    t0 = time.perf_counter()
    try:
        while arrivals or sched.has_work:
            now = time.perf_counter() - t0
            while arrivals and arrivals[0].arrival <= now:
                sched.add(arrivals.pop(0))
            if not sched.has_work:
                time.sleep(arrivals[0].arrival - now)
                continue
            plan = sched.schedule()
            if not plan.seqs:
                if plan.preempted:
                    continue
                raise RuntimeError("the scheduler found nothing to run (pool too small)")
            ts = time.perf_counter()
            comm.broadcast_ints(plan.encode())
            sampled = engine.forward(plan)
            sched.update(plan, sampled)
            now = time.perf_counter()
            steps += 1
            generated += len(sampled)
            if all(len(s.tokens) == 1 for s in plan.seqs):
                decode_tokens += len(sampled)
                decode_s += now - ts
            for s in plan.seqs:
                if s.seq not in ttft:
                    ttft[s.seq] = (now - t0 - sched.requests[s.seq].arrival) * 1e3
    finally:
        comm.broadcast_ints(STOP)
    wall = time.perf_counter() - t0
    return ReplicaResult(
        outputs={r.id: list(r.output) for r in requests}, ttft_ms=ttft,
        cache=pool.run.as_dict(), wall_s=wall, steps=steps, generated=generated,
        decode_tokens=decode_tokens, decode_s=decode_s, preemptions=sched.preemptions,
        prefill_tokens=sum(r.prefill_computed for r in requests),
        all_reduces=engine.all_reduces)
