"""Async calls of planned shapes queued as they are (``LLRunner.queue``: ``_now``,
``blocks_now``, ``broadcast_blocks`` with ``queued``): no call spec, no second plan
look-up, the general path's calls (``Communicator._all_reduce_general``, ``Communicator._run``)
counted by the call's number and none for them; in place and into ``out``, behind calls
still queued and around blocking ones, with the alarm and with every call notified; every
result bit for bit what the collective defines (the all-reduce's and reduce-scatter's
against NumPy's rank-order fold of float32 values that round in every add); bad memory
and timeouts refused at the call; the flight recorder numbering every call in issue
order."""

from __future__ import annotations

import numpy as np
import pytest
from hot_entry_cases import rank_order_sum, rounding

from ringtree.testing import run_ranks

MODES = [{}, {"RINGTREE_LL_ASYNC_US": "0"}]


def _bits(a: np.ndarray) -> list[int]:
    return a.view(np.uint32).tolist()


class _Counted:
    """The communicator's general entries, counted by the number the next call takes."""

    NAMES = ("_all_reduce_general", "_run")

    def __init__(self, comm):
        self.comm, self.seqs = comm, []
        for name in self.NAMES:
            method = getattr(comm, name)
            setattr(comm, name, lambda *a, m=method, **k: (self.seqs.append(comm.seq),
                                                           m(*a, **k))[1])

    def close(self) -> None:
        for name in self.NAMES:
            delattr(self.comm, name)


def queued_all_reduces(comm) -> dict:
    n, r = comm.size, comm.rank
    counted = _Counted(comm)
    try:
        wrong, count, asyncs = 0, 40, []
        x, y = np.empty(count, np.float32), np.empty(count, np.float32)
        comm.all_reduce(x)
        comm.all_reduce(x, out=y)  # both shapes planned (the first of each: general)
        first = len(counted.seqs)
        for k in range(6):
            xs = [rounding(r, count, 10 * k + j) for j in range(3)]
            outs = [None, np.empty(count, np.float32), None]
            works = []
            for v, o in zip(xs, outs):
                asyncs.append(comm.seq)  # what the counter would note for this call
                works.append(comm.all_reduce(v, out=o, async_op=True))
            if k % 2:
                x[:] = rounding(r, count, 99)
                comm.all_reduce(x)  # blocking: runs the queued calls first
            for w in reversed(works):
                w.wait()
            for j, (v, o) in enumerate(zip(xs, outs)):
                got = v if o is None else o
                wrong += int(_bits(got) != _bits(rank_order_sum(n, count, 10 * k + j)))
                wrong += int(works[j].result() is not got)
        wide = np.zeros(80, np.float32)
        refused = _refused([lambda: comm.all_reduce(wide[::2], async_op=True),
                            lambda: comm.all_reduce(wide[:40], out=wide[20:60], async_op=True),
                            lambda: comm.all_reduce(x, async_op=True, timeout=-1.0)])
    finally:
        counted.close()
    return _report(comm, wrong, first, counted.seqs, asyncs, refused)


def queued_blocks(comm) -> dict:
    """All-gathers, reduce-scatters and broadcasts, async, of planned shapes."""
    n, r = comm.size, comm.rank
    counted = _Counted(comm)
    try:
        wrong, count, asyncs = 0, 24, []
        big, blk = np.empty(count * n, np.float32), np.empty(count, np.float32)
        comm.all_gather(blk, out=big)
        comm.reduce_scatter(big, out=blk)
        comm.broadcast(blk, 1)  # the three shapes planned
        first = len(counted.seqs)
        for k in range(5):
            mine, ins = rounding(r, count, k), rounding(r, count * n, 50 + k)
            gathered, folded, shared = np.empty(count * n, np.float32), \
                np.empty(count, np.float32), np.full(count, float(r), np.float32)
            asyncs.append(comm.seq)  # what the counter would note for the next call
            works = [comm.all_gather(mine, out=gathered, async_op=True)]
            asyncs.append(comm.seq)
            works.append(comm.reduce_scatter(ins, out=folded, async_op=True))
            asyncs.append(comm.seq)
            works.append(comm.broadcast(shared, 1, async_op=True))
            if k % 2:
                comm.all_gather(blk, out=big)  # blocking, behind the queued ones
            for w in reversed(works):
                w.wait()
            want = [rounding(q, count, k) for q in range(n)]
            wrong += int(_bits(gathered) != _bits(np.concatenate(want)))
            fold = rank_order_sum(n, count * n, 50 + k)[r * count:(r + 1) * count]
            wrong += int(_bits(folded) != _bits(fold))
            wrong += int(shared.tolist() != [1.0] * count)
            wrong += int(works[0].result() is not gathered or works[1].result() is not folded)
        refused = _refused([
            lambda: comm.all_gather(mine, out=np.empty(5, np.float32), async_op=True),
            lambda: comm.reduce_scatter(ins, out=np.empty(7, np.float32), async_op=True),
            lambda: comm.broadcast(shared, 1, async_op=True, timeout=0.0)])
    finally:
        counted.close()
    return _report(comm, wrong, first, counted.seqs, asyncs, refused)


def _refused(calls: list) -> list:
    """Each call's error type (None: it ran, and its Work was waited for)."""
    out = []
    for call in calls:
        try:
            call().wait()
            out.append(None)
        except (ValueError, TypeError) as e:
            out.append(type(e).__name__)
    return out


def _report(comm, wrong: int, first: int, general: list[int], asyncs: list[int],
            refused: list) -> dict:
    fr = comm.flight
    return {"wrong": wrong, "first": first, "refused": refused,
            "queued_general": sorted(set(general[first:]) & set(asyncs)),
            "seqs": [e["collective_seq_id"] for e in fr.entries(12)] if fr else None,
            "seq": comm.seq}


@pytest.mark.parametrize("env", MODES, ids=["alarm", "notify"])
@pytest.mark.parametrize("calls,planned", [(queued_all_reduces, 4), (queued_blocks, 3)],
                         ids=["all_reduce", "blocks"])  # (an all-reduce's general path
#                                                          counts twice: its method, _run)
def test_async_calls_of_planned_shapes_are_queued_as_they_are(calls, planned, env):
    for r, got in enumerate(run_ranks(calls, 3, timeout=120, env=env)):
        assert got["wrong"] == 0 and got["first"] == planned, (r, got)
        assert got["queued_general"] == [], (r, got)  # (the blocking calls behind queued
        assert got["refused"] == ["ValueError"] * 3, (r, got)  # ones go the general way)
        seq = got["seq"]
        assert got["seqs"] == list(range(seq - 11, seq + 1)), (r, got)
