"""Tests of the message header (ringtree.ir.wire) and the collective records it decodes
(ringtree.ir.collectives)."""

from __future__ import annotations

from ringtree.dtypes import DType
from ringtree.ir.collectives import SPECS, Collective
from ringtree.ir.wire import WireHeader, algo_code
from ringtree.ops import ReduceOp


def _header(**kw) -> WireHeader:
    base = dict(nbytes=40, count=10, seq=7, algo=algo_code("ring"),
                coll=Collective.ALL_REDUCE.code, dtype=DType.FLOAT32.code,
                op=ReduceOp.SUM.code, flags=0, root=-1)
    return WireHeader(**{**base, **kw})


def test_pack_unpack_round_trip_and_framing():
    h = _header()
    raw = h.pack()
    assert len(raw) == WireHeader.SIZE == 32
    assert WireHeader.unpack(raw) == h
    assert WireHeader.frame(40, h.call_part()) == raw
    assert WireHeader.payload_bytes(raw) == 40


def test_a_difference_is_described_by_name():
    mine = _header()
    theirs = _header(nbytes=48, count=12, algo=algo_code("tree"),
                     coll=Collective.REDUCE.code, op=ReduceOp.MAX.code)
    text = "; ".join(mine.describe_difference(theirs, me=0, peer=1))
    assert "count: rank 1 has 12, rank 0 has 10" in text
    assert "algorithm: rank 1 has tree, rank 0 has ring" in text
    assert "collective: rank 1 has reduce, rank 0 has all_reduce" in text
    assert "op: rank 1 has max, rank 0 has sum" in text
    assert "message bytes" not in text  # explained by the count


def test_every_collective_has_one_record_with_its_code():
    assert set(SPECS) == set(Collective)
    assert [s.code for s in SPECS.values()] == list(range(len(Collective)))
    assert Collective.ALL_GATHER.blocks(4) == (1, 4)
    assert Collective.BARRIER.blocks(4) == (0, 0)
    assert {c for c in Collective if c.reduces} == {
        Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER}
