"""Reduction operators: ``torch.distributed.ReduceOp`` names, NCCL semantics.

- SUM, PROD, MIN, MAX on every dtype; BAND, BOR, BXOR on integers.
- AVG: sum, then divide by the number of ranks once at the end (NCCL's ``ncclAvg``
  post-op; integer division truncates toward zero as in C).
- PREMUL_SUM(scalar): every rank multiplies its input by ``scalar`` before summing
  (``ncclRedOpCreatePreMulSum``).
- A user op: a NumPy ufunc or a function ``f(a, b) -> array``; it must be commutative and
  associative for the result to be well defined (MPI's ``commute=True``), and ringtree
  always applies it in the same order, so results are still bitwise reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ringtree.dtypes import DType, bf16_to_f32, f32_to_bf16


class ReduceOp(Enum):
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    PREMUL_SUM = "premul_sum"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    # members are singletons compared by identity: hash them so too, in C (Enum's
    # __hash__ is a Python call, and every hot-path lookup hashes the op)
    __hash__ = object.__hash__

    @property
    def code(self) -> int:
        return _OP_CODES[self]


_OP_CODES = {o: i for i, o in enumerate(ReduceOp)}


@dataclass(frozen=True)
class PremulSum:
    """``ReduceOp.PREMUL_SUM`` with its scalar (torch's ``_make_nccl_premul_sum``)."""

    scalar: float


def premul_sum(scalar: float) -> PremulSum:
    return PremulSum(float(scalar))


@dataclass(frozen=True)
class UserOp:
    """A user-defined reduction: ``fn(a, b)`` returns (or a ufunc writes) ``a ⊕ b``."""

    fn: Callable
    name: str = "user"


_UFUNC: dict[ReduceOp | None, np.ufunc] = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PREMUL_SUM: np.add,
    ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}

try:  # numpy >= 2 keeps the floating-point error state in a context variable: setting a
    # prepared state costs ~0.1 µs where entering np.errstate costs ~0.4 µs per call
    from numpy._core._ufunc_config import _extobj_contextvar as _FP_STATE
    from numpy._core._ufunc_config import _make_extobj

    _QUIET = _make_extobj(over="ignore", invalid="ignore")
except (ImportError, AttributeError, TypeError):  # pragma: no cover - older numpy
    _FP_STATE = None


def quiet(uf: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``uf(a, b, out=out)`` with overflow and invalid results silent (inf/nan, as NCCL)."""
    if _FP_STATE is None:
        with np.errstate(over="ignore", invalid="ignore"):
            uf(a, b, out=out)
        return
    token = _FP_STATE.set(_QUIET)
    try:
        uf(a, b, out=out)
    finally:
        _FP_STATE.reset(token)


_ALIASES = {"mulsum": ReduceOp.PREMUL_SUM, "premulsum": ReduceOp.PREMUL_SUM,
            "and": ReduceOp.BAND, "or": ReduceOp.BOR, "xor": ReduceOp.BXOR,
            "mean": ReduceOp.AVG, "product": ReduceOp.PROD}
OP_NAMES = {**{o.value: o for o in ReduceOp}, **_ALIASES}  # lower-case name -> ReduceOp


@dataclass(frozen=True)
class Reducer:
    """A resolved operator for one dtype: how to combine, pre-scale and post-divide."""

    op: ReduceOp | None
    dtype: DType
    scalar: float | None = None
    user: UserOp | None = None

    @property
    def code(self) -> int:
        return 255 if self.op is None else self.op.code

    @property
    def name(self) -> str:
        if self.user is not None:
            return self.user.name
        assert self.op is not None
        return self.op.value

    def combine(self, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """out = a ⊕ b (``out`` may alias ``a`` or ``b``)."""
        if self.user is not None:
            fn = self.user.fn
            if isinstance(fn, np.ufunc):
                fn(a, b, out=out)
            else:
                out[...] = fn(a, b)
            return
        uf = _UFUNC[self.op]  # a user op returned above, so op is set
        if self.dtype is DType.BFLOAT16:
            with np.errstate(over="ignore", invalid="ignore"):
                f32_to_bf16(uf(bf16_to_f32(a), bf16_to_f32(b)), out=out)
        elif self.dtype.is_float:
            quiet(uf, a, b, out)  # inf/nan, silently, as NCCL
        else:
            uf(a, b, out=out)

    def premultiply(self, x: np.ndarray, out: np.ndarray) -> None:
        """out = scalar · x (PREMUL_SUM's pre-op)."""
        if self.dtype is DType.BFLOAT16:
            f32_to_bf16(bf16_to_f32(x) * np.float32(self.scalar), out=out)
        elif self.dtype.is_float:
            np.multiply(x, x.dtype.type(self.scalar), out=out)
        else:
            np.multiply(x, x.dtype.type(int(self.scalar or 0)), out=out)

    def postdivide(self, x: np.ndarray, nranks: int) -> None:
        """x /= nranks in place (AVG's post-op)."""
        if self.dtype is DType.BFLOAT16:
            f32_to_bf16(bf16_to_f32(x) / np.float32(nranks), out=x)
        elif self.dtype.is_float:
            np.divide(x, x.dtype.type(nranks), out=x)
        elif np.issubdtype(x.dtype, np.signedinteger):
            # C division truncates toward zero; floor division plus a correction does it
            # without abs(), which overflows at the most negative value.
            n = x.dtype.type(nranks)
            q = np.floor_divide(x, n)
            q += ((x - q * n) != 0) & (x < 0)
            np.copyto(x, q)
        else:
            np.floor_divide(x, x.dtype.type(nranks), out=x)


# the Reducer of every valid (ReduceOp, DType) pair, made once: a Reducer is frozen, and
# resolving a plain op was ~2 µs of an async call's ~20 µs of argument checks
_PLAIN: dict[tuple[ReduceOp, DType], Reducer] = {}


def resolve(op: object, dtype: DType) -> Reducer:
    """Validate ``op`` for ``dtype`` and return its Reducer (raises before anything is sent)."""
    red = _PLAIN.get((op, dtype)) if type(op) is ReduceOp else None
    if red is not None:
        return red
    if isinstance(op, PremulSum):
        if dtype not in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64) and \
                float(op.scalar) != int(op.scalar):
            raise ValueError(f"PREMUL_SUM scalar {op.scalar} is not an integer for {dtype.value}")
        return Reducer(ReduceOp.PREMUL_SUM, dtype, scalar=op.scalar)
    if isinstance(op, UserOp):
        return Reducer(None, dtype, user=op)
    if isinstance(op, np.ufunc) or (callable(op) and not isinstance(op, (ReduceOp, str))):
        return Reducer(None, dtype, user=UserOp(op, getattr(op, "__name__", "user")))
    if isinstance(op, str):
        key = op.strip().lower()
        op = OP_NAMES.get(key)
        if op is None:
            raise ValueError(f"unknown reduce op {key!r}; expected one of "
                             f"{[o.value for o in ReduceOp]}")
    if not isinstance(op, ReduceOp):
        # torch.distributed.ReduceOp members stringify as e.g. "RedOpType.SUM"
        name = str(getattr(op, "name", op)).split(".")[-1].lower()
        match = next((o for o in ReduceOp if o.name.lower() == name), None)
        if match is None:
            raise TypeError(f"op must be a ReduceOp, premul_sum(x), ufunc or callable, "
                            f"got {op!r}")
        op = match
    if op is ReduceOp.PREMUL_SUM:
        raise ValueError("PREMUL_SUM needs a scalar: use ringtree.premul_sum(scalar)")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype.is_float:
        raise TypeError(f"{op.name} is defined for integer dtypes, not {dtype.value}")
    red = _PLAIN[(op, dtype)] = Reducer(op, dtype)
    return red
