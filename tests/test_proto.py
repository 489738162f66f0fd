"""RINGTREE_PROTO parsing (NCCL_PROTO syntax) and the size rule choosing LL or Simple."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective
from ringtree.tuning.proto import LL, SIMPLE, THRESHOLDS, choose_protocol, parse_proto_spec

AR, BC, GA = Collective.ALL_REDUCE, Collective.BROADCAST, Collective.GATHER


def test_empty_enables_both():
    assert all(v == {LL, SIMPLE} for v in parse_proto_spec("").values())


@pytest.mark.parametrize("spec, coll, want", [
    ("LL", AR, {LL}), ("simple", AR, {SIMPLE}), ("^LL", BC, {SIMPLE}),
    ("Simple;allreduce:LL", AR, {LL}), ("Simple;allreduce:LL", BC, {SIMPLE}),
    ("LL,Simple;broadcast:^LL", BC, {SIMPLE}), ("LL,Simple;broadcast:^LL", AR, {LL, SIMPLE}),
    ("allreduce:^simple", AR, {LL}), ("allreduce:^simple", BC, {LL, SIMPLE}),
])
def test_nccl_proto_syntax(spec, coll, want):
    assert parse_proto_spec(spec)[coll] == want


@pytest.mark.parametrize("spec, words", [
    ("LL128", "unknown protocol"), ("ring", "unknown protocol"),
    ("LL;Simple", "prefix"), ("nosuch:LL", "nosuch"), ("^LL,Simple", "no protocol"),
])
def test_bad_specs_are_errors(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_proto_spec(spec)


def test_size_rule():
    limit = THRESHOLDS[AR][1]
    assert choose_protocol(AR, 8, 4, None, True) == LL
    assert choose_protocol(AR, limit, 4, None, True) == LL
    assert choose_protocol(AR, 2 * limit, 4, None, True) == SIMPLE
    assert choose_protocol(AR, 8, 4, None, False) == SIMPLE       # LL cannot run here
    assert choose_protocol(GA, 8, 4, None, True) == SIMPLE        # not an LL collective
    assert choose_protocol(None, 8, 4, None, True) == SIMPLE      # send/recv
    assert choose_protocol(AR, 1 << 30, 4, {LL}, True) == LL      # forced
    assert choose_protocol(AR, 8, 4, {SIMPLE}, True) == SIMPLE    # forced off
    assert choose_protocol(GA, 8, 4, {LL}, True) == SIMPLE        # forced, but cannot
