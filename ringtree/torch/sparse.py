"""All-reduce (SUM) of sparse COO tensors, as gloo does it: gather every rank's indices
and values, add.

Each rank contributes ``nnz_r`` entries; one all-gather of the counts, then one of the
indices and one of the values, each padded to the largest ``nnz`` (ringtree's all-gather
takes equal blocks), and every rank builds the same sum — the concatenated entries in rank
order, coalesced — so all ranks hold the same bits. The result replaces the tensor's
contents in place (its ``nnz`` may change), as gloo's does. Only ``SUM`` is defined for
sparse tensors; anything else, or a sparse layout other than COO, is a clear error.
"""

from __future__ import annotations

import torch

from ringtree.torch.tensors import for_move


def _is_sum(op) -> bool:
    kind = getattr(op, "op", op)
    return (getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]) == "SUM"


def check_sparse(t: torch.Tensor, op) -> None:
    """Raise if ``t`` is a sparse tensor ringtree cannot all-reduce with ``op``."""
    if t.layout != torch.sparse_coo:
        raise ValueError(f"ringtree all-reduces sparse tensors in COO layout only, "
                         f"got {t.layout}")
    if not _is_sum(op):
        raise ValueError(f"ringtree's sparse all-reduce supports ReduceOp.SUM only, got {op}")
    if t.device.type != "cpu":
        raise ValueError(f"ringtree moves CPU tensors; got a sparse tensor on {t.device}")


def all_reduce_coo(comm, t: torch.Tensor, timeout: float) -> None:
    """Sum the sparse COO tensor ``t`` over the communicator's ranks, in place."""
    n = comm.size
    idx, val = t._indices().contiguous(), t._values().contiguous()
    nnz = idx.shape[1]
    counts = comm.all_gather(torch.tensor([nnz], dtype=torch.int64), timeout=timeout)
    counts = [int(c) for c in torch.as_tensor(counts).reshape(-1)]
    width = max(counts) if counts else 0
    pad_idx = torch.zeros((idx.shape[0], width), dtype=torch.int64)
    pad_idx[:, :nnz] = idx
    pad_val = torch.zeros((width, *val.shape[1:]), dtype=val.dtype)
    pad_val[:nnz] = val
    all_idx = torch.empty((n, *pad_idx.shape), dtype=torch.int64)
    all_val = torch.empty((n, *pad_val.shape), dtype=val.dtype)
    if width:
        comm.all_gather(pad_idx, out=all_idx, timeout=timeout)
        comm.all_gather(for_move(pad_val, writes=False).obj, out=for_move(all_val).obj,
                        timeout=timeout)
    indices = torch.cat([all_idx[r, :, :counts[r]] for r in range(n)], dim=1)
    values = torch.cat([all_val[r, :counts[r]] for r in range(n)], dim=0)
    total = torch.sparse_coo_tensor(indices, values, t.shape, dtype=t.dtype).coalesce()
    with torch.no_grad():
        t.copy_(total)


__all__ = ["all_reduce_coo", "check_sparse"]
