"""Hang diagnosis: every other rank's error names the rank that skipped / slept through a
collective (and its sequence number), a killed rank is named, the offline doctor agrees,
monitored_barrier names absent ranks, the flight recorder dumps on demand and SIGUSR1."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np

from ringtree import prof
from ringtree.prof import doctor
from ringtree.testing import raise_first, run_ranks

N = 4
CULPRIT = 2


def _wait_for_reports(comm, limit: float = 60.0) -> None:
    """Stay busy until every other rank has its error (so each one's doctor finds this
    rank still alive, not yet closed)."""
    deadline = time.monotonic() + limit
    others = [f"test/reported/{r}" for r in range(comm.size) if r != comm.rank]
    while time.monotonic() < deadline and not comm.store.check(others):
        time.sleep(0.05)


def _skipper(comm) -> str:
    x = np.ones(1024, np.float32)
    comm.all_reduce(x, algo="ring")                      # seq 1: everyone
    if comm.rank == CULPRIT:                             # skips seq 2: busy elsewhere
        _wait_for_reports(comm)
        return "skipped"
    try:
        comm.all_reduce(x, algo="ring", timeout=2.0)     # seq 2
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    finally:
        comm.store.set(f"test/reported/{comm.rank}", b"1")
    return "no error"


def test_skipped_collective_names_culprit_and_seq(tmp_path):
    env = {"RINGTREE_FR_DUMP_DIR": str(tmp_path), "RINGTREE_DOCTOR_POLL": "0.2"}
    res = raise_first(run_ranks(_skipper, N, env=env, timeout=90))
    assert res[CULPRIT] == "skipped"
    for r in range(N):
        if r == CULPRIT:
            continue
        msg = res[r]
        assert "culprit: rank 2" in msg, msg
        assert "has not called all_reduce seq 2" in msg, msg
        assert "in _wait_for_reports" in msg             # where its main thread was
    # the flight recorders were dumped by every rank: the offline doctor agrees
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"fr_rank{r}.json" for r in range(N)]
    reports = [doctor.analyze(st, c, doctor.OFFLINE_MISSING)
               for c, st in doctor.load_dir(str(tmp_path)).items()]
    assert len(reports) == 1 and reports[0].culprits == [CULPRIT]
    assert reports[0].stuck["collective_seq_id"] == 2
    assert doctor.main([str(tmp_path)]) == 1


def _killed(comm) -> str:
    x = np.ones(1024, np.float32)
    comm.all_reduce(x, algo="ring")
    if comm.rank == CULPRIT:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(x, algo="ring", timeout=20.0)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_killed_rank_is_named(tmp_path):
    env = {"RINGTREE_FR_DUMP_DIR": str(tmp_path), "RINGTREE_DOCTOR_POLL": "0.2"}
    res = run_ranks(_killed, N, env=env, timeout=90)
    assert isinstance(res[CULPRIT], Exception)          # it died
    for r in range(N):
        if r != CULPRIT:
            assert "rank 2" in res[r] and "no error" not in res[r], res[r]
            assert "culprit: rank 2" in res[r], res[r]
    # the rank(s) that saw the death dumped their flight recorders after telling the others
    dumps = [json.loads(p.read_text()) for p in tmp_path.glob("fr_rank*.json")]
    assert dumps and all(d["reason"] == "rank 2 failed" for d in dumps), dumps


def _barrier_absent(comm) -> str:
    comm.monitored_barrier(timeout=5)                     # everyone: passes
    comm.monitored_barrier(timeout=5)
    if comm.rank == 1:
        _wait_for_abort_or(comm, 10.0)
        return "absent"
    try:
        comm.monitored_barrier(timeout=1.0)
    except Exception as e:  # noqa: BLE001
        comm.store.set(f"{comm.prefix}/test-done/{comm.rank}", b"1")
        return f"{type(e).__name__}: {e}"
    return "no error"


def _wait_for_abort_or(comm, limit: float) -> None:
    deadline = time.monotonic() + limit
    keys = [f"{comm.prefix}/test-done/{r}" for r in range(comm.size) if r != 1]
    while time.monotonic() < deadline and not comm.store.check(keys):
        time.sleep(0.05)


def test_monitored_barrier_names_absent_rank():
    res = raise_first(run_ranks(_barrier_absent, N, env={"RINGTREE_DOCTOR_POLL": "0.2"},
                                timeout=60))
    assert res[1] == "absent"
    for r in (0, 2, 3):
        assert res[r].startswith("CollectiveTimeout"), res[r]
        assert "monitored_barrier #3" in res[r] and "rank 1 did not arrive" in res[r]
        assert "_wait_for_abort_or" in res[r]             # where rank 1 was


def _flight(comm, d1: str, d2: str) -> list:
    x = np.ones(10, np.float64)
    for _ in range(3):
        comm.all_reduce(x)
    comm.send(x, (comm.rank + 1) % comm.size) if comm.rank % 2 == 0 else \
        comm.recv(x, (comm.rank - 1) % comm.size)
    os.kill(os.getpid(), signal.SIGUSR1)                 # handler runs in this thread
    time.sleep(0.05)
    path = prof.dump_flight_recorder(d2)
    return [os.path.exists(os.path.join(d1, f"fr_rank{comm.rank}.json")), path]


def test_flight_recorder_dumps(tmp_path):
    d1, d2 = tmp_path / "sig", tmp_path / "demand"
    res = raise_first(run_ranks(_flight, N, str(d1), str(d2),
                                env={"RINGTREE_FR_DUMP_DIR": str(d1)}, timeout=60))
    for r, (by_signal, path) in enumerate(res):
        assert by_signal and path == str(d2 / f"fr_rank{r}.json")
        doc = json.loads((d2 / f"fr_rank{r}.json").read_text())
        (st,) = doc["comms"]
        assert st["rank"] == r and st["state"] == "idle" and st["last_completed"] == 3
        colls = [e for e in st["entries"] if not e["is_p2p"]]
        assert [e["collective_seq_id"] for e in colls] == [1, 2, 3]
        assert all(e["state"] == "completed" and e["profiling_name"] == "ringtree:all_reduce"
                   and e["time_discovered_completed_ns"] >= e["time_discovered_started_ns"]
                   for e in colls)
        p2p = [e for e in st["entries"] if e["is_p2p"]]
        assert len(p2p) == 1 and p2p[0]["name"] == ("send" if r % 2 == 0 else "recv")
    assert doctor.main([str(d2)]) == 0
