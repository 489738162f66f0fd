"""ZeRO-1: AdamW whose state covers only this rank's 1/dp of the parameters.

Rajbhandari et al., *ZeRO*, SC 2020 (arXiv 1910.02054), stage 1 (P_os): optimizer state
is partitioned across the N_d data-parallel ranks, so Adam's two moments cost 8Ψ/N_d
bytes instead of 8Ψ, at the communication volume of plain DP (2Ψ): gradients are
reduce-scattered (Ψ) instead of all-reduced, each rank updates its block, and the
updated blocks are all-gathered (Ψ).

Layout: the :class:`~ringtree.apps.parallel.data_parallel.DataParallel` buckets (built with
``zero=True``) define the partition. Here every bucket also gets a flat parameter buffer
and each parameter's data becomes a view into it; rank r's block of that buffer is a
leaf tensor whose ``.grad`` is the bucket's reduce-scattered block, and torch's AdamW
updates it in place. :meth:`step` then all-gathers each buffer, which updates every
parameter on every rank.
"""

from __future__ import annotations

import torch

from ringtree.apps.parallel import comms
from ringtree.apps.parallel.data_parallel import DataParallel


class ZeroAdamW:
    """``torch.optim.AdamW`` over this rank's blocks, then all-gather (ZeRO-1)."""

    def __init__(self, dp: DataParallel, **adamw):
        if not dp.zero:
            raise ValueError("ZeroAdamW needs DataParallel(..., zero=True) buckets")
        self.dp = dp
        self.flats: list[torch.Tensor] = []
        shards = []
        for b in dp.buckets:
            flat = torch.zeros_like(b.grad)
            for p, off in zip(b.params, b.offsets):
                flat[off:off + p.numel()].copy_(p.data.reshape(-1))
                p.data = flat[off:off + p.numel()].view_as(p)
            blk = flat[b.block(dp.rank, dp.size)]
            blk.grad = b.shard
            self.flats.append(flat)
            shards.append(blk)
        self.shards = shards
        self.opt = torch.optim.AdamW(shards, **adamw)

    @property
    def param_groups(self) -> list[dict]:
        return self.opt.param_groups

    def step(self) -> None:
        self.opt.step()
        for flat, blk in zip(self.flats, self.shards):
            comms.all_gather(flat, blk.clone(), self.dp.group, "dp")

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)
