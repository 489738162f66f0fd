"""The protocol choice priced by the tuner's cost table reproduces the measured
thresholds: at every LL collective, rank count 2..8 and power-of-two size from 8 B to
64 MiB, under both shared-memory models, the cheaper (algorithm, protocol) pair has the
protocol the threshold table gave."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective
from ringtree.tuning import proto
from ringtree.tuning.proto import LL, LL_COLLECTIVES, SIMPLE, THRESHOLDS
from ringtree.tuning.tuner import MODELS


def measured(coll: Collective, nbytes: int, nranks: int) -> str:
    """The choice as the threshold table made it before it was priced."""
    two, more = THRESHOLDS[coll]
    return LL if nbytes <= (two if nranks <= 2 else more) else SIMPLE


@pytest.mark.parametrize("link", ["shm", "shm_crowded"])
@pytest.mark.parametrize("coll", sorted(LL_COLLECTIVES, key=lambda c: c.value),
                         ids=lambda c: c.value)
def test_priced_choice_is_the_measured_one(coll, link):
    model = MODELS[link]
    wrong = []
    for n in range(1, 9):
        for k in range(3, 27):
            nbytes = 0 if coll is Collective.BARRIER else 1 << k
            got = proto.choose_protocol(coll, nbytes, n, None, True, model)
            if got != measured(coll, nbytes, n):
                wrong.append((n, nbytes, got))
    assert not wrong, wrong


def test_pairs_rank_ll_with_the_simple_algorithms():
    ar = Collective.ALL_REDUCE
    pairs = proto.rank_pairs(ar, 64, 4, None, MODELS["shm"], "direct")
    assert pairs[0][0] == ("direct", LL)
    assert {p for (_, p), _ in pairs} == {LL, SIMPLE}
    assert pairs[0][1] == proto.ll_cost(ar, 64, 4, MODELS["shm"])
    big = proto.rank_pairs(ar, 2 * THRESHOLDS[ar][1], 4, None, MODELS["shm"], "direct")
    assert big[0][0][1] == SIMPLE
    assert all(p == SIMPLE for (_, p), _ in proto.rank_pairs(ar, 64, 4, None, MODELS["shm"], None))
