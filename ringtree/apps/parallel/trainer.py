"""One training step of the GPT on a (dp, pp, tp) grid, and evaluation.

Everything that makes runs on different grids comparable step by step lives here:

- initial weights are :func:`ringtree.apps.models.gpt.init_state_dict` of ``(config, seed)``,
  sliced to this rank's stage and tp shard, so every grid starts from the same numbers;
- the global batch of step ``k`` is :func:`ringtree.apps.models.data.global_batch` of
  ``(seed, k)``; dp rank d takes its ``batch/dp`` rows, cut into m micro-batches;
- each micro-batch's loss is its mean token cross-entropy divided by m, and gradients
  are averaged over dp, so the update is that of the mean loss over the global batch;
- the reported loss is that same global mean, whatever the grid.

Optimizer: AdamW (betas 0.9/0.95, no weight decay), linear warm-up over the first
``warmup`` steps to ``lr``, then constant; elementwise, so sharding it (TP, ZeRO-1) does
not change the arithmetic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringtree.apps.models import data
from ringtree.apps.models.gpt import GPT, GPTConfig, init_state_dict
from ringtree.apps.parallel import comms, schedule
from ringtree.apps.parallel.data_parallel import BUCKET_BYTES, DataParallel
from ringtree.apps.parallel.grid import Grid
from ringtree.apps.parallel.pipeline_parallel import StageRun, forward_only, run_stage
from ringtree.apps.parallel.tensor_parallel import (
    apply_tensor_parallel,
    vocab_parallel_cross_entropy,
)
from ringtree.apps.parallel.zero import ZeroAdamW


@dataclass
class TrainSpec:
    """What to train and how (the CLI's flags)."""

    model: GPTConfig = field(default_factory=GPTConfig)
    batch_size: int = 16           # global batch, in sequences
    micro_batches: int = 1
    steps: int = 100
    seed: int = 0
    lr: float = 3e-3
    warmup: int = 10
    schedule: str = "1f1b"
    zero: int = 0
    bucket_bytes: int = BUCKET_BYTES
    eval_every: int = 0            # 0: only at the end
    eval_batches: int = 4


def partition_layers(n_layer: int, pp: int) -> list[range]:
    """Contiguous layer ranges per stage; the first ``n_layer % pp`` stages get one more."""
    base, extra = divmod(n_layer, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


@dataclass
class StepResult:
    loss: float                    # global mean training loss (every rank)
    stage: StageRun
    seconds: float
    waits: dict[str, float] = field(default_factory=dict)  # blocked in comms, per axis (s)


class Trainer:
    """The model stage, data-parallel wrapper and optimizer of one rank."""

    def __init__(self, spec: TrainSpec, grid: Grid):
        cfg = spec.model
        self.spec, self.grid, self.cfg = spec, grid, cfg
        layers = partition_layers(cfg.n_layer, grid.pp)[grid.pp_rank]
        model = GPT(cfg, layers, first=grid.first_stage, last=grid.last_stage)
        full = init_state_dict(cfg, spec.seed)
        model.load_state_dict({k: full[k] for k in model.state_dict()})
        self.model = apply_tensor_parallel(model, grid.tp_group, grid.tp_rank, grid.tp)
        self.dp = DataParallel(self.model, grid.dp_group, grid.dp_rank, grid.dp,
                               spec.bucket_bytes, zero=spec.zero == 1)
        adamw = dict(lr=spec.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        self.opt = ZeroAdamW(self.dp, **adamw) if spec.zero == 1 else \
            torch.optim.AdamW(self.model.parameters(), **adamw)
        self.table = schedule.make(spec.schedule, grid.pp, spec.micro_batches)
        self.row = self.table[grid.pp_rank]
        self.mb = spec.batch_size // (grid.dp * spec.micro_batches)
        self.act_shape = (self.mb, cfg.block_size, cfg.n_embd)
        self.vocab_lo = grid.tp_rank * (cfg.vocab_size // grid.tp)
        self.step = 0

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.grid.tp_group, self.vocab_lo)

    def micro_batches(self, split: str, step: int) -> tuple[list, list]:
        x, y = data.global_batch(split, step, self.spec.batch_size, self.cfg.block_size,
                                 self.spec.seed)
        x = data.shard_rows(x, self.grid.dp_rank, self.grid.dp)
        y = data.shard_rows(y, self.grid.dp_rank, self.grid.dp)
        return list(x.split(self.mb)), list(y.split(self.mb))

    def lr_at(self, step: int) -> float:
        return self.spec.lr * min(1.0, (step + 1) / max(1, self.spec.warmup))

    def _global_mean(self, local_sum: torch.Tensor | float) -> float:
        """Sum of the last stage's (tp rank 0) values over dp, divided by dp."""
        owner = self.grid.last_stage and self.grid.tp_rank == 0
        t = torch.tensor([float(local_sum) if owner else 0.0], dtype=torch.float64)
        with comms.waiting("loss"):
            dist.all_reduce(t)
        return float(t[0]) / self.grid.dp

    def train_step(self) -> StepResult:
        """Forward, backward, gradient sync and update for global batch ``self.step``."""
        comms.take_waits()  # what came before (evaluation) is not this step's
        t0 = time.perf_counter()
        for g in self.opt.param_groups:
            g["lr"] = self.lr_at(self.step)
        xs, ys = self.micro_batches("train", self.step)
        self.dp.zero_grad()
        self.dp.sync = False

        def start_sync() -> None:
            self.dp.sync = True

        run = run_stage(self.model, self.row, self.grid, self.act_shape,
                        xs if self.grid.first_stage else None,
                        ys if self.grid.last_stage else None, self.loss_fn, start_sync)
        self.dp.finish()
        comms.set_phase("optim")
        self.opt.step()
        comms.set_phase("")
        local = float(torch.stack(run.losses).sum()) if run.losses else 0.0
        loss = self._global_mean(local)
        self.step += 1
        return StepResult(loss, run, time.perf_counter() - t0, comms.take_waits())

    def close(self) -> None:
        """Release what ties this rank's model to its process groups (the gradient hooks),
        so the groups can be destroyed."""
        self.dp.close()

    def evaluate(self) -> float:
        """Mean validation loss over ``eval_batches`` fixed global batches."""
        m = self.spec.micro_batches
        total = 0.0
        self.model.eval()
        for k in range(self.spec.eval_batches):
            xs, ys = self.micro_batches("val", k)
            losses = forward_only(self.model, self.grid, self.act_shape, m,
                                  xs if self.grid.first_stage else None,
                                  ys if self.grid.last_stage else None, self.loss_fn)
            total += float(torch.stack(losses).mean()) if losses else 0.0
        self.model.train()
        return self._global_mean(total / self.spec.eval_batches)
