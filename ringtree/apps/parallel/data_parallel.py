"""Data parallelism: bucketed gradient all-reduce overlapped with backward.

After PyTorch DDP (Li et al., VLDB 2020, arXiv 2006.15704) and picotron's
``DataParallelBucket``:

- Parameters are packed, in reverse registration order (roughly the order backward
  produces their gradients), into buckets of about ``bucket_bytes`` (25 MB default).
  Each bucket owns one flat gradient buffer and every ``param.grad`` is a view into it,
  so autograd accumulates micro-batches in place and the bucket is sent without a copy.
- A post-accumulate-grad hook counts ready gradients; when a bucket is complete its
  reduction starts asynchronously while backward continues. Buckets are launched in
  index order on every rank (DDP's rule: the same collectives in the same order).
- Only the last micro-batch's backward communicates (``sync`` is False before it).
- :meth:`finish` waits for the reductions and turns sums into means over dp.

With ``zero=True`` the buffers are padded to a multiple of dp and reduced with
reduce-scatter instead: rank r receives the r-th block of each bucket, which is all the
ZeRO-1 optimizer (:mod:`ringtree.apps.parallel.zero`) needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ringtree.apps.parallel import comms

BUCKET_BYTES = 25 * 1024 * 1024


@dataclass
class Bucket:
    params: list[nn.Parameter]
    grad: torch.Tensor                  # flat, padded to a multiple of dp when sharded
    offsets: list[int]
    shard: torch.Tensor | None = None   # this rank's reduced block (zero=True)
    ready: int = 0
    work: object = None
    launched: bool = False
    names: list[str] = field(default_factory=list)

    def block(self, rank: int, size: int) -> slice:
        n = self.grad.numel() // size
        return slice(rank * n, (rank + 1) * n)


class DataParallel:
    """Gradient synchronisation of ``module`` over the dp group (None: one replica)."""

    def __init__(self, module: nn.Module, group, rank: int, size: int,
                 bucket_bytes: int = BUCKET_BYTES, zero: bool = False):
        self.module, self.group, self.rank, self.size, self.zero = module, group, rank, size, zero
        self.sync = True
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.buckets: list[Bucket] = []
        cur: list[tuple[str, nn.Parameter]] = []
        for name, p in reversed(named):
            cur.append((name, p))
            if sum(q.numel() * q.element_size() for _, q in cur) >= bucket_bytes:
                self._make_bucket(cur)
                cur = []
        if cur:
            self._make_bucket(cur)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook)
                       for b in self.buckets for p in b.params]
        self._next = 0

    def _make_bucket(self, named: list[tuple[str, nn.Parameter]]) -> None:
        n = sum(p.numel() for _, p in named)
        if self.zero:
            n = -(-n // self.size) * self.size
        grad = torch.zeros(n, dtype=named[0][1].dtype)
        offsets, off = [], 0
        for _, p in named:
            offsets.append(off)
            p.grad = grad[off:off + p.numel()].view_as(p)
            off += p.numel()
        b = Bucket([p for _, p in named], grad, offsets, names=[nm for nm, _ in named])
        if self.zero:
            b.shard = torch.zeros(n // self.size, dtype=grad.dtype)
        self.buckets.append(b)

    def _hook(self, p: torch.Tensor) -> None:
        if not self.sync:
            return
        b = self._bucket_of[id(p)]
        b.ready += 1
        while self._next < len(self.buckets) and \
                self.buckets[self._next].ready == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, b: Bucket) -> None:
        if self.zero:
            b.work = comms.reduce_scatter(b.shard, b.grad, self.group, "dp", async_op=True)
        else:
            b.work = comms.all_reduce(b.grad, self.group, "dp", async_op=True)
        b.launched = True

    def finish(self) -> None:
        """Wait for every bucket's reduction; gradients (or shards) become dp means."""
        for b in self.buckets:
            if not b.launched:
                raise RuntimeError(f"gradient bucket of {', '.join(b.names[:3])}... never "
                                   f"became ready: a parameter did not get a gradient")
            comms.wait(b.work, "dp")
            target = b.shard if self.zero else b.grad
            if self.size > 1:
                target.div_(self.size)
            b.ready, b.work, b.launched = 0, None, False
        self._next = 0

    def close(self) -> None:
        """Remove the gradient hooks. A hook is held by its parameter's C++ autograd
        state, where the garbage collector cannot see it, so the cycle parameter -> hook
        -> this wrapper -> module -> parameter (and the process groups the module holds)
        is never freed until the hooks go."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.grad.zero_()
