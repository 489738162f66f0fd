"""The all-reduce hot path in one C call (``Round.hot``): the same bits as the rank-order
fold with the kernel and without it, in place and into ``out``, arrays it must not take
(strided, read-only, an ``out`` partly over the input) going the general way, a 2-D
array of the warm size, the flight recorder's entries written from C, a rank that does
not come named while the recorder shows the call it waits in, signals during the wait."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hot_entry_cases import late_peer_with_signals as late_with_signals
from hot_entry_cases import rank_order_sum, rounding

import ringtree
from ringtree.prof.flight import Entry
from ringtree.testing import run_ranks


def hot_calls(comm) -> dict:
    """Repeated in-place float32 sums of random values (rounding in every add), each
    compared bit for bit with NumPy's left fold in rank order, then arrays the kernel
    must refuse, then what the flight recorder holds."""
    n, r = comm.size, comm.rank
    wrong = 0
    for count in (2, 40, 5000):  # inline in the line, and in the cell
        x, y = np.empty(count, np.float32), np.empty(count, np.float32)
        for k in range(12):  # in place, then into another array
            x[:] = rounding(r, count, k)
            got = comm.all_reduce(x) if k < 6 else comm.all_reduce(x, out=y)
            want = rank_order_sum(n, count, k)
            wrong += int(got is not (x if k < 6 else y) or got.view(np.uint32).tolist()
                         != want.view(np.uint32).tolist())
            wrong += int(k >= 6 and x.tolist() != rounding(r, count, k).tolist())
    square = np.full((5, 8), r + 1.0, np.float32)    # 40 elements in two dimensions
    comm.all_reduce(square)
    ro = np.ones(40, np.float32)
    ro.flags.writeable = False
    refused = []
    wide = np.zeros(80, np.float32)
    for bad, out in ((wide[::2], None), (ro, None),    # the warm size, 40 elements
                     (wide[:40], wide[20:60])):        # out partly over x
        try:
            comm.all_reduce(bad, out=out)
            refused.append("no error")
        except ValueError as e:
            refused.append(str(e))
    for t in (-1, 0, float("nan"), "5", True):  # a warm shape: refused before numbering
        try:
            comm.all_reduce(square, timeout=t)
            refused.append("no error")
        except (ValueError, TypeError) as e:
            refused.append(type(e).__name__)
    fr = comm.flight
    last = fr.entries(8) if fr is not None else []
    return {"wrong": wrong, "square": bool((square == n * (n + 1) / 2).all()), "refused": refused,
            "seqs": [e["collective_seq_id"] for e in last],
            "states": {e["state"] for e in last}, "last_completed":
                fr.last_completed if fr is not None else None, "seq": comm.seq,
            "from_c": sum(type(e) is not Entry for e in fr.ring if e is not None)
                if fr is not None else 0}


@pytest.mark.parametrize("env", [{}, {"RINGTREE_LL_NATIVE": "0"},
                                 {"RINGTREE_FR_BUFFER_SIZE": "0"}],
                         ids=["kernel", "python", "no-recorder"])
def test_hot_path_bits_refusals_and_flight_recorder(env):
    res = run_ranks(hot_calls, 3, timeout=120, env=env)
    for r, got in enumerate(res):
        assert got["wrong"] == 0, (r, got)
        assert got["square"], (r, got)
        strided, ro, overlap, *timeouts = got["refused"]
        assert "C-contiguous" in strided and "writ" in ro and "overlap" in overlap, (r, got)
        assert timeouts == ["ValueError"] * 3 + ["TypeError"] * 2, (r, got)
        if env.get("RINGTREE_FR_BUFFER_SIZE") == "0":
            continue
        seq = got["seq"]
        assert got["seqs"] == list(range(seq - 7, seq + 1)), (r, got)
        assert got["states"] == {"completed"} and got["last_completed"] == seq, (r, got)
        # the kernel wrote most entries itself; without it, none
        assert (got["from_c"] >= 24) == (not env), (r, got)


def absent_peer(comm) -> dict:
    """Rank 1 skips a call; rank 0 waits in it on the hot path, and a thread reads the
    flight recorder meanwhile (what a SIGUSR1 dump or the hang doctor sees)."""
    x = np.ones(4, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    if comm.rank == 1:
        time.sleep(3.0)
        return {}
    seen: list = []

    def look() -> None:
        time.sleep(0.5)
        cur = comm.flight.current()
        seen.append((cur.desc.seq, cur.desc.name, cur.state) if cur is not None else None)

    t = threading.Thread(target=look)
    t.start()
    try:
        comm.all_reduce(x, timeout=1.5)
        err = "no error"
    except ringtree.RingtreeError as e:
        err = f"{type(e).__name__}: {e}"
    t.join()
    cur = comm.flight.entries(1)[0]
    return {"seen": seen, "err": err, "state": cur["state"], "error": cur["error"],
            "seq": cur["collective_seq_id"]}


def test_absent_peer_on_the_hot_path_is_named_and_recorded():
    got = run_ranks(absent_peer, 2, timeout=60)[0]
    assert got["seen"] == [(4, "all_reduce", 1)], got
    assert got["err"].startswith("CollectiveTimeout") and "rank 1" in got["err"], got
    assert got["state"] == "failed" and got["seq"] == 4 and "CollectiveTimeout" in \
        got["error"], got


def late_peer_with_signals(comm) -> tuple[int, bool, int]:
    """:func:`hot_entry_cases.late_peer_with_signals` on the hot path; the call number."""
    return (*late_with_signals(comm, comm.all_reduce), comm.seq)


def test_signals_while_waiting_on_the_hot_path():
    res = run_ranks(late_peer_with_signals, 2, timeout=60)
    assert res[0][0] > 10 and res[0][1] and res[1][1], res
    assert res[0][2] == res[1][2] == 6, res

