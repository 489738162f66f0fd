"""Disagreements on root or algorithm are a MismatchError on every involved rank, naming
both values (algorithms by name), within seconds instead of at the timeout."""

from __future__ import annotations

import numpy as np
import pytest

import ringtree
from ringtree.testing import run_ranks

ENV = {"RINGTREE_TIMEOUT": "60"}  # only the fingerprint check can end these in time


def reduce_roots(comm):
    x = np.ones(1024, np.float32)
    root = 2 if comm.rank == 2 else 0
    try:
        comm.reduce(x, root=root)
        for _ in range(3):  # a rank that only sends returns; it learns at its next call
            comm.barrier()
    except ringtree.RingtreeError as e:
        return type(e).__name__, str(e)
    return "returned", ""


def broadcast_roots(comm):
    x = np.full(1024, comm.rank, np.float32)
    root = 2 if comm.rank >= 2 else 0
    try:
        comm.broadcast(x, root=root)
        # A root only sends, and a pair of ranks that agree can finish the broadcast
        # between themselves: such a rank learns of the mismatch at its next calls.
        for _ in range(3):
            comm.barrier()
    except ringtree.RingtreeError as e:
        return type(e).__name__, str(e)
    return "returned", ""


def algos(comm):
    x = np.ones(1 << 12, np.float32)
    try:
        comm.all_reduce(x, algo="ring" if comm.rank == 0 else "tree")
    except ringtree.RingtreeError as e:
        return type(e).__name__, str(e)
    return "returned", ""


@pytest.mark.parametrize("fn,field,values", [
    (reduce_roots, "root", ("0", "2")),
    (broadcast_roots, "root", ("0", "2")),
    (algos, "algorithm", ("ring", "tree")),
])
def test_disagreement_is_a_mismatch_on_every_rank(fn, field, values):
    n = 2 if fn is algos else 4
    res = run_ranks(fn, n, timeout=50, env=ENV)
    for r, v in enumerate(res):
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        kind, msg = v
        assert kind == "MismatchError", f"rank {r}: {kind} {msg}"
        assert f"{field}:" in msg, f"rank {r}: {msg}"
        if fn is not broadcast_roots:  # there the first detector may see a stale message
            assert all(f"has {x}" in msg for x in values), f"rank {r}: {msg}"
