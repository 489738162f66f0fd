"""The bitwise rule of the online choice (ringtree.tuning.same_bits): which pairs of
reduction schedules the symbolic proof finds bit-identical, element by element. The
testbed half (``test_online_choice.py``) runs the pairs it proves on random floats and
compares the bits."""

from __future__ import annotations

from ringtree.ir.program import Collective
from ringtree.schedules import Options
from ringtree.schedules.hierarchical import ALL_REDUCE_PIECE_BYTES, pieces_for
from ringtree.tuning.same_bits import same_bits

TWO_BY_TWO = (0, 0, 1, 1)


def _opts(coll: Collective, nbytes: int, nodes=TWO_BY_TWO, root: int = 0) -> Options:
    params = () if coll is Collective.REDUCE else pieces_for(
        nbytes, nodes, 1, ALL_REDUCE_PIECE_BYTES if coll is Collective.ALL_REDUCE
        else 1 << 20)
    return Options(root=root, channels=1, nodes=nodes, params=params)


def test_same_bits_on_two_hosts_of_two():
    ar, rs = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER
    o = _opts(ar, 8)
    # leaders reduce their host first, then across: recursive doubling's pairs exactly
    assert same_bits(ar, "hierarchical", "recursive_doubling", 4, o, (2,), False)
    assert same_bits(ar, "hierarchical", "recursive_doubling", 4, o, (2,), True)
    # a ring adds one rank at a time: another association
    assert not same_bits(ar, "ring", "recursive_doubling", 4, o, (2,), False)
    assert not same_bits(ar, "ring", "hierarchical", 4, o, (1000,), False)
    assert not same_bits(rs, "halving", "hierarchical", 4, _opts(rs, 8), (1,) * 4, False)
    assert same_bits(ar, "ring", "ring", 4, o, (7,), False)


def test_same_bits_compares_elements_not_chunks():
    """Two algorithms may cut a block into different chunks: the proof lays each chunk's
    tree over its elements. One rank per host: the hierarchical reduce-scatter is the
    leaders' ring, element for element, for any count (uneven splits included)."""
    rs = Collective.REDUCE_SCATTER
    one_each = (0, 1, 2, 3)
    for count in (1, 5, 7, 1001):
        o = _opts(rs, count * 16, one_each)
        assert same_bits(rs, "hierarchical", "ring", 4, o, (count,) * 4, False), count
        assert not same_bits(rs, "halving", "ring", 4, o, (count,) * 4, False), count


def test_same_bits_of_a_reduce_looks_at_the_root_only():
    red = Collective.REDUCE
    for root in range(4):
        assert same_bits(red, "ring", "tree", 4, _opts(red, 64, root=root), (16,), False)
    assert not same_bits(red, "ring", "tree", 8, _opts(red, 64, (0,) * 4 + (1,) * 4),
                         (16,), False)


