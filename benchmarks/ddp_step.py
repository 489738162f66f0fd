"""DDP training step time: ringtree vs gloo, same model, same processes, one run.

    python benchmarks/ddp_step.py [--ranks 2 4] [--steps 20] [--hidden 1024] [--json out.json]

For each rank count, one pool of processes initialises ``torch.distributed`` with backend
``"ringtree"`` and also makes a gloo group over the same ranks. The same MLP (a few
million parameters) is then trained with DistributedDataParallel for a fixed number of
steps, alternating ringtree and gloo runs so that both see the same machine load. A
step is forward + backward (with DDP's bucketed all-reduces overlapping the backward) +
SGD update; its time is the slowest rank's. Reported: the median step time of each
backend and the ratio ringtree / gloo (below 1: ringtree is faster). The gradient
traffic per step is printed too (4 bytes per parameter, all-reduced).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _model(hidden: int, layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    mods: list = [nn.Linear(256, hidden), nn.ReLU()]
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 16))
    return nn.Sequential(*mods)


def _train(ctx, backend: str, hidden: int, layers: int, steps: int, warmup: int,
           batch: int):
    """Runs on every rank: per-step wall times (after ``warmup`` untimed steps)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = ctx.group if backend == "ringtree" else ctx.gloo
    model = DDP(_model(hidden, layers), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(batch, 256, generator=g)
    y = torch.randn(batch, 16, generator=g)
    times = []
    for step in range(warmup + steps):
        dist.barrier(group=ctx.gloo)  # start every step together (not timed)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    nparams = sum(p.numel() for p in model.parameters())
    return times, nparams


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="DDP step time, ringtree vs gloo")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per backend")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2, help="hidden-to-hidden layers")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    from ringtree.torch.testing import TorchRankPool

    results = []
    print(f"{'ranks':>5} {'params':>9} {'MiB/step':>8} {'ringtree ms':>12} {'gloo ms':>9} "
          f"{'ratio':>6}", flush=True)
    for n in args.ranks:
        per: dict[str, list[float]] = {"ringtree": [], "gloo": []}
        nparams = 0
        with TorchRankPool(n, threads=args.threads, pg_timeout=300, timeout=900) as pool:
            for _ in range(args.rounds):
                for backend in ("ringtree", "gloo"):
                    res = pool.run_ok(_train, backend, args.hidden, args.layers, args.steps,
                                      args.warmup, args.batch)
                    nparams = res[0][1]
                    per[backend] += [max(ts) for ts in zip(*(r[0] for r in res))]
        med = {b: statistics.median(v) for b, v in per.items()}
        row = {"ranks": n, "params": nparams, "grad_mib": nparams * 4 / 2**20,
               "ringtree_ms": med["ringtree"] * 1e3, "gloo_ms": med["gloo"] * 1e3,
               "ratio": med["ringtree"] / med["gloo"], "steps": len(per["ringtree"])}
        results.append(row)
        print(f"{n:>5} {nparams:>9} {row['grad_mib']:>8.1f} {row['ringtree_ms']:>12.2f} "
              f"{row['gloo_ms']:>9.2f} {row['ratio']:>6.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
