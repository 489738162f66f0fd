"""An all-gather in place (``x`` is the output's own block, as nccl-tests' in-place column
and FSDP's ``all_gather_into_tensor`` pass it) runs in the C entries once its shape is
kept: the segment's (``Round.ghot``: its own block not copied, the peers' blocks placed
around it) and the single copy's (``Round.dcall``: the peers read it where it lies, or
it is pushed into theirs). Every dtype's bytes, in the line, the cell and the single
copy's sizes, on 2 and 3 ranks, with the kernel and without; a kept shape in place goes
past the method's frame as often as out of place (never on 2 ranks with the kernel); an
input that overlaps the output elsewhere is still refused."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.runtime.protocols.ll_runner import LLRunner
from ringtree.testing import run_ranks

COUNTS = (3, 4096, 300_000)  # float32: in the line, in the cell, the single copy's


def _part(dtype: str, rank: int, count: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(104729 * k + rank)
    return rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)


def in_place(comm, dtypes: tuple) -> dict:
    n, r = comm.size, comm.rank
    past: list = []
    real = LLRunner.gather_now

    def counted(*args, **kw):
        past.append(1)
        return real(*args, **kw)

    LLRunner.gather_now = counted
    wrong, away = 0, []
    for dtype in dtypes:
        for count in COUNTS:
            out = np.empty(n * count, dtype)
            mine = out[r * count:(r + 1) * count]
            for apart in (False, True):  # in place, then its shape out of place
                for k in range(4):
                    if k == 2:
                        del past[:]  # the shape is kept after the first call or two
                    x = mine if not apart else _part(dtype, r, count, k)
                    x[...] = _part(dtype, r, count, k)
                    got = comm.all_gather(x, out=out)
                    want = np.concatenate([_part(dtype, q, count, k) for q in range(n)])
                    wrong += int(got is not out or out.tobytes() != want.tobytes())
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
def test_all_gather_in_place_every_path(nranks, env):
    dtypes = ("float32", "int8", "float64", "float16") if not env else ("float32",)
    for r, got in enumerate(run_ranks(in_place, nranks, dtypes, timeout=180, env=env)):
        assert got["wrong"] == 0, (r, got)
        assert "overlap" in got["refused"], (r, got)
        # in place, a kept shape goes past the method's frame exactly as often as out of
        # place (never where its op has a C entry; the shared copies' Python steps do)
        inside, apart = got["away"][0::2], got["away"][1::2]
        assert inside == apart, (r, got)
        if not env and nranks == 2:
            assert inside == [0] * len(inside), (r, got)
