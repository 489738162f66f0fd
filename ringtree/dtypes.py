"""Element types and how user buffers become flat NumPy views (zero-copy).

bfloat16 has no NumPy dtype: it is carried as ``uint16`` storage and reduced in float32
(bf16 → f32 is exact; f32 → bf16 rounds to nearest even, as torch and NCCL do).
"""

from __future__ import annotations

from enum import Enum
from typing import cast

import numpy as np
from numpy.typing import DTypeLike


class DType(str, Enum):
    INT8 = "int8"
    UINT8 = "uint8"
    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def storage(self) -> np.dtype:
        """The NumPy dtype holding the bits."""
        return np.dtype(np.uint16) if self is DType.BFLOAT16 else np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)

    @property
    def code(self) -> int:
        return _DTYPE_CODES[self]

    @property
    def nccl_name(self) -> str:
        """nccl-tests' spelling (``float``, ``half``, ``bfloat16``, ``int32`` ...)."""
        return {
            DType.INT8: "int8", DType.UINT8: "uint8", DType.INT32: "int32",
            DType.UINT32: "uint32", DType.INT64: "int64", DType.UINT64: "uint64",
            DType.FLOAT16: "half", DType.BFLOAT16: "bfloat16", DType.FLOAT32: "float",
            DType.FLOAT64: "double",
        }[self]


_DTYPE_CODES = {d: i for i, d in enumerate(DType)}
_FROM_NUMPY = {np.dtype(d.value): d for d in DType if d is not DType.BFLOAT16}

_ALIASES = {
    "float": DType.FLOAT32, "half": DType.FLOAT16, "double": DType.FLOAT64,
    "bf16": DType.BFLOAT16, "fp16": DType.FLOAT16, "fp32": DType.FLOAT32,
    "fp64": DType.FLOAT64, "int": DType.INT32, "char": DType.INT8,
    "f16": DType.FLOAT16, "f32": DType.FLOAT32, "f64": DType.FLOAT64,
}


def parse_dtype(d: object) -> DType:
    """DType from a DType, a name (NumPy or nccl-tests spelling), a NumPy or torch dtype."""
    if isinstance(d, DType):
        return d
    if isinstance(d, np.dtype) and d in _FROM_NUMPY:
        return _FROM_NUMPY[d]
    name = str(d).lower()
    if name.startswith("torch."):
        name = name[len("torch."):]
    if name in _ALIASES:
        return _ALIASES[name]
    try:
        return DType(name)
    except ValueError:
        pass
    try:
        return DType(np.dtype(cast(DTypeLike, d)).name)
    except (TypeError, ValueError):
        raise TypeError(f"unsupported dtype {d!r}; supported: {[t.value for t in DType]}") from None


def as_flat(x: object, what: str = "buffer", writable: bool = True) -> tuple[np.ndarray, DType]:
    """A flat, zero-copy NumPy view of ``x`` in storage dtype, and its DType.

    Accepts NumPy arrays, torch CPU tensors (through ``Tensor.numpy()``; bfloat16 through an
    int16 view) and buffer-protocol objects (as uint8 unless they carry a format). Raises
    TypeError/ValueError for what cannot be viewed without a copy.
    """
    if type(x).__module__.startswith("torch"):
        return _torch_flat(x, what)
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError:
            raise TypeError(f"{what}: expected an array, tensor or buffer, got "
                            f"{type(x).__name__}") from None
    dt = _FROM_NUMPY.get(arr.dtype)  # (a dtype's .name is built in Python: ~3 µs)
    if dt is None and arr.dtype.name == "bfloat16":  # ml_dtypes
        dt = DType.BFLOAT16
        arr = arr.view(np.uint16)
    elif dt is None:
        dt = parse_dtype(arr.dtype)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (got strides {arr.strides}); "
                         f"pass np.ascontiguousarray(x)")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only but the collective writes to it")
    return (arr if arr.ndim == 1 else arr.reshape(-1)), dt


_FROM_TORCH: dict = {}  # torch dtype -> DType, as met


def _torch_flat(t: object, what: str) -> tuple[np.ndarray, DType]:
    """:func:`as_flat` of a torch tensor. Each step is the cheap form of its check (an
    async ``dist.all_reduce`` paid ~8 µs here): ``is_cpu`` (``device.type`` builds a
    device, ~0.8 µs), a detached view only under autograd (~0.9 µs), no reshape of a
    flat view, the dtype from a table filled as dtypes are met."""
    import torch  # noqa: PLC0415 (optional dependency)

    assert isinstance(t, torch.Tensor)
    if not t.is_cpu:
        raise ValueError(f"{what} is on {t.device}; ringtree moves CPU memory")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous; call .contiguous() first")
    dt = _FROM_TORCH.get(t.dtype)
    if dt is None:  # parse_dtype reads the dtype's name: ~2.5 µs, once per torch dtype
        dt = _FROM_TORCH[t.dtype] = parse_dtype(t.dtype)
    if t.requires_grad:
        t = t.detach()
    if dt is DType.BFLOAT16:
        arr = t.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = t.numpy()
    return (arr if arr.ndim == 1 else arr.reshape(-1)), dt


def bf16_to_f32(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 to bfloat16 bits, nearest-even; NaNs stay (quiet) NaNs."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    if out is not None:
        out[...] = rounded
        return out
    return rounded
