"""What the tests of the one-C-entry hot paths share (``Round.hot``/``ghot``/``shot``/
``bshot``/``rhot``/``split``, and the queued async calls): float32 inputs whose every
add rounds and their rank-order sum, the flight recorder's last entries and whether the kernel
wrote them, the general path's errors for buffers an entry refuses, a peer that never
comes (the timed-out call and its failed entry) and a peer killed while the others wait
in the kernel (named), and signals taken while a rank waits there. The ``*_peer``
functions run inside the rank processes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import numpy as np
import pytest

import ringtree
from ringtree.prof.flight import Entry

KILL_ENV = {"RINGTREE_LL_YIELD_US": "200000"}  # the survivors wait in the kernel
# a hot entry's test on 2 and 3 ranks, without the kernel, and 4 ranks on 2 cores
RANKS_AND_KERNEL = pytest.mark.parametrize(
    "nranks,env", [(2, {}), (3, {}), (2, {"RINGTREE_LL_NATIVE": "0"}), (4, {})],
    ids=["kernel-2", "kernel-3", "python-2", "kernel-4-on-2-cores"])


def rounding(rank: int, count: int, k: int) -> np.ndarray:
    """Rank ``rank``'s ``k``-th float32 input: values of magnitudes 1e-3 to 1e3, so every
    add rounds and any other order of the sum shows in the bits."""
    rng = np.random.default_rng(1000 * k + rank)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(np.float32)


def rank_order_sum(n: int, count: int, k: int) -> np.ndarray:
    """NumPy's left fold of :func:`rounding` over ranks 0..n-1: one float32 add at a
    time, in rank order (the bits every rank of an all-reduce must get)."""
    want = rounding(0, count, k)
    for q in range(1, n):
        want = want + rounding(q, count, k)
    return want


def errors_of(call, cases) -> list[str]:
    """The error's class name (or "no error") of ``call(x, out)`` for each case."""
    errors = []
    for x, bad in cases:
        try:
            call(x, bad)
            errors.append("no error")
        except (ValueError, TypeError) as e:
            errors.append(type(e).__name__)
    return errors


def recorded(comm, last: int) -> dict:
    """The flight recorder's ``last`` entries (their states and sequence numbers), the
    communicator's sequence number and how many entries the kernel wrote."""
    fr = comm.flight
    entries = fr.entries(last) if fr is not None else []
    return {"states": {e["state"] for e in entries}, "seq": comm.seq,
            "seqs": [e["collective_seq_id"] for e in entries],
            "from_c": sum(type(e) is not Entry for e in fr.ring if e is not None)
            if fr is not None else 0}


def assert_recorded(r: int, got: dict, last: int, kernel: bool, least: int) -> None:
    """The last ``last`` calls completed, numbered in order; the kernel wrote at least
    ``least`` entries with it, none without."""
    seq = got["seq"]
    assert got["seqs"] == list(range(seq - last + 1, seq + 1)), (r, got)
    assert got["states"] == {"completed"}, (r, got)
    assert (got["from_c"] >= least) == kernel, (r, got)  # the kernel's own entries


def absent_peer(comm, call: Callable[..., object], ok: bool) -> dict:
    """Rank 1 stays away (3 s) from ``call(timeout=1.5)``; the others' error and their
    newest flight-recorder entry. ``ok``: what the rank's earlier calls found."""
    if comm.rank == 1:
        time.sleep(3.0)
        return {"ok": ok}
    try:
        call(timeout=1.5)
        err = "no error"
    except ringtree.RingtreeError as e:
        err = f"{type(e).__name__}: {e}"
    cur = comm.flight.entries(1)[0]
    return {"ok": ok, "err": err, "state": cur["state"], "seq": cur["collective_seq_id"],
            "from_c": type(cur) is not Entry}


def assert_absent_named(got: list, seq: int) -> dict:
    """Both ranks' earlier calls were right; rank 0's call ``seq`` timed out naming rank 1
    and its entry failed. Rank 0's result, for further checks."""
    assert got[1]["ok"], got
    got = got[0]
    assert got["ok"], got
    assert got["err"].startswith("CollectiveTimeout") and "rank 1" in got["err"], got
    assert got["state"] == "failed" and got["seq"] == seq, got
    return got


def killed_peer(comm, call: Callable[[], object]) -> tuple[int | None, str]:
    """Three calls, then rank 1 kills itself while the others wait in the kernel on the
    fourth: the error's ``peer`` and message (rank 1 returns nothing)."""
    for _ in range(3):
        call()
    if comm.rank == 1:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        call()
    except ringtree.RingtreeError as e:
        return getattr(e, "peer", None), str(e)
    return None, "no error"


def assert_killed_named(res: list) -> None:
    """Rank 1 died; ranks 0 and 2 were told rank 1 died."""
    assert isinstance(res[1], BaseException)
    for r in (0, 2):
        peer, msg = res[r]
        assert "rank 1" in msg and "died" in msg, (r, peer, msg)


def late_peer_with_signals(comm, call: Callable[[np.ndarray], object]) -> tuple[int, bool]:
    """Rank 0 takes SIGALRM every millisecond while it waits in ``call(x)`` (an all-reduce
    of ``x``, planned first) for a rank 1 that comes 20 ms late (in the kernel, then in the
    Python sleep): the handler's runs, and whether every call completed right and the
    recorder shows the last five completed."""
    x = np.zeros(3, np.int64)
    comm.all_reduce(x)
    hits, ok = [0], True
    if comm.rank == 0:
        signal.signal(signal.SIGALRM, lambda *a: hits.__setitem__(0, hits[0] + 1))
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    try:
        for k in range(5):
            if comm.rank == 1:
                time.sleep(0.02)
            x[:] = (k, comm.rank, 1)
            call(x)
            ok &= x.tolist() == [2 * k, 1, 2]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
    states = {e["state"] for e in comm.flight.entries(5)}
    return hits[0], ok and states == {"completed"}
