"""Serving a prompt file on R replicas of a tp group each (what ``ringtree generate`` runs).

World rank ``g*tp + j`` is rank ``j`` of replica ``g``. Every rank reads and validates
the same prompts and computes the same routing, so a bad request fails on all ranks at
once, before any rank starts serving. Each replica serves its requests
(:func:`ringtree.apps.serve.runner.serve`) and the replicas' results are gathered on world
rank 0.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringtree.apps.models.gpt import GPTConfig, init_state_dict
from ringtree.apps.serve.engine import TPEngine, check_tp
from ringtree.apps.serve.router import route_all
from ringtree.apps.serve.runner import CacheOptions, ReplicaResult, serve, validate
from ringtree.apps.serve.scheduler import Request
from ringtree.apps.serve.tpcomm import RingtreeTP, SoloTP, TPComm, gloo_groups


class RequestError(ValueError):
    """A prompt-file line or request the engine cannot serve."""


def read_prompts(path: str) -> list[list[int]]:
    """JSON lines of ``{"prompt": "text"}`` or ``{"tokens": [ids]}``; request ``i`` is
    the i-th non-blank line."""
    from ringtree.apps.models.data import encode

    if not os.path.exists(path):
        raise RequestError(f"prompts file {path!r} does not exist")
    out: list[list[int]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            i = len(out)
            where = f"request {i} ({path} line {lineno})"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise RequestError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or len({"prompt", "tokens"} & set(obj)) != 1:
                raise RequestError(f"{where}: expected an object with exactly one of "
                                   f"\"prompt\" (text) or \"tokens\" (list of ids)")
            if "prompt" in obj:
                if not isinstance(obj["prompt"], str):
                    raise RequestError(f"{where}: \"prompt\" must be a string")
                out.append([int(t) for t in encode(obj["prompt"])])
            else:
                toks = obj["tokens"]
                if not isinstance(toks, list) or not all(
                        isinstance(t, int) and not isinstance(t, bool) for t in toks):
                    raise RequestError(f"{where}: \"tokens\" must be a list of integers")
                out.append(list(toks))
    if not out:
        raise RequestError(f"prompts file {path!r} has no requests")
    return out


def load_model(checkpoint: str | None, seed: int | None,
               cfg: GPTConfig | None = None) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """The model's config and full state dict: from a checkpoint directory, or the
    deterministic initial weights of ``cfg`` for ``seed``."""
    if checkpoint is not None:
        from ringtree.apps.parallel.checkpoint import load_full_state_dict

        return load_full_state_dict(checkpoint)
    cfg = cfg or GPTConfig(block_size=256)
    return cfg, init_state_dict(cfg, 0 if seed is None else seed)


@dataclass
class Summary:
    """What world rank 0 reports: per-request results in prompt order, and totals."""

    outputs: list[list[int]]
    ttft_ms: list[float]
    replica_of: list[int]
    replicas: list[ReplicaResult]

    def cache_total(self, key: str) -> int:
        return sum(int(r.cache[key]) for r in self.replicas)

    @property
    def wall_s(self) -> float:
        return max(r.wall_s for r in self.replicas)

    @property
    def tokens_per_s(self) -> float:
        return sum(r.generated for r in self.replicas) / self.wall_s if self.wall_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        s = max(r.decode_s for r in self.replicas)
        return sum(r.decode_tokens for r in self.replicas) / s if s else 0.0

    def to_json(self) -> dict:
        return {
            "requests": [{"id": i, "tokens": toks, "ttft_ms": float(t)}
                         for i, (toks, t) in enumerate(zip(self.outputs, self.ttft_ms))],
            "cache": {"hit_tokens": self.cache_total("hit_tokens"),
                      "miss_tokens": self.cache_total("miss_tokens"),
                      "evicted_blocks": self.cache_total("evicted_blocks")},
            "tokens_per_s": float(self.tokens_per_s),
        }


def tp_comm(world, tp: int, backend: str) -> TPComm:
    """This rank's tp group over ringtree or gloo (``world`` is the ringtree world)."""
    if backend not in ("ringtree", "gloo"):
        raise ValueError(f"unknown tp backend {backend!r}; choose ringtree or gloo")
    if tp == 1:
        return SoloTP()
    if backend == "gloo":
        return gloo_groups(world, tp)
    return RingtreeTP(world.split(color=world.rank // tp))


def generate(world, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             tp: int, cfg: GPTConfig, state_dict: dict[str, torch.Tensor],
             opts: CacheOptions, router: str = "cache", beta: float = 1.0,
             backend: str = "ringtree", dtype: torch.dtype = torch.float64,
             comm: TPComm | None = None,
             arrivals: Sequence[float] | None = None) -> Summary | None:
    """Serve ``prompts`` on ``world.size // tp`` replicas; the summary on world rank 0.
    ``arrivals`` gives each request's arrival time in seconds (default: all at 0)."""
    check_tp(cfg, tp)
    if world.size % tp:
        raise ValueError(f"the world of {world.size} ranks is not a multiple of --tp {tp}")
    replicas = world.size // tp
    times = list(arrivals) if arrivals is not None else [0.0] * len(prompts)
    reqs = [Request(i, list(p), max_new_tokens, arrival=t)
            for i, (p, t) in enumerate(zip(prompts, times))]
    validate(reqs, cfg, opts)
    where = route_all([r.prompt for r in reqs], replicas, opts.block_size, router, beta,
                      capacity_blocks=opts.num_blocks, batch=opts.max_batch)
    comm = comm or tp_comm(world, tp, backend)
    g = world.rank // tp
    engine = TPEngine(cfg, state_dict, comm, opts.num_blocks, opts.block_size, dtype)
    mine = [r for r in reqs if where[r.id] == g] if comm.rank == 0 else None
    result = serve(engine, comm, mine, opts)
    results = world.all_gather_object(result) if world.size > 1 else [result]
    if world.rank != 0:
        return None
    per = [results[k * tp] for k in range(replicas)]
    outputs, ttft = [], []
    for r in reqs:
        rr = per[where[r.id]]
        outputs.append(rr.outputs[r.id])
        ttft.append(rr.ttft_ms[r.id])
    return Summary(outputs, ttft, where, per)
