"""``allreduce_hook``: a DDP communication hook that all-reduces gradient buckets through
ringtree, whatever process group DDP itself was built on.

    rt = dist.new_group(backend="ringtree")            # or ringtree.init(): a Communicator
    ddp = DistributedDataParallel(model, process_group=gloo_or_nccl_group)
    ddp.register_comm_hook(rt, ringtree.torch.allreduce_hook)

DDP keeps its group for everything else (the initial parameter broadcast, buffer
syncing, unused-parameter bookkeeping); each bucket's gradients go straight to the
ringtree communicator — not through torch's dispatch — as torchft's DDP sends them to its
fault-tolerant manager. The hook does what DDP's built-in all-reduce does: divide the
bucket by the number of ranks, then sum it across ranks (so with the same inputs the
parameters come out the same as plain DDP's; the test checks they are bitwise equal).

``state`` is a ringtree process group (its communicator is used directly), a
:class:`ringtree.Communicator`, or None for :func:`ringtree.world`. The future the hook
returns resolves to the reduced bucket on a small completion pool, never on ringtree's
driving thread, so DDP's callbacks (and user ``then`` chains) may block.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

import ringtree
from ringtree.ops import ReduceOp
from ringtree.torch.work import RingtreeWork

_POOL: ThreadPoolExecutor | None = None


def _dispatch(fn) -> None:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ringtree-ddp-hook")
    _POOL.submit(fn)


def communicator_of(state: Any) -> ringtree.Communicator:
    """The ringtree communicator a hook ``state`` stands for."""
    if state is None:
        return ringtree.world()
    comm = getattr(state, "comm", state)  # RingtreeProcessGroup -> its communicator
    if not hasattr(comm, "all_reduce") or not hasattr(comm, "size"):
        raise TypeError("allreduce_hook: state must be a ringtree process group, a "
                        f"ringtree.Communicator or None, got {type(state).__name__}")
    return comm


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean over ranks, through ringtree."""
    comm = communicator_of(state)
    buf = bucket.buffer()
    buf.div_(comm.size)
    work = RingtreeWork("ddp_bucket_allreduce", buf, _dispatch)
    fut = work.get_future()
    part = comm.all_reduce(buf, ReduceOp.SUM, async_op=True)
    part.add_done_callback(lambda p: work._mark(p.exception()))
    return fut


__all__ = ["allreduce_hook", "communicator_of"]
