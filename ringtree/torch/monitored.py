"""``torch.distributed.monitored_barrier`` for ringtree groups, with gloo's semantics
and messages.

gloo's ``ProcessGroupGloo::monitoredBarrier`` (the only implementation torch has): every
rank but 0 reports to rank 0 and waits for rank 0's release; rank 0 collects the reports
in rank order, then releases everyone. So only rank 0 learns *which* ranks failed:

- rank 0, ``wait_all_ranks=False``: the first rank (in order) that does not report
  within what is left of the timeout — ``Rank 2 failed to pass monitoredBarrier in
  2000 ms``; if the timeout is used up before it gets to a rank, ``Rank 0 timed out in
  monitoredBarrier after 2000 ms. Successfully processed ranks: 1``;
- rank 0, ``wait_all_ranks=True``: each rank gets the whole timeout and all missing ranks
  are named — ``Ranks 1, 2 failed to pass monitoredBarrier in 100 ms``;
- any other rank, when rank 0 does not release it in time: ``Rank 1 successfully reached
  monitoredBarrier, but received errors while waiting for send/recv from rank 0``.

Here the reports and the release are keys in the group's store, never the data path, so
the barrier works (and names names) when a peer's connection is broken — the reason to
call it. Waiting polls the store with a backoff capped at 20 ms (no spinning).

torch's ``monitored_barrier`` refuses any backend but gloo before it calls the group.
:func:`install` wraps it so that, for a ringtree group, it does what torch does for
gloo (same argument handling) and calls the group's ``monitored_barrier``; every other
group goes to torch's function unchanged.
"""

from __future__ import annotations

import functools
import time
import warnings
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ringtree.torch.errors import TorchCollectiveTimeout

POLL_CAP = 0.02


def _wait_key(store, key: str, deadline: float) -> bool:
    delay = 0.0005
    while not store.check([key]):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, POLL_CAP)
    return True


def monitored_barrier(store, rank: int, size: int, seq: int, timeout_s: float,
                      wait_all_ranks: bool = False) -> None:
    """Barrier number ``seq`` of a group over ``store`` (see the module docstring)."""
    ms = int(round(timeout_s * 1000))
    base = "ringtree/monitored_barrier"
    arrived = [f"{base}/{seq}/arrive/{r}" for r in range(size)]
    release = f"{base}/{seq}/release"
    if seq > 2:  # everyone left barrier seq-2 before anyone could enter seq
        store.delete(f"{base}/{seq - 2}/arrive/{rank}" if rank else f"{base}/{seq - 2}/release")
    start = time.monotonic()
    if rank != 0:
        store.set(arrived[rank], b"1")
        if not _wait_key(store, release, start + timeout_s):
            raise TorchCollectiveTimeout(
                f"[Rank {rank}]: Rank {rank} successfully reached monitoredBarrier, but "
                f"received errors while waiting for send/recv from rank 0. Please check "
                f"rank 0 logs for faulty rank (no release within {ms} ms).")
        return
    processed: list[int] = []
    failed: list[int] = []
    for r in range(1, size):
        if wait_all_ranks:
            deadline = time.monotonic() + timeout_s  # each rank gets the whole timeout
        else:
            deadline = start + timeout_s
            if time.monotonic() > deadline:
                done = (f"Successfully processed ranks: {', '.join(map(str, processed))}"
                        if processed else "No ranks successfully processed in "
                                          "monitoredBarrier.")
                raise TorchCollectiveTimeout(f"[Rank 0]: Rank 0 timed out in monitoredBarrier "
                                             f"after {ms} ms. {done}")
        if _wait_key(store, arrived[r], deadline):
            processed.append(r)
        elif wait_all_ranks:
            failed.append(r)
        else:
            raise TorchCollectiveTimeout(
                f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms")
    if failed:
        raise TorchCollectiveTimeout(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed "
                                     f"to pass monitoredBarrier in {ms} ms")
    store.set(release, b"1")


def _is_ringtree(group) -> bool:
    from ringtree.torch.backend import RingtreeProcessGroup

    pg = c10d._get_default_group() if group is None else group
    return isinstance(pg, RingtreeProcessGroup)


def install() -> None:
    """Let ``torch.distributed.monitored_barrier`` accept ringtree groups (idempotent)."""
    original = c10d.monitored_barrier
    if getattr(original, "_ringtree", False):
        return

    @functools.wraps(original)
    def wrapped(group=None, timeout: Any = None, wait_all_ranks: bool = False):
        if c10d._rank_not_in_group(group) or not _is_ringtree(group):
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(dist.get_backend(group))
        elif isinstance(timeout, float):
            warnings.warn("Please specify timeout arg as a timedelta. Converting current "
                          f"value of {timeout} assuming it represents seconds",
                          stacklevel=2)
            timeout = timedelta(seconds=timeout)
        c10d._check_valid_timeout(timeout)
        pg = c10d._get_default_group() if group is None else group
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    setattr(wrapped, "_ringtree", True)  # noqa: B010 - marks the wrapper
    c10d.monitored_barrier = wrapped
    dist.monitored_barrier = wrapped
