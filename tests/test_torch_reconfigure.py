"""torchft's process-group contract on ringtree (``ReconfigurableGroup``), without torchft:
configure, a rank dies, ``errored()`` reports it, reconfigure to the smaller world;
``abort()`` releases a call blocked on another thread; configure again after it."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra")
dist = pytest.importorskip("torch.distributed")

from ringtree.testing import free_port  # noqa: E402
from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch


def _sum(g, value: float) -> float:
    t = torch.full((1 << 12,), value)
    g.allreduce([t], dist.ReduceOp.SUM).wait()
    return float(t[0])


def _drill(ctx, port: int):
    from ringtree.torch.reconfigurable import ReconfigurableGroup

    g = ReconfigurableGroup(timedelta(seconds=30))
    addr = f"127.0.0.1:{port}/torchft/"
    g.configure(addr + "q0", "replica", ctx.rank, 3)
    first = (_sum(g, ctx.rank + 1.0), g.size(), g.errored() is None)
    if ctx.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        _sum(g, 1.0)
        failed = ""
    except Exception as e:  # noqa: BLE001 - the dead rank's error
        failed = str(e)
    err = g.errored()
    g.configure(addr + "q1", "replica", ctx.rank, 2)  # the smaller world
    second = (_sum(g, ctx.rank + 1.0), g.size(), g.rank(), g.errored() is None)
    # abort releases a call blocked on another thread (rank 1 is not in the call)
    released: list = []
    sync = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    if ctx.rank == 0:
        def blocked() -> None:
            try:
                _sum(g, 1.0)
                released.append("completed")
            except Exception as e:  # noqa: BLE001
                released.append(type(e).__name__ if "rank 0 called abort()" in str(e)
                                else f"{type(e).__name__}: {e}"[:300])

        th = threading.Thread(target=blocked)
        th.start()
        time.sleep(0.5)
        g.abort()
        th.join(20)
        released.append(th.is_alive())
        sync.set("aborted", "1")
    else:
        sync.wait(["aborted"])  # not in the call: rank 0 stays blocked until it aborts
    g.configure(addr + "q2", "replica", ctx.rank, 2)  # a new world after the abort
    third = (_sum(g, 2.0), g.errored() is None, g.configured)
    g.shutdown()
    return first, "rank 2" in failed, "rank 2" in str(err), second, released, third


def test_configure_fail_reconfigure_abort():
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    with TorchRankPool(3, backend=None, gloo=False) as pool:
        res = pool.run(_drill, port, timeout=120)
    del server
    assert isinstance(res[2], BaseException)
    for r in (0, 1):
        first, failed, err, second, released, third = res[r]
        assert first == (6.0, 3, True), res[r]
        assert failed and err, res[r]
        assert second == (3.0, 2, r, True), res[r]
        assert third == (4.0, True, 3), res[r]
    assert res[0][4] == ["CommAborted", False], res[0]  # released, naming the abort


def test_bad_store_address():
    from ringtree.torch.reconfigurable import ReconfigurableGroup

    with pytest.raises(ValueError, match="host:port/prefix"):
        ReconfigurableGroup().configure("nohost/prefix", "r", 0, 1)
    with pytest.raises(ValueError, match="outside world_size"):
        ReconfigurableGroup().configure("127.0.0.1:1/p", "r", 2, 2)
