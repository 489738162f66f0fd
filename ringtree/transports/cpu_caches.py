"""The CPU's data caches, from Linux's sysfs (``/sys/devices/system/cpu/cpuN/cache``).

Some of the shared-memory paths choose between cached and streamed (non-temporal)
stores by whether the bytes they touch fit the caches; where the sizes cannot be read
(another OS, a container without sysfs) :data:`DEFAULT` stands in.
"""

from __future__ import annotations

import functools
import os

__all__ = ["DEFAULT", "level_bytes"]

# level -> bytes assumed when sysfs says nothing (a common server core's L2 and L3)
DEFAULT = {1: 32 << 10, 2: 1 << 20, 3: 32 << 20}
_ROOT = "/sys/devices/system/cpu/cpu{}/cache"
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    text = text.strip()
    return int(text[:-1]) * _UNITS[text[-1]] if text[-1:] in _UNITS else int(text)


@functools.cache
def _levels(cpu: int) -> dict[int, int]:
    """level -> bytes of the data (or unified) cache of ``cpu``, as sysfs lists them."""
    found: dict[int, int] = {}
    root = _ROOT.format(cpu)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found
    for name in names:
        if not name.startswith("index"):
            continue
        try:
            with open(os.path.join(root, name, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(root, name, "level")) as f:
                level = int(f.read())
            with open(os.path.join(root, name, "size")) as f:
                size = _size(f.read())
        except (OSError, ValueError, KeyError):
            continue
        if kind in ("Data", "Unified"):
            found[level] = size
    return found


def level_bytes(level: int, cpu: int = 0) -> int:
    """Bytes of the level-``level`` data cache of ``cpu`` (the L3: the whole cache its
    core shares), or :data:`DEFAULT`'s where sysfs does not say."""
    return _levels(cpu).get(level, DEFAULT.get(level, 0))
