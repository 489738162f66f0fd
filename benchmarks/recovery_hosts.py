"""Recovery across hosts: 2 hosts × 2 ranks on the namespace testbed.

``python benchmarks/recovery.py --hosts [--trials 10] [--cut-timeout 3]`` (root, ``ip``,
``tc``: :mod:`ringtree.testbed`; links shaped to 1 Gbit/s). Rank 0 hosts the store on
host 0; ranks 0–1 run on host 0 and 2–3 on host 1, shared memory within a host, TCP
between hosts.

- *kill* trials: the same as ``recovery.py``'s (:func:`recovery.kill_trial`): rank 3 (on
  host 1) SIGKILLs itself at a random moment while everyone all-reduces (8 B or 1 MiB);
  ``detect``, ``agree`` and ``shrink`` from the kill, the last survivor's time. Its host
  peer sees it over shared memory (the ``/proc`` check), host 0's ranks through TCP
  (the dead process's sockets are closed by its kernel: RST/EOF at once).
- *cut* trials: host 1's cable is pulled (:meth:`Testbed.cut`) at a random moment while
  everyone all-reduces 1 MiB (the cut comes 2.5–3 s after the ranks start, once they
  are up; a trial where it came earlier is listed under ``anomalies``), with ``RINGTREE_TIMEOUT=--cut-timeout``. Nothing arrives
  and nothing is refused, so no rank can tell a cut link from a slow one but by a
  deadline: ``detect`` is when host 0's last rank raised (its collective's timeout plus
  the hang doctor's wait for answers, ``RINGTREE_DOCTOR_WAIT``, which ranks 2–3 cannot
  send; or a peer's abort line), from the cut; ``agree``: host 0's ranks revoke and agree, and
  the agreement declares ranks 2–3 failed when their posts have not come by its deadline
  (the same timeout); ``shrink``: the two ranks of host 0 go on alone (first all-reduce
  on the child done). Host 1's ranks cannot reach the store: they raise
  ``RecoveryError`` and leave. The link is healed between trials.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np

import ringtree

LAYOUT = 2  # ranks per host, 2 hosts


def cut_trial(comm, timeout: float):
    """All-reduce until the cut; host 0: revoke, agree, shrink (see the docstring)."""
    x = np.ones(1 << 18, np.float32)
    try:
        for _ in range(1_000_000):
            comm.all_reduce(x)
        return "no error"
    except ringtree.RingtreeError as e:
        detect, msg = time.time(), str(e)
    if comm.rank >= LAYOUT:
        return {"side": 1, "detect": detect}
    named = any(f"rank {r}" in msg for r in range(LAYOUT, 2 * LAYOUT))
    comm.revoke()
    comm.agree(1, timeout=timeout)
    agree, failed = time.time(), comm.failed_ranks()
    child = comm.shrink()
    child.all_reduce(np.ones(2, np.float32))
    shrink = time.time()
    child.close()
    return {"side": 0, "detect": detect, "agree": agree, "shrink": shrink,
            "failed": failed, "named": named}


def run(trials: int, cut_timeout: float) -> dict:
    from recovery import kill_trial, pct

    from ringtree.testbed import Testbed, available
    from ringtree.testbed.pool import run_hosts

    ok, why = available()
    if not ok:
        return {"skipped": why}
    got: dict[str, list[float]] = {k: [] for k in ("kill_detect", "kill_agree", "kill_shrink",
                                                   "cut_detect", "cut_agree", "cut_shrink")}
    odd: list[str] = []
    with Testbed(2, rate="1gbit") as tb:
        for t in range(trials):
            size = 8 if t % 2 == 0 else 1 << 20
            res = run_hosts(tb, LAYOUT, kill_trial, size, t, timeout=180)[:-1]
            if all(isinstance(r, dict) for r in res):
                for k in ("detect", "agree", "shrink"):
                    got[f"kill_{k}"].append(max(r[k] for r in res))
            else:
                odd += [repr(r)[:200] for r in res if not isinstance(r, dict)]
        env = {"RINGTREE_TIMEOUT": cut_timeout}
        for t in range(trials):
            cut_at: list[float] = []

            def cut(at: list[float] = cut_at) -> None:
                tb.cut(1)
                at.append(time.time())

            timer = threading.Timer(random.Random(t).uniform(2.5, 3.0), cut)  # after init
            timer.start()
            try:
                res = run_hosts(tb, LAYOUT, cut_trial, cut_timeout, env=env, timeout=180)
            finally:
                timer.cancel()
                tb.heal(1)
            host0 = [r for r in res[:LAYOUT] if isinstance(r, dict)]
            if cut_at and len(host0) == LAYOUT and all(r["named"] and
                                                      r["failed"] == [2, 3] for r in host0):
                for k in ("detect", "agree", "shrink"):
                    got[f"cut_{k}"].append(max(r[k] for r in host0) - cut_at[0])
            else:
                odd += [repr(r)[:200] for r in res[:LAYOUT]]
    out: dict = {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "trials": len(v)}
                 for k, v in got.items() if v}
    out["cut_timeout_s"] = cut_timeout
    out["anomalies"] = odd
    return out
