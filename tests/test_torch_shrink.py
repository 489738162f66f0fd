"""``torch.distributed.shrink_group`` and ``get_error`` on the ringtree backend."""

from __future__ import annotations

import os
import signal

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra")
dist = pytest.importorskip("torch.distributed")

from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch


def _lose_rank_2_then_shrink(ctx):
    from torch._C._distributed_c10d import ErrorType

    t = torch.ones(1024)
    dist.all_reduce(t)
    if ctx.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    before = ctx.group.get_error()
    try:
        dist.all_reduce(t)
        err = None
    except Exception as e:  # noqa: BLE001 - the dead rank's error, as torch raises it
        err = str(e)
    after = ctx.group.get_error()
    new = dist.shrink_group([2])  # NCCL's contract: the caller names the dead
    t = torch.full((1 << 16,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return (before == ErrorType.SUCCESS, after == ErrorType.REMOTE_ERROR, err is not None
            and "rank 2" in err, new is dist.group.WORLD, dist.get_world_size(),
            dist.get_rank(), float(t[0]), type(new).__name__, new.group_desc)


def test_shrink_group_after_a_death():
    with TorchRankPool(3, gloo=False, pg_timeout=60) as pool:
        res = pool.run(_lose_rank_2_then_shrink, timeout=120)
    assert isinstance(res[2], BaseException)
    for r in (0, 1):
        assert res[r] == (True, True, True, True, 2, r, 3.0, "RingtreeProcessGroup",
                          "default:shrunken"), res[r]
