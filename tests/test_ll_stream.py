"""Streaming (non-temporal) stores into LL's segment (``copy_out`` in
``transports/_llc.c``, from ``SHARE_NT`` = 4096 bytes): contributions just below, at and
above the boundary, lengths that leave a tail of less than one 64-byte store, a source
that is not aligned, through the fold round and the split, compiled and in Python, give
the rank-order fold's bits."""

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

# (dtype, op, element counts): 4095, 4096, 4097 and 4096 + 63 bytes, odd counts
CASES = [("uint8", "bxor", (4095, 4096, 4097, 4159)), ("float32", "sum", (1023, 1024, 1025)),
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
                for shift in (0, 1):  # a source one element past an aligned start
                    x = np.empty(count + shift, dt.storage)[shift:]
                    x[...] = _input(r, count, dt, op)
                    got = c.all_reduce(x.copy() if shift == 0 else x, dt, red)
                    if got.tobytes() != _want(n, count, dt, op).tobytes():
                        bad.append(f"{dname} {op} count={count} shift={shift}")
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
