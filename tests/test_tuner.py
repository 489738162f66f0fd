"""RINGTREE_ALGO parsing (NCCL_ALGO syntax) and the schedule-derived cost model."""

from __future__ import annotations

import pytest

from ringtree.ir.program import Collective as C
from ringtree.schedules import Options, algorithms
from ringtree.schedules.stats import schedule_stats
from ringtree.tuning.tuner import MODELS, choose, estimate, parse_algo_spec, tuned


def test_empty_spec_enables_everything():
    enabled = parse_algo_spec("")
    assert enabled[C.ALL_REDUCE] == tuned(C.ALL_REDUCE)   # all but what runs where named
    assert set(algorithms(C.ALL_REDUCE)) - tuned(C.ALL_REDUCE) == {"nvls", "nvls_tree"}


def test_first_entry_without_prefix_and_per_collective_negation():
    enabled = parse_algo_spec("ring,tree;allreduce:^tree")
    assert enabled[C.ALL_REDUCE] == tuned(C.ALL_REDUCE) - {"tree"}
    assert enabled[C.ALL_GATHER] == {"ring"}
    assert enabled[C.BROADCAST] == {"ring", "tree"}
    # a prefix-less list leaves collectives that have none of its algorithms alone
    assert enabled[C.GATHER] == set(algorithms(C.GATHER))


def test_nccl_style_prefix_only():
    enabled = parse_algo_spec("allreduce:^tree")
    assert "tree" not in enabled[C.ALL_REDUCE] and "ring" in enabled[C.ALL_REDUCE]
    # every algorithm the tuner offers by itself (LL's one-round broadcast only if named)
    assert enabled[C.BROADCAST] == tuned(C.BROADCAST) == set(algorithms(C.BROADCAST)) - {"direct"}


def test_one_round_schedules_of_ll_run_on_simple_only_when_named():
    assert "direct" in parse_algo_spec("broadcast:direct")[C.BROADCAST]
    assert "direct" in parse_algo_spec("direct")[C.BARRIER]
    assert "direct" not in parse_algo_spec("^ring")[C.REDUCE]


@pytest.mark.parametrize("spec,word", [("rnig", "unknown algorithm"),
                                       ("ring;tree", "must have a 'collective:' prefix"),
                                       ("allreduc:ring", "unknown collective")])
def test_bad_specs_are_errors(spec, word):
    with pytest.raises(ValueError, match=word):
        parse_algo_spec(spec)


def test_choose_respects_the_enabled_set():
    assert choose(C.ALL_REDUCE, 8, 4, {"ring"}) == "ring"
    with pytest.raises(ValueError, match="no algorithm enabled"):
        choose(C.ALL_REDUCE, 8, 4, set())


def test_stats_read_off_the_ring_schedule():
    # ring all-reduce: 2(n-1) sends of 1/n of the data, 2(n-1) dependent steps + 1
    for n in (2, 4, 8):
        st = schedule_stats(C.ALL_REDUCE, "ring", n, Options())
        assert st.messages == 2 * (n - 1)
        assert st.send == pytest.approx(2 * (n - 1) / n)
        assert st.reduce == pytest.approx((n - 1) / n)
        assert st.depth == 2 * (n - 1) + 1


def test_stats_of_recursive_doubling_are_logarithmic():
    for n in (2, 4, 8, 16):
        st = schedule_stats(C.ALL_REDUCE, "recursive_doubling", n, Options())
        assert st.messages == n.bit_length() - 1  # lg n exchanges of the whole buffer


def test_model_prefers_log_steps_small_and_bandwidth_optimal_large():
    small = {a: estimate(C.ALL_REDUCE, a, 8, 8, MODELS["tcp"]) for a in
             ("ring", "recursive_doubling")}
    large = {a: estimate(C.ALL_REDUCE, a, 64 << 20, 8, MODELS["tcp"]) for a in
             ("ring", "recursive_doubling")}
    assert small["recursive_doubling"] < small["ring"]
    assert large["ring"] < large["recursive_doubling"]


def test_a_token_bucket_overlaps_the_link_with_the_rest_of_the_path():
    from ringtree.tuning.tuner import overlap_burst

    # no bucket (a link that serialises at its rate): the additive alpha-beta cost
    assert overlap_burst(300e-6, 700e-6, 0.0) == pytest.approx(1000e-6)
    # the link's bytes fit the bucket: the larger of the two
    assert overlap_burst(300e-6, 700e-6, 1e-3) == pytest.approx(700e-6)
    assert overlap_burst(900e-6, 700e-6, 1e-3) == pytest.approx(900e-6)
    # more than the bucket holds: the link's time plus the idle time the bucket cannot
    # cover
    assert overlap_burst(1.5e-3, 10e-3, 1e-3) == pytest.approx(10.5e-3)
    assert overlap_burst(0.5e-3, 10e-3, 1e-3) == pytest.approx(10e-3)


@pytest.mark.parametrize("coll,wire", [(C.ALL_REDUCE, 2 * 3 / 4), (C.ALL_GATHER, 3 / 4),
                                       (C.REDUCE_SCATTER, 3 / 4), (C.ALL_TO_ALL, 3 / 4)])
def test_the_bandwidth_term_charges_the_bytes_a_rank_sends(coll, wire):
    """A call's size is the planner's (an all-gather's gathered output, a reduce-scatter's
    input) and the schedule counts volumes in blocks: the ring sends 2(n-1)/n of an
    all-reduce's S and (n-1)/n of the others' (Thakur, Rabenseifner & Gropp 2005), not n
    times that."""
    from ringtree.tuning.tuner import LinkModel

    algo = "ring" if coll is not C.ALL_TO_ALL else "pairwise"
    beta_only = LinkModel(alpha=0.0, overhead=0.0, beta=1e-9, gamma=0.0)
    s = 1 << 20
    assert estimate(coll, algo, s, 4, beta_only) == pytest.approx(1e-9 * wire * s)
