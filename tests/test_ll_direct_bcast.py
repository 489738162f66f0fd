"""A large single-copy broadcast's shared copies (``ll_direct_bcast``): the root's bytes
on every rank from every root, on 2 and 3 ranks and 4 on 2 cores, every piece copied
once between the root and its reader; ranks that do not share beside ranks that do; a
peer killed during the copies named."""

from __future__ import annotations

import numpy as np
import pytest
from hot_entry_cases import KILL_ENV, assert_killed_named, killed_peer

from ringtree.runtime.protocols import ll_direct, ll_direct_bcast
from ringtree.runtime.protocols.ll_direct import SHARE_PIECE
from ringtree.testing import run_ranks
from ringtree.transports import shm_cma as cma

NBYTES = 3 * SHARE_PIECE + 8 * 123  # three pieces and a part of one
DTYPES = ("uint8", "int32", "float16", "float32", "float64")


def _bytes(dtype: str, rank: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(104729 * k + rank)
    return rng.integers(0, 256, NBYTES, dtype=np.uint8).view(dtype)


def _spy() -> dict:
    """This process's pieces claimed, by peer and direction."""
    seen: dict = {}
    claim = ll_direct.Direct.claim

    def counted(self, peer, index, local, remote, nbytes, write, bounce=False):
        e, got = claim(self, peer, index, local, remote, nbytes, write, bounce)
        seen[(peer, write)] = seen.get((peer, write), 0) + got
        return e, got
    ll_direct.Direct.claim = counted
    return seen


def broadcasts(comm, share: bool) -> dict:
    """Broadcasts of every dtype's random bytes from every root in turn (``share``: this
    rank shares its copies, else it copies every piece itself): the wrong ones, the
    pieces this rank claimed, and whether its ops shared."""
    seen, wrong, shared = _spy(), [], set()
    real = ll_direct_bcast.BroadcastOp.__init__

    def init(self, *args):
        real(self, *args)
        self.shared = self.shared and share
        shared.add(self.shared)
    ll_direct_bcast.BroadcastOp.__init__ = init
    for dtype in DTYPES:
        for k in range(comm.size):
            x = _bytes(dtype, comm.rank, k)
            comm.broadcast(x, k)
            if x.tobytes() != _bytes(dtype, k, k).tobytes():
                wrong.append(f"{dtype} root {k}")
    return {"wrong": wrong, "pieces": sum(seen.values()), "shared": sorted(shared)}


@pytest.mark.parametrize("nranks", [2, 3, 4], ids=["2", "3", "4-on-2-cores"])
def test_every_root_and_dtype_with_the_copies_shared(nranks):
    if not cma.can_claim():
        pytest.skip("no compiled _cma (its atomic add)")
    res = run_ranks(broadcasts, nranks, True, timeout=120)
    pieces = -(-NBYTES // SHARE_PIECE)
    for r, got in enumerate(res):
        assert got["wrong"] == [] and got["shared"] == [True], (r, got)
    # each reader's pieces copied once, by it or by the root, in every call
    calls = len(DTYPES) * nranks
    assert sum(got["pieces"] for got in res) == calls * (nranks - 1) * pieces, res


def test_a_rank_that_does_not_share_beside_one_that_does():
    if not cma.can_claim():
        pytest.skip("no compiled _cma (its atomic add)")

    def mixed(comm):
        return broadcasts(comm, comm.rank == 0)
    res = run_ranks(mixed, 2, timeout=120)
    assert [got["wrong"] for got in res] == [[], []], res
    assert [got["shared"] for got in res] == [[True], [False]], res


def test_a_peer_killed_during_the_copies_is_named():
    def call(comm):
        x = np.zeros(NBYTES // 4, np.float32)
        return killed_peer(comm, lambda: comm.broadcast(x, 0))
    assert_killed_named(run_ranks(call, 3, timeout=60, env=KILL_ENV))


def test_more_ranks_than_a_line_has_counters_for():
    """9 ranks on 2 cores, every root: more ranks than ``SHARE_MAX``, whose counters
    would lie past a line's inline payload, so the broadcast reads its pieces unshared
    (sharing there overwrote the next words and hung the call)."""
    assert ll_direct.SHARE_MAX < 9

    def every_root(comm) -> list:
        wrong = []
        for root in range(comm.size):
            x = _bytes("float32", comm.rank, root)
            comm.broadcast(x, root, timeout=30.0)
            if x.tobytes() != _bytes("float32", root, root).tobytes():
                wrong.append(root)
        return wrong
    assert run_ranks(every_root, 9, timeout=240) == [[]] * 9
