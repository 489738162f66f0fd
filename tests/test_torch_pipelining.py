"""torch.distributed.pipelining on ringtree: ScheduleGPipe over 2 ranks (one stage each)
gives the same loss and the same gradients and updated parameters as one process running
the whole model on the whole batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from torch import nn  # noqa: E402

from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch

MICROBATCHES = 4
STEPS = 2
LR = 0.1


def _model() -> nn.Sequential:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _stage_module(rank: int) -> nn.Sequential:
    layers = list(_model())
    return nn.Sequential(*(layers[:4] if rank == 0 else layers[4:]))


def _data(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _loss(out, target):
    return nn.functional.mse_loss(out, target)


def _pipeline(ctx):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    mod = _stage_module(ctx.rank)
    stage = PipelineStage(mod, ctx.rank, ctx.size, torch.device("cpu"), group=ctx.group)
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=_loss)
    opt = torch.optim.SGD(mod.parameters(), lr=LR)
    losses_per_step = []
    for step in range(STEPS):
        x, y = _data(step)
        opt.zero_grad()
        if ctx.rank == 0:
            schedule.step(x)
        else:
            losses: list = []
            schedule.step(target=y, losses=losses)
            losses_per_step.append(torch.stack([t.detach() for t in losses]).mean())
        opt.step()
    return [p.detach().clone() for p in mod.parameters()], losses_per_step


def _reference():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = _data(step)
        opt.zero_grad()
        # the schedule averages the microbatches' gradients (scale_grads=True)
        step_losses = []
        for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
            loss = _loss(model(xm), ym)
            (loss / MICROBATCHES).backward()
            step_losses.append(loss.detach())
        losses.append(torch.stack(step_losses).mean())
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    return params[:4], params[4:], losses


@pytest.fixture(scope="module")
def pool():
    with TorchRankPool(2, gloo=False, pg_timeout=60) as p:
        yield p


def test_gpipe_two_stages_matches_single_process(pool):
    (p0, _), (p1, losses) = pool.run_ok(_pipeline)
    ref0, ref1, ref_losses = _reference()
    for got, want in zip(p0 + p1, ref0 + ref1):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses))
