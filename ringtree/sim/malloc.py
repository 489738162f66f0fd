"""Keep the simulator's temporary arrays in the heap (glibc's ``mallopt``).

The batched engines (:mod:`.batched`, :mod:`.fixed_point`) allocate and free arrays of a few
hundred KiB to a few MiB at every level. glibc serves allocations above its mmap
threshold with fresh ``mmap`` pages and returns them with ``munmap``, so every level pays
page faults and zeroing; the threshold adapts upwards only after a large block is freed,
which a fresh process has not yet done. Fixing the threshold at 64 MiB and the trim
threshold at 1 GiB keeps such arrays in the heap: the README command's ring row
(dgx_h100_sharp ×128, 8 B–1 GiB) 33.2 → 25.0 s, peak memory 741 → 743 MiB.

This is process-wide, so ``ringtree sim`` and the simulator's benchmarks call
:func:`keep_arrays_in_heap`; a program that calls :func:`ringtree.sim.simulate` itself
may call it too (or set ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``, which
glibc reads at start). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_arrays_in_heap"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3          # <malloc.h>
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 1 << 30


def keep_arrays_in_heap() -> bool:
    """Set glibc's mmap and trim thresholds (see above); False where there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
