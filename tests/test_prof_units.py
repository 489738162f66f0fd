"""Pieces of ringtree.prof on their own: the event ring, the doctor's reasoning on
hand-made statuses, and the clock estimator."""

from __future__ import annotations

import time

import numpy as np

from ringtree.ir.program import Step, inp, out
from ringtree.prof import clock, doctor
from ringtree.prof.recorder import EVENT_DTYPE, PRIMS, Ev, Recorder, prim_code
from ringtree.testing import raise_first, run_ranks


def test_recorder_ring_keeps_latest():
    rec = Recorder(capacity=16)
    for i in range(40):
        rec.ev(Ev.SEND, 0, 1, i, 0, 1, 8, i)
    ev = rec.events()
    assert ev.dtype.names == EVENT_DTYPE.names and len(ev) == 16 and rec.dropped == 24
    assert list(ev["seq"]) == list(range(24, 40))
    assert np.all(np.diff(ev["ts"]) >= 0) and np.all(ev["dur"] == 0)
    t0 = time.perf_counter_ns()
    rec.span(Ev.REDUCE, t0, 0, -1, 41, 3, 4, 64, 0)
    last = rec.events()[-1]
    assert last["ts"] == t0 and last["dur"] >= 0 and last["type"] == Ev.REDUCE
    assert last["gid"] == 3 and last["prim"] == 4 and last["size"] == 64
    assert rec.claim(0, 1, 0, 7, 3) == 0 and rec.claim(0, 1, 0, 7, 1) == 3
    assert rec.claim(0, 1, 0, 8, 1) == 0


def test_prim_codes():
    assert PRIMS[prim_code(Step(src=inp(0), send_to=(1,)))] == "send"
    rrcs = Step(src=inp(0), dst=out(0), recv_from=(0,), send_to=(1,), reduce=True)
    assert PRIMS[prim_code(rrcs)] == "recvReduceCopySend"
    assert PRIMS[prim_code(Step(dst=out(0), recv_from=(0,)))] == "recv"


def _entry(seq: int, name: str = "all_reduce", state: str = "started") -> dict:
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "name": name, "algo": "ring",
            "count": 4, "dtype": "float32", "op": "sum", "root": -1, "is_p2p": False,
            "state": state, "time_discovered_started_ns": 1, "error": None}


def _st(r: int, last: int, cur: dict | None = None, waits: tuple = (), state: str = "",
        where: str = "train.py:10 in step") -> dict:
    return {"rank": r, "state": state or ("in_operation" if cur else "idle"),
            "last_enqueued": cur["collective_seq_id"] if cur else last,
            "last_completed": last, "current": cur, "where": where, "time_ns": 2,
            "waiting": [{"peer": p, "op": "recv", "step": 1, "nsteps": 7, "prim": "recv",
                         "seq": cur["collective_seq_id"] if cur else 0,
                         "channel": 0, "bytes_done": 0, "bytes": 16} for p in waits]}


def test_doctor_follows_the_wait_chain_to_the_idle_rank():
    st = [_st(0, 4, _entry(5), (3,)), _st(1, 4, _entry(5), (0,)),
          _st(2, 4, where="data.py:99 in load"), _st(3, 4, _entry(5), (2,))]
    rep = doctor.analyze(st, "w")
    assert rep.culprits == [2] and rep.behind == [2]
    assert rep.stuck["collective_seq_id"] == 5
    assert "culprit: rank 2 — has not called all_reduce seq 5" in rep.text()
    assert "data.py:99 in load" in rep.text() and "ranks 0, 1, 3 wait on it" in rep.text()


def test_doctor_names_silent_and_other_op_ranks():
    st = [_st(0, 4, _entry(5), (1,)), None, _st(2, 4, _entry(5), (1,))]
    rep = doctor.analyze(st, "w")
    assert rep.culprits == [1] and rep.unreachable == [1]
    assert "did not answer" in rep.reasons[1]
    st = [_st(0, 4, _entry(5), (1,)), _st(1, 4, _entry(5, "broadcast"), (0,))]
    st[1]["waiting"] = []
    rep = doctor.analyze(st, "w")
    assert rep.culprits == [1] and "is in broadcast seq 5 instead of all_reduce seq 5" in \
        rep.reasons[1]


def test_doctor_reports_a_cycle_and_healthy_jobs():
    st = [_st(0, 4, _entry(5), (1,)), _st(1, 4, _entry(5), (0,))]
    rep = doctor.analyze(st, "w")
    assert rep.cycle and not rep.culprits and "deadlock" in rep.text()
    rep = doctor.analyze([_st(0, 7), _st(1, 7)], "w")
    assert rep.ok and "no rank is inside an operation" in rep.text()


def test_doctor_without_edges_falls_back_to_ranks_outside_the_op():
    st = [_st(0, 4, _entry(5)), _st(1, 4, state="closed"), _st(2, 4, _entry(5))]
    rep = doctor.analyze(st, "w")
    assert rep.culprits == [1] and "closed its communicator after seq 4" in rep.reasons[1]


def test_doctor_flags_a_wait_on_a_rank_that_already_finished():
    st = [_st(0, 5, _entry(6), (1,)), _st(1, 4, _entry(5), (0,))]
    st[1]["waiting"][0]["op"] = "send"
    st[1]["waiting"][0]["seq"] = 5
    rep = doctor.analyze(st, "w")
    assert rep.lost == [(1, 0, 5, "send")] and not rep.culprits and not rep.ok
    assert "no rank is late" in rep.text() and "unknown" not in rep.text()


def _clock(comm) -> dict:
    return clock.estimate(comm, rounds=4).to_dict()


def test_clock_estimate_pingpong():
    res = raise_first(run_ranks(_clock, 3, env={"RINGTREE_PROFILE_CLOCK": "pingpong"},
                                timeout=60))
    assert res[0]["method"] == "reference" and res[0]["offset_ns"] == 0
    for r in (1, 2):
        assert res[r]["method"] == "ping-pong" and res[r]["rtt_ns"] > 0
        assert res[r]["offset_ns"] == res[r]["measured_ns"]


def test_a_wait_its_peer_finished_only_later_is_a_short_timeout_not_a_loss():
    """Rank 1 gave up on its 1 ms deadline; rank 0 completed seq 5 after rank 1's status
    was taken: a timeout shorter than the operation, not a lost message."""
    st = [_st(0, 5, _entry(6), (1,)), _st(1, 4, _entry(5), (0,))]
    st[1]["waiting"][0]["seq"] = 5
    st[1]["time_ns"] = 1_000_000
    st[0]["entries"] = [dict(_entry(5, state="completed"),
                             time_discovered_completed_ns=3_500_000)]
    rep = doctor.analyze(st, "w")
    assert not rep.lost and rep.gave_up == [(1, 0, 5, "recv", 0.0025)]
    text = rep.text()
    assert "rank 1 stopped waiting to receive from rank 0 in seq 5 when its deadline ran " \
        "out, and rank 0 completed seq 5 2.5 ms later" in text
    assert "no rank is late" not in text and "culprit: unknown" not in text
    # completed before the waiter's status was taken: still a lost message
    st[0]["entries"][0]["time_discovered_completed_ns"] = 500_000
    rep = doctor.analyze(st, "w")
    assert rep.lost == [(1, 0, 5, "recv")] and not rep.gave_up
