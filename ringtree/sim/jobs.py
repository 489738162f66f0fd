"""Several algorithms' sweeps at once, one worker process each (``ringtree sim -j``).

The algorithms of ``ringtree sim --algo all`` are independent simulations, so they run
in a pool of forked workers (the topology and the options are inherited, nothing is
pickled on the way in). Each answer is the one a sequential run gives, bit for bit: a
worker runs the same :func:`~ringtree.sim.simulate_sizes` on the same inputs; only the
order in which algorithms finish varies, and the caller prints in the algorithms' order.
Workers report each finished size through a queue, so the progress bar keeps moving.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["default_jobs", "run_all"]

# what a forked worker runs: set by run_all before the pool forks
_JOB: tuple[Callable, Any] | None = None


def default_jobs(nalgos: int) -> int:
    """One worker per core this process may use, at most one per algorithm."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                      # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, nalgos))


def _worker(algo: str):
    assert _JOB is not None
    one, q = _JOB
    from ringtree import sim

    sim._progress.set(None)      # the bar is the parent's: a worker only reports sizes
    return algo, one(algo, lambda events: q.put((algo, events)))


def run_all(algos: Sequence[str], one: Callable, jobs: int,
            done_one: Callable[[str, int], None]) -> dict[str, tuple]:
    """``one(algo, each)`` for every algorithm in ``jobs`` forked workers (in this process
    when ``jobs`` is 1): its outcome per algorithm. ``each(events)`` is called as each
    size finishes; here it becomes ``done_one(algo, events)`` in this process."""
    if jobs <= 1 or len(algos) <= 1 or "fork" not in mp.get_all_start_methods():
        return {a: one(a, lambda ev, a=a: done_one(a, ev)) for a in algos}
    global _JOB
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    _JOB = (one, q)
    out: dict[str, tuple] = {}
    try:
        with ctx.Pool(min(jobs, len(algos))) as pool:
            pending = pool.map_async(_worker, algos, chunksize=1)
            while not pending.ready():
                try:
                    done_one(*q.get(timeout=0.1))
                except queue.Empty:
                    pass
            for algo, outcome in pending.get():
                out[algo] = outcome
            while True:
                try:
                    done_one(*q.get(timeout=0.05))
                except queue.Empty:
                    break
    finally:
        _JOB = None
    return {a: out[a] for a in algos}
