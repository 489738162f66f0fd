"""Streaming (non-temporal) stores into LL's segment (``copy_out`` in
``transports/_llc.c``, from ``SHARE_NT`` = 4096 bytes): contributions just below, at and
above the boundary, lengths that leave a tail of less than one 64-byte store, a source
that is not aligned, in place and into another array (the fold round then reads the
own row from the input), through the fold round and the split, compiled and in Python,
give the rank-order fold's bits."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_ll import _ll
from test_ll_native import _input
from test_ll_split import _want

from ringtree.dtypes import DType
from ringtree.ops import resolve
from ringtree.runtime.protocols import ll_split
from ringtree.testing import run_ranks
from ringtree.transports import shm_native

# (dtype, op, element counts): 4095, 4096, 4097 and 4096 + 63 bytes, odd counts, and
# 36004 bytes (four 8 KiB tiles of the fold and a rest)
CASES = [("uint8", "bxor", (4095, 4096, 4097, 4159)), ("float32", "sum", (1023, 1024, 1025, 9001)),
         ("float64", "max", (511, 513)), ("bfloat16", "sum", (2047, 2049)),
         ("int64", "prod", (513,))]


def streamed(comm, native: str, split: bool) -> list[str]:
    os.environ["RINGTREE_LL_NATIVE"] = native
    if split:
        ll_split.SPLIT_MIN = 64  # this process only: every call below runs split
    c = _ll(comm, f"nt{native}{int(split)}", cell=64 << 10)
    n, r = comm.size, comm.rank
    bad = []
    try:
        for dname, op, counts in CASES:
            dt = DType(dname)
            red = resolve(op, dt)
            for count in counts:
                for shift, out in ((0, False), (1, False), (0, True), (1, True)):
                    x = np.empty(count + shift, dt.storage)[shift:]  # maybe not aligned
                    x[...] = _input(r, count, dt, op)
                    y = np.empty(count + shift, dt.storage)[shift:] if out else None
                    got = c.all_reduce(x, dt, red, out=y)
                    if got.tobytes() != _want(n, count, dt, op).tobytes():
                        bad.append(f"{dname} {op} count={count} shift={shift} out={out}")
                    if out and x.tobytes() != _input(r, count, dt, op).tobytes():
                        bad.append(f"{dname} {op} count={count}: the input changed")
    finally:
        os.environ.pop("RINGTREE_LL_NATIVE", None)
        c.ll.close()
    return bad


@pytest.mark.parametrize("nranks,native,split", [
    (2, "1", False), (2, "1", True), (3, "1", True), (2, "0", False)])
def test_streamed_contributions_give_the_rank_order_bits(nranks, native, split):
    if native == "1" and not shm_native.available():
        pytest.skip("ringtree.transports._llc not built (no C compiler)")
    assert run_ranks(streamed, nranks, native, split, timeout=90) == [[]] * nranks


def blocks(comm) -> list[str]:
    """All-gather (Round.gather streams its part) and reduce-scatter (Round.scatter
    streams every block but its own, or all of x in place) around the boundary."""
    c = _ll(comm, "ntb", cell=64 << 10)
    n, r = comm.size, comm.rank
    dt, red = DType.UINT8, resolve("bxor", DType.UINT8)
    bad = []
    try:
        for per in (4095, 4096, 4097, 4159):
            got = c.all_gather(_input(r, per, dt, "move"), dt)
            want = np.concatenate([_input(q, per, dt, "move") for q in range(n)])
            if got.tobytes() != want.tobytes():
                bad.append(f"all_gather {per}")
            x = _input(r, per * n, dt, "bxor")
            want = _want(n, per * n, dt, "bxor")[r * per:(r + 1) * per]
            for in_place in (False, True):
                out = x[r * per:(r + 1) * per] if in_place else None
                got = c.reduce_scatter(x.copy() if not in_place else x, dt, red, out=out)
                if got.tobytes() != want.tobytes():
                    bad.append(f"reduce_scatter {per} in_place={in_place}")
    finally:
        c.ll.close()
    return bad


def test_streamed_all_gather_and_reduce_scatter_parts():
    if not shm_native.available():
        pytest.skip("ringtree.transports._llc not built (no C compiler)")
    assert run_ranks(blocks, 2, timeout=90) == [[], []]
