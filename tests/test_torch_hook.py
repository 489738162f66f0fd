"""``ringtree.torch.allreduce_hook``: DDP built on a gloo group, gradient buckets
all-reduced through ringtree, against plain DDP on the same gloo group.

- 2 ranks, random data: a sum of two numbers does not depend on order, so the
  parameters must be bitwise equal to plain DDP's, with one bucket and with many;
- 4 ranks, exact data (a linear model with integer inputs and loss weights, so every
  gradient is an integer, ``/4`` is exact and every sum is exact): bitwise equal too;
- the hook's state may be a ringtree process group or its bare communicator.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
dist = pytest.importorskip("torch.distributed")

from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch
STEPS = 3


def _net(exact: bool) -> nn.Module:
    torch.manual_seed(99)
    if exact:
        m = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randint(-3, 4, p.shape).float())
        return m
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def _loss(model, rank: int, step: int, exact: bool):
    g = torch.Generator().manual_seed(100 * step + rank)
    if exact:
        x = torch.randint(-2, 3, (4, 8), generator=g).float()
        w = torch.randint(-2, 3, (4, 4), generator=g).float()
        return (model(x) * w).sum()
    x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
    return nn.functional.mse_loss(model(x), y)


def _train(ctx, use_hook: str | None, exact: bool, bucket_cap_mb: float):
    from ringtree.torch import allreduce_hook

    model = DDP(_net(exact), process_group=ctx.gloo, bucket_cap_mb=bucket_cap_mb)
    if use_hook == "group":
        model.register_comm_hook(ctx.group, allreduce_hook)
    elif use_hook == "communicator":
        model.register_comm_hook(ctx.group.comm, allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1 / 16 if exact else 0.05)
    for step in range(STEPS):
        opt.zero_grad()
        _loss(model, ctx.rank, step, exact).backward()
        opt.step()
    seq = ctx.group.comm.seq  # ringtree collectives issued so far (the hook's are among them)
    return [p.detach().clone() for p in model.module.parameters()], seq


def _same(runs_a, runs_b) -> None:
    for (pa, _), (pb, _) in zip(runs_a, runs_b):
        assert all(torch.equal(a, b) for a, b in zip(pa, pb)), "hook and plain DDP differ"
    first = runs_a[0][0]
    for params, _ in runs_a[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, params)), "ranks disagree"


@pytest.fixture(scope="module")
def pool2():
    with TorchRankPool(2, pg_timeout=60, threads=1) as p:
        yield p


@pytest.mark.parametrize("state", ["group", "communicator"])
@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.002])
def test_hook_matches_plain_ddp_two_ranks(pool2, state, bucket_cap_mb):
    plain = pool2.run_ok(_train, None, False, bucket_cap_mb)
    hooked = pool2.run_ok(_train, state, False, bucket_cap_mb)
    _same(hooked, plain)
    assert hooked[0][1] > plain[0][1], "the buckets did not go through ringtree"


def test_hook_matches_plain_ddp_four_ranks_exact():
    with TorchRankPool(4, pg_timeout=60, threads=1) as pool:
        plain = pool.run_ok(_train, None, True, 0.001)
        hooked = pool.run_ok(_train, "group", True, 0.001)
    _same(hooked, plain)


def test_bad_state_is_named():
    from ringtree.torch.hook import communicator_of

    with pytest.raises(TypeError, match="ringtree process group, a ringtree.Communicator"):
        communicator_of(object())
