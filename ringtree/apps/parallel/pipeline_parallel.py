"""Run one stage's row of a pipeline schedule table (:mod:`ringtree.apps.parallel.schedule`).

Forward ``("F", j)``: receive micro-batch j's activation from the previous stage (the
first stage reads tokens), run the stage, send the output on (the last stage computes
the loss, divided by m so the m backwards accumulate the mean). Backward ``("B", j)``:
receive the gradient of the output from the next stage (the last stage starts from its
loss), ``autograd.backward(output, grad)``, send the input's gradient back.

Receives block; sends are started and waited for at the end of the step, so neighbours
sending to each other at the same moment (1F1B) never deadlock. Before the last
backward the stage calls ``before_last_backward`` (the data-parallel wrapper turns its
gradient all-reduce on there: "sync only on the last micro-batch").

Measured bubble: the share of the step a stage spends outside forward and backward
compute, reported next to ``(p - 1) / (m + p - 1)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ringtree.apps.parallel import comms
from ringtree.apps.parallel.grid import Grid
from ringtree.apps.parallel.schedule import Action


@dataclass
class StageRun:
    """What one stage's step produced."""

    losses: list[torch.Tensor]     # per micro-batch, already divided by m (last stage)
    busy_s: float                  # time in forward/backward compute
    wall_s: float                  # the whole schedule, communication included

    @property
    def bubble(self) -> float:
        return 1.0 - self.busy_s / self.wall_s if self.wall_s > 0 else 0.0


def run_stage(model: torch.nn.Module, row: list[Action], grid: Grid, act_shape: tuple,
              inputs: list[torch.Tensor] | None, targets: list[torch.Tensor] | None,
              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              before_last_backward: Callable[[], None] | None = None) -> StageRun:
    """Run this stage's actions in table order; see the module docstring."""
    m = sum(1 for kind, _ in row if kind == "F")
    last_b = max(i for i, (kind, _) in enumerate(row) if kind == "B")
    kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    pending: list = []
    losses: list[torch.Tensor] = []
    busy = 0.0
    t_start = time.perf_counter()
    for i, (kind, j) in enumerate(row):
        comms.set_phase(f"{kind}{j}")
        if kind == "F":
            if grid.first_stage:
                x = inputs[j]
            else:
                x = torch.empty(act_shape)
                comms.recv(x, grid.prev_rank, grid.pp_group)
                x.requires_grad_()
            t0 = time.perf_counter()
            y = model(x)
            if grid.last_stage:
                y = loss_fn(y, targets[j]) / m
                losses.append(y.detach())
            busy += time.perf_counter() - t0
            if not grid.last_stage:
                out = y.detach()
                pending.append((comms.isend(out, grid.next_rank, grid.pp_group), out))
            kept[j] = (x, y)
        else:
            x, y = kept.pop(j)
            grad = None
            if not grid.last_stage:
                grad = torch.empty(act_shape)
                comms.recv(grad, grid.next_rank, grid.pp_group)
            if i == last_b and before_last_backward is not None:
                before_last_backward()
            t0 = time.perf_counter()
            torch.autograd.backward(y, grad_tensors=grad)
            busy += time.perf_counter() - t0
            if not grid.first_stage:
                g = x.grad
                pending.append((comms.isend(g, grid.prev_rank, grid.pp_group), g))
    for work, _ in pending:
        comms.wait(work, "pp")
    comms.set_phase("")
    return StageRun(losses, busy, time.perf_counter() - t_start)


@torch.no_grad()
def forward_only(model: torch.nn.Module, grid: Grid, act_shape: tuple, m: int,
                 inputs: list[torch.Tensor] | None, targets: list[torch.Tensor] | None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                 ) -> list[torch.Tensor]:
    """Evaluation: m forwards through the pipeline; per-micro-batch losses (last stage)."""
    pending, losses = [], []
    for j in range(m):
        if grid.first_stage:
            x = inputs[j]
        else:
            x = torch.empty(act_shape)
            comms.recv(x, grid.prev_rank, grid.pp_group)
        y = model(x)
        if grid.last_stage:
            losses.append(loss_fn(y, targets[j]))
        else:
            pending.append((comms.isend(y, grid.next_rank, grid.pp_group), y))
    for work, _ in pending:
        work.wait()
    return losses
