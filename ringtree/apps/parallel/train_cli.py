"""``ringtree train``: train the character GPT on a (dp, tp, pp) grid.

    ringtree run -n 8 ringtree train --dp 2 --tp 2 --pp 2 --micro-batches 4 --steps 200

Runs under ``ringtree run``, ``torchrun`` and ``mpirun`` alike (``torch.distributed`` is
initialised from the launcher's environment; without one it is a single rank). Grid
arguments are checked against the world size and the model before any process group is
made. Rank 0 shows a progress bar with the loss and tokens/s and writes ``--json``:
``{"losses", "val_losses", "tokens_per_s", "step_ms", "grid", "backend", "wait_ms"}``;
``wait_ms`` is, per axis (tp, pp, dp, and the loss all-reduce), the median over the timed
steps of the time a rank spent blocked in communication, averaged over ranks.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from datetime import timedelta

from ringtree.apps.models.data import VOCAB_SIZE
from ringtree.apps.models.gpt import GPTConfig
from ringtree.apps.parallel.data_parallel import BUCKET_BYTES
from ringtree.apps.parallel.grid import GridError, check_grid
from ringtree.bootstrap import environ

PROG = "ringtree train"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--dp", type=int, default=1, help="data-parallel replicas")
    a("--tp", type=int, default=1, help="tensor-parallel ranks (divides --heads)")
    a("--pp", type=int, default=1, help="pipeline stages (at most --layers)")
    a("--micro-batches", type=int, default=1, help="micro-batches per step (m)")
    a("--schedule", default="1f1b", choices=["1f1b", "gpipe"], help="pipeline schedule")
    a("--steps", type=int, default=100, help="total optimizer steps")
    a("--seed", type=int, default=0, help="initial weights and data order")
    a("--batch-size", type=int, default=16, help="global batch, in sequences")
    a("--lr", type=float, default=3e-3)
    a("--warmup", type=int, default=10, help="linear warm-up steps")
    a("--backend", default="ringtree", choices=["ringtree", "gloo"])
    a("--zero", type=int, default=0, choices=[0, 1], help="1: ZeRO-1 optimizer sharding")
    a("--bucket-mb", type=float, default=BUCKET_BYTES / 2**20, help="DP bucket size (MiB)")
    a("--layers", type=int, default=4)
    a("--heads", type=int, default=4)
    a("--embd", type=int, default=128)
    a("--block-size", type=int, default=64, help="context length in characters")
    a("--eval-every", type=int, default=0, help="validation every N steps (0: start, end)")
    a("--eval-batches", type=int, default=4)
    a("--threads", type=int, default=1, help="torch intra-op threads per rank")
    a("--json", help="write losses, val_losses, tokens_per_s, step_ms, grid, backend")
    a("--plot", help="write the loss curve to this PNG (matplotlib)")
    a("--save", help="write a sharded checkpoint (one file per rank) to this directory")
    a("--resume", help="continue from a checkpoint written by --save on the same grid")
    a("--record-comm", help="write the last step's collectives and p2p as a JSON workload")
    a("--no-progress", action="store_true", help="no progress bar")
    a("--elastic", action="store_true",
      help="survive a dead rank: shrink and re-run the step, bitwise as an unbroken run "
           "(data parallel, also with --zero 1; see ringtree.apps.parallel.elastic)")
    a("--kill", metavar="RANK:STEP[:PHASE]", action="append", default=[],
      help="drill: that rank SIGKILLs itself in that step (compute, allreduce, optimizer; "
           "random if omitted; transfer: as it starts streaming state to a newcomer in "
           "that step's recovery); repeatable")
    a("--corrupt-chunk", type=int, default=-1, metavar="N",
      help="drill: the first state transfer damages chunk N in flight (it is fetched again)")
    return p


def _world_from_env() -> tuple[int, int]:
    import ringtree.torch  # noqa: F401 - registers the backend, fills env under mpirun

    if not environ.get("WORLD_SIZE"):
        from ringtree.testing import free_port

        environ.export({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())})
    return int(environ.get("RANK") or "0"), int(environ.get("WORLD_SIZE") or "1")


def _spec(args):
    from ringtree.apps.parallel.trainer import TrainSpec

    model = GPTConfig(vocab_size=VOCAB_SIZE, block_size=args.block_size, n_layer=args.layers,
                      n_head=args.heads, n_embd=args.embd)
    return TrainSpec(model=model, batch_size=args.batch_size, micro_batches=args.micro_batches,
                     steps=args.steps, seed=args.seed, lr=args.lr, warmup=args.warmup,
                     schedule=args.schedule, zero=args.zero,
                     bucket_bytes=int(args.bucket_mb * 2**20), eval_every=args.eval_every,
                     eval_batches=args.eval_batches)


def _check(args, world: int) -> None:
    check_grid(world, args.dp, args.tp, args.pp, args.heads, args.layers, args.batch_size,
               args.micro_batches, VOCAB_SIZE)
    if args.embd % args.heads:
        raise GridError(f"--embd {args.embd} is not divisible by --heads {args.heads}")
    if args.steps < 1:
        raise GridError(f"--steps must be at least 1, got {args.steps}")
    if args.resume:
        from ringtree.apps.parallel.checkpoint import read_meta

        meta = read_meta(args.resume)
        want = {"dp": args.dp, "tp": args.tp, "pp": args.pp}
        if meta["grid"] != want:
            raise GridError(f"--resume {args.resume} was written on grid {meta['grid']}, "
                            f"this run is {want}")


def _check_elastic(args, world: int) -> None:
    if args.kill and not args.elastic:
        raise GridError("--kill is a drill of --elastic runs")
    if not args.elastic:
        return
    from ringtree.apps.parallel.elastic import parse_kill

    if args.tp != 1 or args.pp != 1 or args.dp != world:
        raise GridError(f"--elastic runs data parallel only: --dp {world} (the world size) "
                        f"with --tp 1 --pp 1, got dp={args.dp} tp={args.tp} pp={args.pp}")
    for flag, bad in (("--save", args.save),
                      ("--resume", args.resume), ("--backend gloo", args.backend != "ringtree"),
                      ("--record-comm", args.record_comm)):
        if bad:
            raise GridError(f"--elastic does not support {flag}")
    for k in args.kill:
        parse_kill(k)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rank, world = _world_from_env()
    try:
        _check(args, world)
        _check_elastic(args, world)
    except (GridError, FileNotFoundError, ValueError) as e:
        if rank == 0:
            print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    if args.elastic:
        return _elastic(args)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=300))
    try:
        return _train(args, rank)
    finally:
        # The trainer (closed by _train) and the grid's groups form reference cycles:
        # collect them first, so destroy_process_group drops the groups' last references
        # and their backends shut down here, not at interpreter exit, where gloo's worker
        # threads aborted the process ("terminate called without an active exception",
        # SIGABRT) in about one run of 8.
        gc.collect()
        dist.destroy_process_group()


def _elastic(args) -> int:
    """The ``--elastic`` run: ringtree's communicator directly (it shrinks), no torch
    process group; ``--json`` adds ``param_sha256``, ``samples`` and ``failures``."""
    import ringtree
    from ringtree.apps.parallel.elastic import ElasticTrainer, parse_kill
    from ringtree.apps.parallel.elastic_zero import ElasticZeroTrainer

    comm = ringtree.init()
    joining = environ.get("RINGTREE_JOIN") == "1"  # a replacement: its --kill is spent
    kills = [] if joining else [parse_kill(k, args.seed + i) for i, k in enumerate(args.kill)]
    cls = ElasticZeroTrainer if args.zero else ElasticTrainer
    trainer = cls(_spec(args), comm, kills, logical=args.dp, corrupt=args.corrupt_chunk,
                  max_restarts=int(environ.get("RINGTREE_MAX_RESTARTS") or 0))
    t0 = time.perf_counter()
    if joining:
        trainer.join()
    trainer.run()
    out = trainer.report()
    out["seconds"] = time.perf_counter() - t0
    if trainer.comm.rank == 0:
        print(f"{PROG}: elastic dp={out['logical_ranks']} on {out['ranks_at_end']} process(es): "
              f"loss {out['losses'][0]:.4f} -> {out['losses'][-1]:.4f}, "
              f"{len(out['failures'])} failure(s) recovered, params sha256 "
              f"{out['param_sha256'][:16]}", file=sys.stderr)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
    trainer.comm.close()
    return 0


def _train(args, rank: int) -> int:
    from ringtree.apps.parallel.grid import build_grid
    from ringtree.apps.parallel.trainer import Trainer

    spec = _spec(args)
    grid = build_grid(args.dp, args.tp, args.pp)
    trainer = Trainer(spec, grid)
    try:
        return _run(args, rank, spec, grid, trainer)
    finally:
        trainer.close()


def _run(args, rank: int, spec, grid, trainer) -> int:
    from ringtree.apps.parallel import checkpoint, record
    from ringtree.apps.parallel.comms import AXES
    from ringtree.apps.parallel.schedule import bubble_fraction

    if args.resume:
        checkpoint.resume(args.resume, trainer)
    first = trainer.step
    tokens = spec.batch_size * spec.model.block_size
    losses, val_losses, step_ms, bubbles, waits = [], [], [], [], []
    bar = _progress(rank == 0 and not args.no_progress, spec.steps - first, first)
    val_losses.append(trainer.evaluate())
    while trainer.step < spec.steps:
        rec = record.start() if args.record_comm and trainer.step == spec.steps - 1 else None
        res = trainer.train_step()
        if rec is not None:
            record.stop()
            record.write(args.record_comm, rec, trainer)
        losses.append(res.loss)
        step_ms.append(res.seconds * 1e3)
        waits.append(res.waits)
        bubbles.append(res.stage.bubble)
        if spec.eval_every and trainer.step % spec.eval_every == 0 and trainer.step < spec.steps:
            val_losses.append(trainer.evaluate())
        if bar is not None:
            bar.set_postfix(loss=f"{res.loss:.4f}", tok_s=f"{tokens / res.seconds:,.0f}")
            bar.update(1)
    val_losses.append(trainer.evaluate())
    if bar is not None:
        bar.close()
    timed = step_ms[1:] if len(step_ms) > 1 else step_ms
    tps = tokens * len(timed) / (sum(timed) / 1e3)
    bubble = _mean_over_ranks(statistics.fmean(bubbles[1:] or bubbles))
    wait_ms = {axis: _mean_over_ranks(statistics.median(
        w[axis] for w in (waits[1:] or waits)) * 1e3) for axis in AXES}
    if args.save:
        checkpoint.save(args.save, trainer, extra=vars(args))
    if rank == 0:
        print(f"{PROG}: grid dp={grid.dp} tp={grid.tp} pp={grid.pp} on {args.backend}: "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, val {val_losses[0]:.4f} -> "
              f"{val_losses[-1]:.4f}, {tps:,.0f} tokens/s, step "
              f"{statistics.median(step_ms):.1f} ms (median)")
        if grid.pp > 1:
            print(f"{PROG}: bubble measured {bubble:.3f}, formula (p-1)/(m+p-1) = "
                  f"{bubble_fraction(grid.pp, spec.micro_batches):.3f} "
                  f"({args.schedule}, p={grid.pp}, m={spec.micro_batches})")
        out = {"losses": losses, "val_losses": val_losses, "tokens_per_s": tps,
               "step_ms": step_ms, "grid": {"dp": grid.dp, "tp": grid.tp, "pp": grid.pp},
               "backend": args.backend, "wait_ms": wait_ms}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
        if args.plot:
            _plot(args.plot, losses, val_losses, first, spec, grid)
    return 0


def _mean_over_ranks(x: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0]) / dist.get_world_size()


def _progress(enabled: bool, total: int, first: int):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=0, desc=f"train from step {first}", unit="step",
                file=sys.stderr, dynamic_ncols=True)


def _plot(path: str, losses: list, val: list, first: int, spec, grid) -> None:
    from ringtree.tools.figure import pyplot

    plt = pyplot("--plot")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = list(range(first + 1, first + 1 + len(losses)))
    ax.plot(steps, losses, label="train loss")
    every = spec.eval_every or max(1, len(losses))
    vx = [first] + [s for s in range(first + every, spec.steps, every)][:len(val) - 2] + \
        [spec.steps]
    ax.plot(vx[:len(val)], val, "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(f"char GPT on stdlib .py, dp={grid.dp} tp={grid.tp} pp={grid.pp}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
