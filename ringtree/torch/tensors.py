"""How torch tensors and ``ReduceOp`` s become what ringtree's collectives take.

Zero-copy wherever possible: a contiguous CPU tensor of a dtype ringtree reduces natively
(int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64) is handed
to ringtree as the tensor itself, which views its memory through NumPy (bfloat16 through
an int16 bit view; it is reduced in float32 and rounded once per step, never through
float64). Copies are made only when unavoidable:

- a non-contiguous tensor is staged in a contiguous copy and copied back afterwards;
- data movement (broadcast, gathers, all-to-all, send/recv) of any other dtype (bool,
  int16, complex, float8 ...) moves the bytes through a ``uint8`` view — still no copy;
- reductions of int16/uint16 run in an int32 staging copy (sums, products, min and max
  wrap exactly as in 16-bit arithmetic); bool reductions run on the bytes (SUM/MAX = or,
  PRODUCT/MIN = and); complex tensors reduce as their real view (SUM, AVG, PREMUL_SUM).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import ringtree
from ringtree.ops import ReduceOp

_NATIVE = {
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64,
}
for _name in ("uint32", "uint64"):
    if hasattr(torch, _name):
        _NATIVE.add(getattr(torch, _name))
_WIDEN = {torch.int16: torch.int32}
if hasattr(torch, "uint16"):
    _WIDEN[torch.uint16] = torch.int32

_OPS = {
    "SUM": ReduceOp.SUM, "AVG": ReduceOp.AVG, "PRODUCT": ReduceOp.PROD, "MIN": ReduceOp.MIN,
    "MAX": ReduceOp.MAX, "BAND": ReduceOp.BAND, "BOR": ReduceOp.BOR, "BXOR": ReduceOp.BXOR,
}
_BOOL_OPS: dict[object, ReduceOp] = {
    ReduceOp.SUM: ReduceOp.BOR, ReduceOp.MAX: ReduceOp.BOR, ReduceOp.BOR: ReduceOp.BOR,
    ReduceOp.PROD: ReduceOp.BAND, ReduceOp.MIN: ReduceOp.BAND, ReduceOp.BAND: ReduceOp.BAND,
    ReduceOp.BXOR: ReduceOp.BXOR,
}

# the same by RedOpType value (an int): reading a pybind enum's name costs several µs
_KINDS = getattr(getattr(torch.distributed, "ReduceOp", None), "RedOpType", None)
_BY_VALUE = {int(getattr(_KINDS, name).value): rop for name, rop in _OPS.items()
             if _KINDS is not None and hasattr(getattr(_KINDS, name, None), "value")}

Finish = Callable[[], None]


def reduce_op(op) -> ReduceOp | ringtree.PremulSum:
    """ringtree's operator for a ``torch.distributed.ReduceOp`` (or its ``RedOpType``)."""
    kind = getattr(op, "op", op)  # a ReduceOp object carries .op; RedOpType is the kind
    fast = _BY_VALUE.get(getattr(kind, "value", None)) if type(kind) is _KINDS else None
    if fast is not None:
        return fast
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    if name == "PREMUL_SUM":
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ValueError("PREMUL_SUM needs a factor: use dist._make_nccl_premul_sum(f)")
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return ringtree.premul_sum(float(factor))
    try:
        return _OPS[name]
    except KeyError:
        raise ValueError(f"ringtree does not support reduce op {op!r}") from None


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(1) if t.dim() == 0 else t
    return t.view(torch.uint8)


class Staged:
    """A tensor as ringtree will see it, and what to do once the operation is done."""

    __slots__ = ("obj", "finish")

    def __init__(self, obj: torch.Tensor, finish: Finish | None = None):
        self.obj, self.finish = obj, finish


def _contiguous(t: torch.Tensor, writes: bool) -> tuple[torch.Tensor, Finish | None]:
    if t.device.type != "cpu":
        raise ValueError(f"ringtree moves CPU tensors; got a tensor on {t.device}")
    if t.is_contiguous():
        return t, None
    c = t.contiguous()
    if not writes:
        return c, None
    return c, lambda: t.copy_(c)


def for_move(t: torch.Tensor, writes: bool = True) -> Staged:
    """``t`` for an operation that only moves data (any dtype)."""
    c, finish = _contiguous(t, writes)
    c = c.detach()
    if c.dtype not in _NATIVE:
        c = _bytes(_real(c))
    return Staged(c, finish)


def for_reduce(t: torch.Tensor, op, writes: bool = True) -> tuple[Staged, object]:
    """``t`` and the ringtree operator for a reduction of ``op`` over ``t``'s dtype."""
    rop = reduce_op(op)
    c, finish = _contiguous(t, writes)
    c = c.detach() if c.requires_grad else c
    if c.dtype in _NATIVE:
        return Staged(c, finish), rop
    if c.is_complex():
        if rop not in (ReduceOp.SUM, ReduceOp.AVG) and not isinstance(rop, ringtree.PremulSum):
            raise ValueError(f"{rop} is not defined for complex tensors")
        return Staged(torch.view_as_real(c), finish), rop
    if c.dtype is torch.bool:
        if rop not in _BOOL_OPS:
            raise ValueError(f"{rop} is not defined for bool tensors")
        return Staged(c.view(torch.uint8), finish), _BOOL_OPS[rop]
    wide = _WIDEN.get(c.dtype)
    if wide is None:
        raise TypeError(f"ringtree cannot reduce {c.dtype} tensors")
    w = c.to(wide)
    dst = t if finish is None else c

    def back() -> None:
        dst.copy_(w)
        if finish is not None:
            finish()
    return Staged(w, back if writes else None), rop


def as_numpy(t: torch.Tensor):
    """A staged tensor as the NumPy array over its memory (zero-copy) where NumPy has
    its dtype, so a blocking all-reduce takes the communicator's hot path; else ``t``."""
    return t.numpy() if t.dtype in _NUMPY else t


_NUMPY = _NATIVE - {torch.bfloat16}


def run_all(finishes: list[Finish | None]) -> None:
    for f in finishes:
        if f is not None:
            f()


__all__ = ["Staged", "as_numpy", "for_move", "for_reduce", "reduce_op", "run_all"]
