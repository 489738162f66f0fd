"""Reading ringtree's numeric environment variables: unset or empty means the default, a
value that does not parse is an error naming the variable (never a silent default)."""

from __future__ import annotations

import os


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


MIN_TIMEOUT = 1e-3


def as_timeout(value: object, what: str = "timeout") -> float:
    """A deadline in seconds: a real number of at least :data:`MIN_TIMEOUT`, or ``math.inf``.

    Anything else (``-1``, ``0``, ``nan``, ``1e-9``, ``'5'``, ``True``) raises before any
    rank sends a byte, so a bad value never times out on one rank only.
    """
    import math
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds (int or float), "
                        f"got {type(value).__name__} {value!r}")
    t = float(value)
    if math.isnan(t) or t < MIN_TIMEOUT:
        raise ValueError(f"{what} must be at least {MIN_TIMEOUT:g} s (or math.inf), "
                         f"got {value!r}")
    return t


def env_timeout(name: str, default: float) -> float:
    """``as_timeout`` for an environment variable (unset or empty: ``default``)."""
    raw = os.environ.get(name, "").strip()
    return default if not raw else as_timeout(env_float(name, default), name)
