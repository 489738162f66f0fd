"""Exact inputs and NumPy references for collective tests (nccl-tests' method).

Inputs are small integers (or their float images) chosen per (rank, index) so that every
reduction is exact in any order: sums of at most 8 values in [-3, 4], products of ±1 and
2, anything for min/max and the bitwise ops. The reference is computed independently in
NumPy, and results are compared bit for bit (as unsigned views, so NaN patterns count).
These functions run inside the rank processes.
"""

from __future__ import annotations

import numpy as np

import ringtree
from ringtree.dtypes import DType, bf16_to_f32, f32_to_bf16

ALL_DTYPES = [d for d in DType]
INT_DTYPES = [d for d in DType if not d.is_float]
ARITH_OPS = ["sum", "prod", "min", "max", "avg", "premul_sum"]
BIT_OPS = ["band", "bor", "bxor"]


def ops_for(dt: DType) -> list[str]:
    return ARITH_OPS + ([] if dt.is_float else BIT_OPS)


def _to_storage(vals: np.ndarray, dt: DType) -> np.ndarray:
    if dt is DType.BFLOAT16:
        return f32_to_bf16(vals.astype(np.float32))
    return vals.astype(dt.storage)


def _from_storage(a: np.ndarray, dt: DType) -> np.ndarray:
    return bf16_to_f32(a).astype(np.float64) if dt is DType.BFLOAT16 else a.astype(np.float64)


def make_input(rank: int, count: int, dt: DType, op: str) -> np.ndarray:
    """Rank ``rank``'s exact input of ``count`` elements (storage dtype)."""
    i = np.arange(count, dtype=np.int64)
    signed = dt.is_float or np.issubdtype(dt.storage, np.signedinteger)
    if op in ("sum", "avg", "premul_sum"):
        v = (rank * 7 + i * 3) % 8 - (3 if signed else 0)
    elif op == "prod":
        v = np.where((rank + i) % 3 == 0, 2, 1)
        if signed:
            v = np.where((rank * 5 + i) % 7 == 0, -v, v)
    elif op in ("min", "max"):
        v = (rank * 13 + i * 7) % 101 - (50 if signed else 0)
    elif op in BIT_OPS:
        v = (rank * 37 + i * 11 + 5) % 128
    else:  # data movement: arbitrary bit patterns, distinct per rank
        rng = np.random.default_rng(1000 * rank + count)
        return rng.integers(0, 256, size=count * dt.itemsize, dtype=np.uint8).view(dt.storage)
    return _to_storage(v.astype(np.float64), dt)


def reference_reduce(inputs: list[np.ndarray], dt: DType, op: str, scalar: float = 2.0):
    """The exact reduction of ``inputs`` (storage dtype), computed without ringtree."""
    n = len(inputs)
    if op in BIT_OPS:
        acc = inputs[0].copy()
        f = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        for x in inputs[1:]:
            acc = f(acc, x)
        return acc
    if not dt.is_float:
        # int64/uint64 arithmetic wraps modulo 2^64, and the final cast wraps modulo the
        # dtype's width: the same residue the dtype's own arithmetic gives.
        wide = np.uint64 if dt.value.startswith("u") else np.int64
        vals = [x.astype(wide) for x in inputs]
        with np.errstate(over="ignore"):
            if op in ("sum", "avg"):
                acc = np.sum(vals, axis=0, dtype=wide)
            elif op == "premul_sum":
                acc = np.sum([v * wide(int(scalar)) for v in vals], axis=0, dtype=wide)
            elif op == "prod":
                acc = np.prod(vals, axis=0, dtype=wide)
            elif op == "min":
                acc = np.min(vals, axis=0)
            else:
                acc = np.max(vals, axis=0)
        if op == "avg":  # C division: truncate toward zero
            q = np.abs(acc) // wide(n)
            acc = np.where(acc < 0, -q, q).astype(wide)
        return acc.astype(dt.storage)
    f = [_from_storage(x, dt) for x in inputs]
    if op in ("sum", "avg"):
        acc = np.sum(f, axis=0)
    elif op == "premul_sum":
        acc = np.sum([x * scalar for x in f], axis=0)
    elif op == "prod":
        acc = np.prod(f, axis=0)
    elif op == "min":
        acc = np.min(f, axis=0)
    else:
        acc = np.max(f, axis=0)
    if op == "avg":
        acc = acc / n
    return _to_storage(acc, dt) if dt is not DType.BFLOAT16 else f32_to_bf16(
        acc.astype(np.float32))


def op_arg(op: str):
    return ringtree.premul_sum(2.0) if op == "premul_sum" else op


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def sizes_for(n: int) -> list[int]:
    """0, 1, odd, not divisible by n, and a couple of multi-slice sizes."""
    return [0, 1, 17, 3 * n + 1, 70_001]
