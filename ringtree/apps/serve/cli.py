"""``ringtree generate``: greedy generation for a prompt file on tp groups over ringtree.

    ringtree run -n 2 ringtree generate --tp 2 --prompts prompts.jsonl \\
        --max-new-tokens 32 [--no-prefix-cache] [--cache-blocks K] [--block-size B] \\
        [--policy lru|lfu] [--checkpoint DIR | --seed S] [--json OUT] \\
        [--replicas R] [--router cache|round-robin] [--tp-backend ringtree|gloo]

The world (``ringtree run -n N``) holds ``N / tp`` replicas; ``--replicas`` states the
expected count and is checked. ``--json`` writes ``{"requests": [{"id", "tokens",
"ttft_ms"}], "cache": {"hit_tokens", "miss_tokens", "evicted_blocks"}, "tokens_per_s"}``
with requests in the prompt file's order.
"""

from __future__ import annotations

import argparse
import json
import sys

PROG = "ringtree generate"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per replica")
    p.add_argument("--prompts", required=True, help="JSON lines: {\"prompt\": text} or "
                   "{\"tokens\": [ids]}")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--no-prefix-cache", action="store_true", help="disable prefix caching")
    p.add_argument("--cache-blocks", type=int, default=256, help="KV blocks per rank")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--policy", choices=("lru", "lfu"), default="lru")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="a training checkpoint directory")
    src.add_argument("--seed", type=int, help="initial weights of this seed (default 0)")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--replicas", type=int, help="replicas (default: world size / tp)")
    p.add_argument("--router", choices=("cache", "round-robin"), default="cache")
    p.add_argument("--beta", type=float, default=1.0, help="router load weight")
    p.add_argument("--tp-backend", choices=("ringtree", "gloo"), default="ringtree")
    p.add_argument("--max-batch", type=int, default=16, help="sequences per step")
    p.add_argument("--pin-prefix", type=int, default=0, metavar="TOKENS",
                   help="pin the KV of request 0's first TOKENS tokens (a system prompt)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--context", type=int, default=256,
                   help="context length of a --seed model")
    p.add_argument("--layers", type=int, default=4, help="layers of a --seed model")
    p.add_argument("--heads", type=int, default=4, help="attention heads of a --seed model")
    p.add_argument("--embd", type=int, default=128, help="width of a --seed model")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--quiet", action="store_true", help="no per-request lines")
    return p


def _fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    import torch

    import ringtree
    from ringtree.apps.models.data import decode
    from ringtree.apps.models.gpt import GPTConfig
    from ringtree.apps.serve.engine import check_tp
    from ringtree.apps.serve.generate import generate, load_model, read_prompts
    from ringtree.apps.serve.runner import CacheOptions, validate
    from ringtree.apps.serve.scheduler import Request

    for name in ("tp", "max_new_tokens", "cache_blocks", "block_size", "max_batch",
                 "threads"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    try:
        prompts = read_prompts(args.prompts)
        shape = GPTConfig(block_size=args.context, n_layer=args.layers, n_head=args.heads,
                          n_embd=args.embd)
        shape.validate()
        cfg, sd = load_model(args.checkpoint, args.seed, shape)
        opts = CacheOptions(num_blocks=args.cache_blocks, block_size=args.block_size,
                            policy=args.policy, prefix_cache=not args.no_prefix_cache,
                            max_batch=args.max_batch,
                            pin_tokens=prompts[0][:args.pin_prefix] or None)
        check_tp(cfg, args.tp)      # every rank checks before any rank connects
        validate([Request(i, p, args.max_new_tokens) for i, p in enumerate(prompts)],
                 cfg, opts)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    world = ringtree.init()
    try:
        if args.replicas is not None and args.replicas * args.tp != world.size:
            return _fail(f"--replicas {args.replicas} x --tp {args.tp} needs "
                         f"{args.replicas * args.tp} ranks, the world has {world.size}")
        try:
            summary = generate(world, prompts, args.max_new_tokens, tp=args.tp, cfg=cfg,
                               state_dict=sd, opts=opts, router=args.router,
                               beta=args.beta, backend=args.tp_backend,
                               dtype=getattr(torch, args.dtype))
        except ValueError as e:
            return _fail(str(e))
        if summary is None:
            return 0
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary.to_json(), f)
        if not args.quiet:
            for i, toks in enumerate(summary.outputs):
                print(f"[{i}] ttft {summary.ttft_ms[i]:.1f} ms: {decode(toks)!r}")
        c = summary.to_json()["cache"]
        q = c["hit_tokens"] + c["miss_tokens"]
        print(f"{len(prompts)} requests on {world.size // args.tp} replica(s) x tp "
              f"{args.tp}: {summary.tokens_per_s:.1f} tokens/s, prefix hits "
              f"{c['hit_tokens']}/{q} tokens, {c['evicted_blocks']} blocks evicted")
        return 0
    finally:
        world.close()
