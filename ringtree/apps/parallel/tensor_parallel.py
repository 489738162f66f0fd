"""Tensor parallelism after Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053).

- ``f`` (:class:`CopyToTP`): identity forward, all-reduce of the gradient backward. It
  sits where a replicated activation enters column-parallel layers (``attn.enter``,
  ``mlp.enter``, ``head_enter`` of :class:`ringtree.apps.models.gpt.GPT`), once per fan-out,
  so q, k and v share one backward all-reduce.
- ``g`` (:class:`ReduceFromTP`): all-reduce forward, identity backward; it ends a
  row-parallel layer and the vocabulary-parallel embedding.
- :class:`ColumnParallelLinear` (``Y_i = X W_i``, W split by output rows): q, k, v, up,
  lm_head. Splitting q/k/v by rows splits the attention heads: rank r holds heads
  ``[r H/tp, (r+1) H/tp)``.
- :class:`RowParallelLinear` (``Y = g(sum_i X_i W_i) + b``, W split by input columns): o,
  down. The bias is added once, after the reduction.
- :class:`VocabParallelEmbedding` and :func:`vocab_parallel_cross_entropy`: the
  vocabulary is split in contiguous ranges; the loss never gathers the logits
  (max and sum-exp are all-reduced, Megatron's ``_VocabParallelCrossEntropy``).

So a transformer layer costs two all-reduces forward (g) and two backward (f).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ringtree.apps.parallel import comms

COLUMN = ("attn.q", "attn.k", "attn.v", "mlp.up", "lm_head")
ROW = ("attn.o", "mlp.down")


def shard_dim(key: str) -> int | None:
    """The dimension along which state-dict entry ``key`` is split across tp ranks."""
    mod, _, what = key.rpartition(".")
    if mod.endswith(COLUMN) or mod == "wte":
        return 0
    if mod.endswith(ROW) and what == "weight":
        return 1
    return None


def shard(t: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous piece of ``t`` along ``dim`` (all of it if None)."""
    if dim is None or size == 1:
        return t.clone()
    return t.chunk(size, dim=dim)[rank].clone()


class CopyToTP(torch.autograd.Function):
    """Megatron's ``f``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        comms.all_reduce(grad, ctx.group, "tp")
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        comms.all_reduce(x, group, "tp")
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Enter(nn.Module):
    """``f`` as a module, replacing an ``nn.Identity`` fan-out point."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, x):
        return CopyToTP.apply(x, self.group) if self.group is not None else x


class ColumnParallelLinear(nn.Module):
    """This rank's ``out/tp`` output features; the input is replicated (after ``f``)."""

    def __init__(self, full: nn.Linear, rank: int, size: int):
        super().__init__()
        self.weight = nn.Parameter(shard(full.weight.data, 0, rank, size))
        self.bias = None if full.bias is None else nn.Parameter(
            shard(full.bias.data, 0, rank, size))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's ``in/tp`` input features; partial sums are all-reduced (``g``)."""

    def __init__(self, full: nn.Linear, rank: int, size: int, group):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(shard(full.weight.data, 1, rank, size))
        self.bias = None if full.bias is None else nn.Parameter(full.bias.data.clone())

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.group is not None:
            y = ReduceFromTP.apply(y, self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows ``[r V/tp, (r+1) V/tp)`` of the embedding; other tokens look up zeros."""

    def __init__(self, full: nn.Embedding, rank: int, size: int, group):
        super().__init__()
        self.group = group
        n = full.num_embeddings // size
        self.lo, self.hi = rank * n, (rank + 1) * n
        self.weight = nn.Parameter(shard(full.weight.data, 0, rank, size))

    def forward(self, ids):
        outside = (ids < self.lo) | (ids >= self.hi)
        local = (ids - self.lo).masked_fill(outside, 0)
        y = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return ReduceFromTP.apply(y, self.group) if self.group is not None else y


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, lo):
        # logits: (N, V/tp) this rank's vocabulary range; target: (N,) global ids.
        m = logits.max(dim=-1).values
        comms.all_reduce(m, group, "tp", op=dist.ReduceOp.MAX)
        z = logits - m.unsqueeze(-1)
        n = logits.shape[-1]
        inside = (target >= lo) & (target < lo + n)
        idx = (target - lo).masked_fill(~inside, 0)
        picked = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        ez = z.exp()
        sums = torch.stack([ez.sum(dim=-1), picked])
        comms.all_reduce(sums, group, "tp")
        loss = sums[0].log() - sums[1]
        ctx.save_for_backward(ez.div_(sums[0].unsqueeze(-1)), idx, inside)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, idx, inside = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0])
        g[rows, idx] -= inside.to(g.dtype)
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group,
                                 lo: int) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-sharded ``logits`` (…, V/tp) against ``target``.

    Per token: ``log sum_v exp(z_v - m) - (z_t - m)`` with ``m`` the all-reduced max.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    if group is None:
        return F.cross_entropy(flat, target.reshape(-1))
    return _VocabParallelCE.apply(flat, target.reshape(-1), group, lo).mean()


def apply_tensor_parallel(model: nn.Module, group, rank: int, size: int) -> nn.Module:
    """Replace a :class:`~ringtree.apps.models.gpt.GPT` (stage)'s modules by their tp shards.

    The model must hold the full weights; each rank keeps its piece. With ``size == 1``
    the model is returned unchanged.
    """
    if size == 1:
        return model
    for name, mod in list(model.named_modules()):
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if name.endswith(COLUMN):
            new: nn.Module = ColumnParallelLinear(mod, rank, size)
        elif name.endswith(ROW):
            new = RowParallelLinear(mod, rank, size, group)
        elif name == "wte":
            new = VocabParallelEmbedding(mod, rank, size, group)
        elif leaf in ("enter", "head_enter"):
            new = Enter(group)
        else:
            continue
        setattr(parent, leaf, new)
    return model
