"""An all-gather or reduce-scatter in place (``x`` the all-gather's output's own block,
the reduce-scatter's output ``x``'s own block, as nccl-tests' in-place columns and FSDP
pass them) runs in the C entries once its shape is kept: the segment's (``Round.ghot``:
its own block not copied, the peers' blocks placed around it; ``Round.shot``: the own row
folded through a tile) and the single copy's (``Round.dcall``: the peers read it where
it lies, or it is pushed into theirs; the fold through a tile). Exact bytes of four
dtypes, in the line, the cell and the single copy's sizes, on 2 and 3 ranks, with the
kernel and without; on 2 ranks with the kernel a kept shape in place does not go past the
method's frame where its op has a C entry; an input that overlaps the output elsewhere is
still refused."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.runtime.protocols.ll_runner import LLRunner
from ringtree.testing import run_ranks

COUNTS = (3, 4096, 300_000)  # float32: in the line, in the cell, the single copy's
CALLS = {True: 12, False: 4}  # out of place (its octave measured on the first), in place


def _part(dtype: str, rank: int, count: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(104729 * k + rank)
    return rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def _small(dtype: str, rank: int, count: int, k: int) -> np.ndarray:
    """Small integers in ``dtype``: any order of their sum is exact (a reduce-scatter's)."""
    return ((np.arange(count) * 7 + 3 * rank + k) % 11).astype(dtype)


def in_place(comm, dtypes: tuple) -> dict:
    n, r = comm.size, comm.rank
    past: list = []
    for name in ("gather_now", "scatter_now"):
        real = getattr(LLRunner, name)

        def counted(*args, _real=real, **kw):
            past.append(1)
            return _real(*args, **kw)

        setattr(LLRunner, name, counted)
    wrong, away = 0, []
    for dtype in dtypes:
        for count in COUNTS:
            out = np.empty(n * count, dtype)
            mine = out[r * count:(r + 1) * count]
            for apart in (True, False):  # the shape out of place, then in place
                for k in range(CALLS[apart]):
                    if k == CALLS[apart] - 2:
                        del past[:]  # the shape kept (and measured: ll_crossover)
                    x = mine if not apart else _part(dtype, r, count, k)
                    x[...] = _part(dtype, r, count, k)
                    got = comm.all_gather(x, out=out)
                    want = np.concatenate([_part(dtype, q, count, k) for q in range(n)])
                    wrong += int(got is not out or out.tobytes() != want.tobytes())
                away.append(len(past))
            x = np.empty(n * count, dtype)
            mine = x[r * count:(r + 1) * count]
            for apart in (True, False):  # the reduce-scatter's, likewise
                for k in range(CALLS[apart]):
                    if k == CALLS[apart] - 2:
                        del past[:]
                    x[...] = _small(dtype, r, n * count, k)
                    o = mine if not apart else np.empty(count, dtype)
                    got = comm.reduce_scatter(x, out=o)
                    want = sum(_small(dtype, q, n * count, k)[r * count:(r + 1) * count]
                               for q in range(n)).astype(dtype)
                    wrong += int(got is not o or o.tobytes() != want.tobytes())
                away.append(len(past))
    out = np.zeros(n * 8, np.float32)
    try:  # overlapping the output, but not as its own block
        comm.all_gather(out[1:9], out=out)
        refused = "no error"
    except ValueError as e:
        refused = str(e)
    return {"wrong": wrong, "away": away, "refused": refused}


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("env", [{}, {"RINGTREE_LL_NATIVE": "0"}], ids=["kernel", "python"])
def test_in_place_every_path(nranks, env):
    dtypes = ("float32", "int8", "float64", "float16") if not env else ("float32",)  # (f16 last)
    for r, got in enumerate(run_ranks(in_place, nranks, dtypes, timeout=180, env=env)):
        assert got["wrong"] == 0, (r, got)
        assert "overlap" in got["refused"], (r, got)
        # on 2 ranks with the kernel a kept shape in place (after the same shape out of
        # place, which the crossover may measure) goes past the method's frame exactly
        # as often as out of place: never but for float16's reduce-scatter (no C fold)
        if not env and nranks == 2:
            apart, inside = got["away"][0::2], got["away"][1::2]
            assert inside == apart and inside[:-2 * len(COUNTS)] == [0] * (
                len(inside) - 2 * len(COUNTS)), (r, got)
