"""``Communicator.broadcast``, ``all_gather`` and ``reduce_scatter`` are their hot paths in
one frame (:mod:`ringtree.runtime.protocols.ll_hot`): a blocking NumPy call of the shape
each ran last enters its C entry from the method itself, without the LL runner's
``broadcast_now``, ``gather_now`` or ``scatter_now``; anything else (here another root, a
timeout given as an int, an open group) goes past the frame, and every result is exact."""

from __future__ import annotations

import numpy as np

from ringtree.runtime.protocols.ll_runner import LLRunner
from ringtree.testing import run_ranks

PAST = ("broadcast_now", "gather_now", "scatter_now")


def _count_past(log: list) -> None:
    """Count the calls that leave the methods' frames (in this rank's process)."""
    for name in PAST:
        real = getattr(LLRunner, name)

        def counted(*args, _real=real, _name=name, **kw):
            log.append(_name)
            return _real(*args, **kw)

        setattr(LLRunner, name, counted)


def calls(comm) -> dict:
    n, r = comm.size, comm.rank
    past: list = []
    _count_past(past)
    wrong = 0

    def three(k: int, root: int = 0, **kw) -> None:
        nonlocal wrong
        x = np.full(4, r + k, np.float32)
        comm.broadcast(x, root=root, **kw)
        wrong += x.tolist() != [root + k] * 4
        g = np.empty(4 * n, np.float32)
        comm.all_gather(np.full(4, r + k, np.float32), out=g, **kw)
        wrong += g.tolist() != [q + k for q in range(n) for _ in range(4)]
        o = np.empty(2, np.int32)
        comm.reduce_scatter(np.arange(2 * n, dtype=np.int32) + r + k, out=o, **kw)
        wrong += o.tolist() != [sum(2 * r + i + q + k for q in range(n)) for i in range(2)]

    three(0)  # plans and keeps each shape
    three(1)
    del past[:]
    for k in range(2, 12):
        three(k)
    hot = list(past)
    del past[:]
    three(12, root=n - 1)  # another root: past the broadcast's frame, then kept
    three(13, timeout=30)  # an int timeout: the general path checks it
    with comm.group():
        x = np.full(4, r, np.float32)
        comm.broadcast(x)
    wrong += x.tolist() != [0.0] * 4
    away = sorted(set(past))
    return {"hot": hot, "away": away, "wrong": wrong, "seq": comm.seq}


def test_planned_shapes_run_in_the_methods_frames():
    for got in (run_ranks(calls, 2, timeout=120), run_ranks(calls, 3, timeout=120)):
        for r, res in enumerate(got):
            assert res["hot"] == [], (r, res)
            assert res["away"] == sorted(PAST), (r, res)
            assert res["wrong"] == 0, (r, res)
            assert res["seq"] == got[0]["seq"], (r, res)
