"""nccl-tests style verifiable data: inputs whose reduction is exact in any order.

Following ``verifiable/verifiable.cu`` of nccl-tests, every element of every rank's input
is a pure function of (seed, element index, rank), and the expected result of each
collective is computed in closed form from the same function, never by running a
reduction. Values are chosen so that *every* partial result of *any* reduction order is
exactly representable, so a correct collective gives the expected bits exactly and
``#wrong`` counts bitwise mismatches. Per element ``i`` (``u`` a 64-bit hash of (seed, i)):

- sum (floats): ``x_r = (a + b·(r - c))·2^e`` with small integers ``a, b`` and an exponent
  ``e`` drawn from ``u``; their magnitudes are bounded so that any subset sum stays below
  the format's integer precision (2^(mantissa+1)), hence exact; the expected value is
  ``(n·a + b·Σ(r - c))·2^e``. Integers: ``x_r = A + r·B`` in wrapping arithmetic.
- mulsum: the same with nccl-tests' per-rank scalar (1 on even ranks, 2 on odd ones).
- prod (floats): every rank gives ``±2^k_r`` except rank ``i mod n``, which gives ``±m·2^k``
  with a random mantissa ``m``; exponents are bounded so the product never leaves the
  normal range. Integers: ``x_r = A + r·B`` multiplied in wrapping arithmetic.
- min/max: distinct small-integer multiples of ``2^e`` per rank (any order gives the same).
- avg (floats): as nccl-tests, only two ranks contribute non-zero integers, so the sum is
  exact and only the final division rounds; checked with a 2-ulp tolerance. Integers: the
  wrapping sum divided by n, truncated toward zero (C semantics).
- copies (all_gather, broadcast, alltoall, gather, scatter, sendrecv): finite random
  values indexed by their global position, independent of the rank that holds them.

The expected value for avg is computed from the exact sum divided once; nccl-tests'
reference multiplies by 1/n instead, both within the 2-ulp tolerance it uses.
"""

from __future__ import annotations

import numpy as np

from ringtree.dtypes import DType, f32_to_bf16

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)

# (mantissa bits incl. the implicit one, smallest and largest exponent used for data)
_FLOAT = {
    DType.FLOAT16: (11, -14, 4),
    DType.BFLOAT16: (8, -40, 40),
    DType.FLOAT32: (24, -40, 40),
    DType.FLOAT64: (53, -40, 40),
}
_IEEE = {DType.FLOAT16: (5, 10), DType.BFLOAT16: (8, 7), DType.FLOAT32: (8, 23),
         DType.FLOAT64: (11, 52)}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

REDUCE_OPS = ("sum", "prod", "max", "min", "avg", "mulsum")


def premul_scalar(rank: int) -> int:
    """``ncclVerifiablePremulScalar``: 1 on even ranks, 2 on odd ranks."""
    return 1 if rank % 2 == 0 else 2


def hash64(index: np.ndarray, seed: int, salt: int = 0) -> np.ndarray:
    """splitmix64 of (seed, salt, index): a well-mixed uint64 per element."""
    with np.errstate(over="ignore"):
        z = index.astype(np.uint64, copy=False) * np.uint64(0x9E3779B97F4A7C15)
        z += np.uint64((seed * 0xD1B54A32D192ED03 + salt * 0x8CB92BA72F3D8DD7 + 1)
                       & 0xFFFFFFFFFFFFFFFF)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _bits(u: np.ndarray, shift: int, nbits: int) -> np.ndarray:
    """``nbits`` bits of ``u`` from ``shift`` as int64."""
    return ((u >> np.uint64(shift)) & np.uint64((1 << nbits) - 1)).astype(np.int64)


def _uniform(u: np.ndarray, shift: int, lo: int, hi: int, nbits: int = 24) -> np.ndarray:
    """Integers in [lo, hi] (a span below 2^31) from ``nbits`` bits of ``u``."""
    span = hi - lo + 1
    return lo + (_bits(u, shift, nbits) * span >> nbits)


def _to_dtype(values: np.ndarray, dt: DType) -> np.ndarray:
    """float64 values (exactly representable in ``dt``) → storage array of ``dt``."""
    if dt is DType.BFLOAT16:
        return f32_to_bf16(values.astype(np.float32))
    return values.astype(dt.storage)


def _ints(wide: np.ndarray, dt: DType) -> np.ndarray:
    """uint64 values → ``dt`` by truncation to its width (two's complement wrap)."""
    return wide.astype(_UINT[dt.itemsize]).view(dt.storage)


def _index(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.uint64)


# ---------------------------------------------------------------------------- copies


def copy_values(dt: DType, seed: int, start: int, count: int) -> np.ndarray:
    """Finite random values for data that is only moved, indexed by global position."""
    u = hash64(_index(start, count), seed, 1)
    if not dt.is_float:
        return _ints(u, dt)
    ebits, mbits = _IEEE[dt]
    bias = (1 << (ebits - 1)) - 1
    lo, hi = (-14, 15) if dt is DType.FLOAT16 else (-60, 60)
    exp = (_uniform(u, 8, lo, hi) + bias).astype(np.uint64)
    mant = u >> np.uint64(64 - mbits)
    sign = u & np.uint64(1)
    bits = (sign << np.uint64(ebits + mbits)) | (exp << np.uint64(mbits)) | mant
    return bits.astype(_UINT[dt.itemsize]).view(dt.storage)


# ---------------------------------------------------------------------------- reductions


def _budget(dt: DType, weight: int) -> int:
    """Largest |x| per rank so that any subset sum of ``weight`` units stays exact."""
    mant = _FLOAT[dt][0]
    return max(1, ((1 << mant) - 1) // max(1, weight))


def _sum_parts(u: np.ndarray, dt: DType, n: int, weight: int):
    """(a, b, e) of the float sum family: |a| + |b|·n ≤ budget, so every partial sum of
    ``weight`` unit-weighted terms is an integer below 2^mantissa, times 2^e."""
    budget = min(_budget(dt, weight), 1 << 30)
    amax = max(1, budget // 2)
    bmax = max(0, (budget - amax) // max(1, n))
    a = _uniform(u, 0, -amax, amax)
    b = _uniform(u, 24, -bmax, bmax) if bmax else np.zeros_like(a)
    mant, elo, ehi = _FLOAT[dt]
    top = ehi if dt is DType.FLOAT16 else ehi - mant // 2
    e = _uniform(u, 48, elo, top, nbits=16)
    return a, b, e


def _prod_exp_bound(dt: DType, n: int) -> int:
    _, elo, ehi = _FLOAT[dt]
    return max(0, min(-elo, ehi) // max(1, n) - 1)


def _prod_factor(u: np.ndarray, dt: DType, n: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(exponent, sign bit) of rank r's power-of-two factor."""
    kmax = _prod_exp_bound(dt, n)
    a = _bits(u, 0, 16)
    b = _bits(u, 16, 16) | 1
    k = ((a + r * b) % (2 * kmax + 1)) - kmax
    s = ((a + r * b) >> 5) & 1
    return k, s


def _special_mantissa(u: np.ndarray, dt: DType) -> np.ndarray:
    mant = _FLOAT[dt][0]
    return 1.0 + _bits(u, 32, mant - 1).astype(np.float64) / float(1 << (mant - 1))


def input_values(dt: DType, op: str, nranks: int, rank: int, seed: int, start: int,
                 count: int) -> np.ndarray:
    """Rank ``rank``'s input elements ``start … start+count-1`` for reduction ``op``."""
    idx = _index(start, count)
    u = hash64(idx, seed, 2)
    n, r = nranks, rank
    if not dt.is_float:
        a, b = hash64(idx, seed, 3), hash64(idx, seed, 4)
        with np.errstate(over="ignore"):
            return _ints(a + np.uint64(r) * b, dt)
    if op in ("sum", "mulsum"):
        weight = n + n // 2 if op == "mulsum" else n
        a, b, e = _sum_parts(u, dt, n, weight)
        c = (n - 1) // 2
        return _to_dtype(np.ldexp((a + b * (r - c)).astype(np.float64), e), dt)
    if op == "prod":
        k, s = _prod_factor(u, dt, n, r)
        v = np.ldexp(np.where(s == 1, -1.0, 1.0), k)
        special = (idx % np.uint64(n)).astype(np.int64) == r
        v = np.where(special, v * _special_mantissa(u, dt), v)
        return _to_dtype(v, dt)
    if op in ("min", "max"):
        return _to_dtype(_minmax_value(u, hash64(idx, seed, 5), dt, n, r), dt)
    if op == "avg":
        j0 = (idx % np.uint64(n)).astype(np.int64)  # the two contributing ranks
        v = np.where(j0 == r, _avg_value(u, dt, 0), 0.0)
        if n > 1:
            v = np.where((j0 + 1) % n == r, _avg_value(u, dt, 1), v)
        return _to_dtype(v, dt)
    raise ValueError(f"unknown op {op!r}")


def _minmax_value(u: np.ndarray, v: np.ndarray, dt: DType, n: int, r: int) -> np.ndarray:
    """±(base + 1 + π(r))·2^e with π a per-element permutation of the ranks: every rank
    holds a different value, exactly representable, and the extreme is known."""
    mant, elo, ehi = _FLOAT[dt]
    base = _uniform(u, 0, 0, max(0, min((1 << mant) - 1 - n, 1 << 20)))
    # (a + r·step) mod n with step coprime to n permutes the ranks
    perm = (_bits(u, 24, 20) + r * _coprime_step(_bits(u, 44, 16), n)) % n
    sign = np.where(_bits(v, 0, 1) == 1, -1.0, 1.0)
    e = _uniform(v, 8, elo, ehi - mant) if dt is not DType.FLOAT16 else -6
    return sign * np.ldexp((base + 1 + perm).astype(np.float64), e)


def _coprime_step(b: np.ndarray, n: int) -> np.ndarray:
    """A step coprime to n chosen from a small table (so a + r·step permutes 0..n-1)."""
    steps = np.array([s for s in range(1, max(2, n) + 1) if np.gcd(s, n) == 1] or [1],
                     dtype=np.int64)
    return steps[b % len(steps)]


def _avg_value(u: np.ndarray, dt: DType, which: int) -> np.ndarray:
    mant = _FLOAT[dt][0] - 1
    return 1.0 + _bits(u, 8 + 24 * which, min(mant, 20)).astype(np.float64)


def expected_values(dt: DType, op: str, nranks: int, seed: int, start: int,
                    count: int) -> np.ndarray:
    """The reduction over all ranks of :func:`input_values`, in closed form."""
    idx = _index(start, count)
    u = hash64(idx, seed, 2)
    n = nranks
    ranks = range(n)
    if not dt.is_float:
        a, b = hash64(idx, seed, 3), hash64(idx, seed, 4)
        with np.errstate(over="ignore"):
            if op in ("sum", "avg", "mulsum"):
                s = [premul_scalar(r) if op == "mulsum" else 1 for r in ranks]
                total = a * np.uint64(sum(s) & 0xFFFFFFFFFFFFFFFF) + b * np.uint64(
                    sum(si * r for si, r in zip(s, ranks)) & 0xFFFFFFFFFFFFFFFF)
                vals = _ints(total, dt)
                return _trunc_div(vals, n) if op == "avg" else vals
            terms = [_ints(a + np.uint64(r) * b, dt) for r in ranks]
            acc = terms[0].copy()
            for t in terms[1:]:
                if op == "prod":
                    np.multiply(acc, t, out=acc)
                elif op == "min":
                    np.minimum(acc, t, out=acc)
                elif op == "max":
                    np.maximum(acc, t, out=acc)
                else:
                    raise ValueError(f"unknown op {op!r}")
            return acc
    if op in ("sum", "mulsum"):
        s = [premul_scalar(r) if op == "mulsum" else 1 for r in ranks]
        weight = n + n // 2 if op == "mulsum" else n
        a, b, e = _sum_parts(u, dt, n, weight)
        c = (n - 1) // 2
        total = a * sum(s) + b * sum(si * (r - c) for si, r in zip(s, ranks))
        return _to_dtype(np.ldexp(total.astype(np.float64), e), dt)
    if op == "prod":
        ksum = np.zeros(count, dtype=np.int64)
        ssum = np.zeros(count, dtype=np.int64)
        for r in ranks:
            k, s = _prod_factor(u, dt, n, r)
            ksum += k
            ssum += s
        v = np.ldexp(np.where(ssum % 2 == 1, -1.0, 1.0), ksum) * _special_mantissa(u, dt)
        return _to_dtype(v, dt)
    if op in ("min", "max"):
        v2 = hash64(idx, seed, 5)
        vals = [_minmax_value(u, v2, dt, n, r) for r in ranks]
        red = np.minimum if op == "min" else np.maximum
        acc = vals[0]
        for v in vals[1:]:
            acc = red(acc, v)
        return _to_dtype(acc, dt)
    if op == "avg":
        total = _avg_value(u, dt, 0) + (_avg_value(u, dt, 1) if n > 1 else 0.0)
        if dt is DType.BFLOAT16:
            return f32_to_bf16((total / n).astype(np.float32))
        return (total / n).astype(dt.storage)
    raise ValueError(f"unknown op {op!r}")


def _trunc_div(x: np.ndarray, n: int) -> np.ndarray:
    """C integer division by n (truncation toward zero), in x's dtype."""
    if np.issubdtype(x.dtype, np.signedinteger):
        wide = x.astype(np.int64)
        q = np.abs(wide) // n
        return np.where(wide < 0, -q, q).astype(x.dtype)
    return (x // x.dtype.type(n)).astype(x.dtype)


# ---------------------------------------------------------------------------- checking


def tolerance(dt: DType, op: str | None) -> int:
    """Allowed distance in units in the last place: 2 for float avg, else 0."""
    return 2 if (op == "avg" and dt.is_float) else 0


def count_wrong(result: np.ndarray, expected: np.ndarray, tol: int = 0) -> int:
    """``ncclVerifiableVerify``: elements whose bit patterns differ by more than ``tol``
    (as unsigned integers of the element's width)."""
    if result.size != expected.size:
        raise ValueError(f"result has {result.size} elements, expected {expected.size}")
    if result.size == 0:
        return 0
    ut = _UINT[result.dtype.itemsize]
    a = np.ascontiguousarray(result).view(ut).reshape(-1)
    b = np.ascontiguousarray(expected).view(ut).reshape(-1)
    if tol == 0:
        return int(np.count_nonzero(a != b))
    diff = np.where(a > b, a - b, b - a)
    return int(np.count_nonzero(diff > ut(tol)))
