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
