"""Train a small MLP with DistributedDataParallel over ringtree.

Start it with any launcher; the script itself does not change::

    ringtree run -n 2 python examples/ddp_train.py
    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py
    mpirun -n 2 python examples/ddp_train.py            # (--allow-run-as-root as root)

Each rank draws its own shard of a synthetic regression problem, DDP averages the
gradients over ``torch.distributed`` backend ``"ringtree"``, and at the end the ranks
check that they hold bitwise-identical parameters. ``--backend gloo`` runs the same
training over gloo for comparison.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringtree.torch  # noqa: F401 - registers backend "ringtree"


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def shard(rank: int, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * rank + step)
    x = torch.randn(batch, 32, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(batch, 1, generator=g)
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="ringtree", help="ringtree (default) or gloo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(make_model(args.width))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = shard(rank, step, args.batch)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {avg.item():.4f}", flush=True)
    elapsed = time.perf_counter() - t0

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    same = all(torch.equal(c, copies[0]) for c in copies)
    if rank == 0:
        print(f"{world} ranks over {dist.get_backend()}: {args.steps} steps in {elapsed:.2f} s; "
              f"parameters identical on every rank: {same}", flush=True)
    dist.destroy_process_group()
    if not same:
        raise SystemExit("ranks disagree")


if __name__ == "__main__":
    main()
