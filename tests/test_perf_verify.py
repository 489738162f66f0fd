"""nccl-tests style verifiable data: reductions exact in any order, bitwise #wrong counting."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ringtree.dtypes import DType, bf16_to_f32, f32_to_bf16
from ringtree.perf import verify

ALL = list(DType)
NRANKS = [1, 2, 3, 5, 8, 13]


def _combine(dt: DType, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A reference reduction step in the element type (bf16 via float32, like NCCL)."""
    uf = {"sum": np.add, "avg": np.add, "mulsum": np.add, "prod": np.multiply,
          "min": np.minimum, "max": np.maximum}[op]
    if dt is DType.BFLOAT16:
        return f32_to_bf16(uf(bf16_to_f32(a), bf16_to_f32(b)))
    with np.errstate(over="ignore"):
        return uf(a, b)


def _premul(dt: DType, x: np.ndarray, s: int) -> np.ndarray:
    if dt is DType.BFLOAT16:
        return f32_to_bf16(bf16_to_f32(x) * np.float32(s))
    with np.errstate(over="ignore"):
        return (x * x.dtype.type(s)).astype(x.dtype)


def _finish_avg(dt: DType, acc: np.ndarray, n: int) -> np.ndarray:
    if dt is DType.BFLOAT16:
        return f32_to_bf16(bf16_to_f32(acc) / np.float32(n))
    if dt.is_float:
        return acc / acc.dtype.type(n)
    wide = acc.astype(np.int64) if np.issubdtype(acc.dtype, np.signedinteger) else acc
    q = np.abs(wide) // n if wide.dtype == np.int64 else wide // wide.dtype.type(n)
    return np.where(wide < 0, -q, q).astype(acc.dtype)  # C: truncate toward zero


def _reduce_in_order(dt, op, n, order, seed, start, count):
    ins = [verify.input_values(dt, op, n, r, seed, start, count) for r in range(n)]
    if op == "mulsum":
        ins = [_premul(dt, x, verify.premul_scalar(r)) for r, x in enumerate(ins)]
    acc = ins[order[0]].copy()
    for r in order[1:]:
        acc = _combine(dt, op, acc, ins[r])
    return _finish_avg(dt, acc, n) if op == "avg" else acc


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.value)
@pytest.mark.parametrize("op", verify.REDUCE_OPS)
def test_any_reduction_order_gives_the_expected_bits(dt, op):
    rng = random.Random(f"{dt}-{op}")
    for n in NRANKS:
        want = verify.expected_values(dt, op, n, seed=7, start=1000, count=3000)
        for _ in range(3):
            order = list(range(n))
            rng.shuffle(order)
            got = _reduce_in_order(dt, op, n, order, 7, 1000, 3000)
            assert got.dtype == dt.storage
            assert verify.count_wrong(got, want, verify.tolerance(dt, op)) == 0, (n, order)


@pytest.mark.parametrize("dt", [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32])
def test_float_sums_are_exact_without_tolerance(dt):
    """Sum inputs are chosen so a tree (pairwise) order is also bit-exact."""
    n = 8
    ins = [verify.input_values(dt, "sum", n, r, 3, 0, 4096) for r in range(n)]
    while len(ins) > 1:
        ins = [_combine(dt, "sum", ins[i], ins[i + 1]) for i in range(0, len(ins), 2)]
    assert verify.count_wrong(ins[0], verify.expected_values(dt, "sum", n, 3, 0, 4096)) == 0


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.value)
def test_values_are_finite_and_varied(dt):
    for vals in (verify.copy_values(dt, 5, 0, 20000),
                 verify.input_values(dt, "sum", 4, 1, 5, 0, 20000),
                 verify.input_values(dt, "min", 4, 1, 5, 0, 20000)):
        if dt.is_float:
            f = bf16_to_f32(vals) if dt is DType.BFLOAT16 else vals.astype(np.float64)
            assert np.isfinite(f).all()
        assert len(np.unique(vals)) > min(100, 2 ** (8 * dt.itemsize) // 4)


def test_inputs_depend_on_seed_index_and_rank():
    a = verify.input_values(DType.FLOAT32, "sum", 4, 0, 1, 0, 1000)
    assert not np.array_equal(a, verify.input_values(DType.FLOAT32, "sum", 4, 0, 2, 0, 1000))
    assert not np.array_equal(a, verify.input_values(DType.FLOAT32, "sum", 4, 1, 1, 0, 1000))
    # chunked generation equals one-shot generation (global element indices)
    whole = verify.copy_values(DType.INT32, 9, 0, 1000)
    parts = np.concatenate([verify.copy_values(DType.INT32, 9, s, 250) for s in
                            range(0, 1000, 250)])
    assert np.array_equal(whole, parts)


def test_premul_scalar_is_nccl_tests():
    assert [verify.premul_scalar(r) for r in range(4)] == [1, 2, 1, 2]


@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.value)
def test_corrupted_elements_are_counted(dt):
    want = verify.copy_values(dt, 11, 0, 5000)
    got = want.copy()
    bits = got.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])
    idx = np.array([0, 17, 4999, 2500])
    bits[idx] ^= bits.dtype.type(1)  # one flipped low bit each
    assert verify.count_wrong(got, want) == len(idx)
    assert verify.count_wrong(want, want) == 0


def test_avg_tolerance_is_two_ulps_for_floats_only():
    assert verify.tolerance(DType.FLOAT32, "avg") == 2
    assert verify.tolerance(DType.BFLOAT16, "avg") == 2
    assert verify.tolerance(DType.INT32, "avg") == 0
    assert verify.tolerance(DType.FLOAT32, "sum") == 0
    want = verify.expected_values(DType.FLOAT32, "avg", 4, 1, 0, 100)
    near = (want.view(np.uint32) + np.uint32(2)).view(np.float32)
    far = (want.view(np.uint32) - np.uint32(3)).view(np.float32)
    assert verify.count_wrong(near, want, 2) == 0
    assert verify.count_wrong(far, want, 2) == 100
    assert verify.count_wrong(near, want, 0) == 100


def test_count_wrong_size_mismatch():
    with pytest.raises(ValueError):
        verify.count_wrong(np.zeros(3, np.float32), np.zeros(4, np.float32))


def test_ringtree_int8_avg_truncates_like_c():
    from ringtree.ops import resolve

    x = np.array([-128, -127, 127], dtype=np.int8)
    resolve("avg", DType.INT8).postdivide(x, 2)
    assert x.tolist() == [-64, -63, 63]
