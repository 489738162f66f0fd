"""ringtree's errors as torch callers expect to see them.

torch's backends raise ``torch.distributed.DistBackendError`` (a ``RuntimeError``) and
word a timeout as gloo does — ``Timed out waiting 1000ms for recv operation to
complete`` — which is what torch's own tests and users' scripts match on (torch's suite
asserts `` (Timed out|closed|timeout) ``). :func:`for_torch` keeps ringtree's exception
type and full report, and adds both: a :class:`TorchCollectiveTimeout` is at once a
``ringtree.CollectiveTimeout`` (and ``TimeoutError``) and a ``DistBackendError``.
"""

from __future__ import annotations

import torch.distributed as dist

from ringtree.errors import CollectiveTimeout


class TorchCollectiveTimeout(CollectiveTimeout, dist.DistBackendError):
    """A ringtree timeout raised through torch (``DistBackendError`` too)."""


def timeout_error(rank: int, op: str, timeout_s: float, detail: str = "") -> TorchCollectiveTimeout:
    """``[Rank r]: Timed out waiting {ms}ms for {op} to complete`` (+ ringtree's report)."""
    ms = int(round(timeout_s * 1000))
    text = f"[Rank {rank}]: Timed out waiting {ms}ms for {op} to complete"
    return TorchCollectiveTimeout(f"{text}: {detail}" if detail else text)


def for_torch(err: BaseException | None, rank: int, op: str,
              timeout_s: float) -> BaseException | None:
    """``err`` as the torch Work reports it (timeouts reworded, everything else as is)."""
    if isinstance(err, CollectiveTimeout) and not isinstance(err, TorchCollectiveTimeout):
        new = timeout_error(rank, op, timeout_s, str(err))
        new.__cause__ = err
        return new
    return err
