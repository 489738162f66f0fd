"""Topology-aware tuning: per-link-class schedule costs, the host model, the topology a
communicator learns (measured or from RINGTREE_TOPO_FILE) and what RINGTREE_DEBUG=INFO
says about it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ringtree.ir.program import Collective
from ringtree.schedules import Options, algorithms
from ringtree.schedules.stats import host_stats
from ringtree.sim.machine import cluster as simtopo
from ringtree.testbed import available
from ringtree.tuning.links import Topology, from_file, rate_and_burst
from ringtree.tuning.tuner import INCAST, MODELS, HostModel, LinkModel, choose, estimate, host_model

TWO_BY_TWO = Options(nodes=(0, 0, 1, 1))


def test_host_stats_charge_the_shared_host_link():
    ring = host_stats(Collective.ALL_REDUCE, "ring", 4, TWO_BY_TWO)
    hier = host_stats(Collective.ALL_REDUCE, "hierarchical", 4, TWO_BY_TWO)
    halving = host_stats(Collective.ALL_REDUCE, "rabenseifner", 4, TWO_BY_TWO)
    # per host, in units of the buffer: ring crosses once per host with 2(p-1)/p, the
    # leaders' ring 2(L-1)/L, halving-doubling twice (both ranks of a host cross)
    assert (ring.host_out, hier.host_out, halving.host_out) == (1.5, 1.0, 2.0)
    one_per_host = host_stats(Collective.ALL_REDUCE, "ring", 4, Options(nodes=(0, 1, 2, 3)))
    assert one_per_host.msgs_intra == 0 and one_per_host.send_intra == 0
    gather = host_stats(Collective.ALL_GATHER, "hierarchical", 4, TWO_BY_TWO)
    assert gather.host_out == 2.0  # a host's two blocks leave it once


def _slow_link(rate_bps: float) -> Topology:
    return Topology((0, 0, 1, 1), alpha=100e-6, bandwidth=rate_bps / 8, source="test",
                    cpus=4)


@pytest.mark.parametrize("coll", [Collective.ALL_REDUCE, Collective.ALL_GATHER,
                                  Collective.REDUCE_SCATTER])
def test_large_messages_on_slow_links_minimise_host_traffic(coll):
    hm = host_model(_slow_link(1e9), MODELS["shm"])
    algo = choose(coll, 16 << 20, 4, None, hm, TWO_BY_TWO)
    least = min(host_stats(coll, a, 4, TWO_BY_TWO).host_out
                for a in ("ring", "hierarchical", "direct"))
    assert host_stats(coll, algo, 4, TWO_BY_TWO).host_out == least, algo


def test_one_host_keeps_the_flat_model():
    hm = host_model(_slow_link(1e9), MODELS["shm"])
    one = Options(nodes=(0, 0, 0, 0))
    for size in (8, 1 << 20):
        assert estimate(Collective.ALL_REDUCE, "ring", size, 4, hm, one) == \
            estimate(Collective.ALL_REDUCE, "ring", size, 4, MODELS["shm"], one)


def _testbed(hosts: int, ppn: int, rate_bps: float, cpus: int = 2, alpha: float = 90e-6,
             burst: float = 0.0) -> tuple:
    """A topology like the namespace testbed's: every host on one machine of ``cpus``
    cores, α as rank 0 measures it there."""
    nodes = tuple(h for h in range(hosts) for _ in range(ppn))
    topo = Topology(nodes, alpha=alpha, bandwidth=rate_bps / 8, source="test", cpus=cpus,
                    machines=(0,) * len(nodes), burst=burst)
    intra = MODELS["shm_crowded"] if topo.crowded else MODELS["shm"]
    return host_model(topo, intra), Options(nodes=nodes), len(nodes)


ALL_REDUCE_FLAT = {a for a in algorithms(Collective.ALL_REDUCE)
                   if not a.startswith(("collnet", "nvls"))}


@pytest.mark.parametrize("layout,want", [
    # measured on the testbed (benchmarks/multihost.py, 1 Gbit/s): 4x1 recursive doubling
    # 0.22 ms against direct's 0.31; 2x4 hierarchical 0.67 ms against recursive
    # doubling's 0.74 and direct's 1.2
    ((4, 1), "recursive_doubling"), ((2, 4), "hierarchical")])
def test_crowded_small_all_reduce_takes_fewest_messages_in_all(layout, want):
    hm, opts, n = _testbed(*layout, 1e9)
    assert hm.cpu > 0 and hm.inter.overhead > MODELS["tcp"].overhead
    assert choose(Collective.ALL_REDUCE, 8, n, ALL_REDUCE_FLAT, hm, opts) == want
    # one message less per rank is not enough: the machine's cores pay for every rank's
    total = {a: host_stats(Collective.ALL_REDUCE, a, n, opts).msgs_total
             for a in ("direct", "recursive_doubling", "hierarchical")}
    assert total[want] == min(total.values()), total


@pytest.mark.parametrize("alpha", [60e-6, 110e-6, 170e-6])
def test_crowded_small_all_reduce_on_two_hosts_of_four_is_hierarchical(alpha):
    """2x4 at 200 Mbit/s (benchmarks/multihost.py): hierarchical 0.67-0.85 ms at 8 and
    256 B, recursive doubling 0.90-1.2 ms; rank 0's α ranged over 60-170 µs between
    probes of one job, and the choice must not hang on it."""
    hm, opts, n = _testbed(2, 4, 200e6, alpha=alpha)
    for nbytes in (8, 256):
        assert choose(Collective.ALL_REDUCE, nbytes, n, ALL_REDUCE_FLAT, hm, opts) \
            == "hierarchical", (alpha, nbytes)


def test_a_burst_the_link_passes_at_once_hides_the_steps_latency():
    """4x1 at 200 Mbit/s, 8 KiB all-reduce: recursive doubling puts 16 KiB through each
    host's link in two steps, and with a bucket its steps' latency hides under the link
    time (it took 0.69-0.72 ms in eight runs, about 16 KiB at the link's rate). Halving-
    doubling (12 KiB, twice the steps and messages) took 0.61-0.62 ms in two runs and
    0.82-0.92 in six, so recursive doubling stays the choice with or without a bucket."""
    bucket, opts, n = _testbed(4, 1, 200e6, burst=32 << 10)
    flat, _, _ = _testbed(4, 1, 200e6)
    assert bucket.burst == pytest.approx((32 << 10) / 25e6)
    rd = [estimate(Collective.ALL_REDUCE, "recursive_doubling", 8 << 10, n, m, opts)
          for m in (bucket, flat)]
    assert rd[0] == pytest.approx(2 * (8 << 10) / 25e6) and rd[1] > rd[0] * 1.2
    for m in (bucket, flat):
        assert choose(Collective.ALL_REDUCE, 8 << 10, n, ALL_REDUCE_FLAT, m, opts) \
            == "recursive_doubling"
    # a call far larger than the bucket costs about the same either way
    big = [estimate(Collective.ALL_REDUCE, "ring", 64 << 20, n, m, opts)
           for m in (bucket, flat)]
    assert big[0] < big[1] < big[0] * 1.001


def test_rate_and_burst_of_a_token_bucket_from_back_to_back_transfers():
    rho, sigma, rtt, size = 25e6, 32 << 10, 200e-6, 1 << 20
    full = rtt + (size - sigma) / rho
    empty = rtt + size / rho
    got_rho, got_sigma = rate_and_burst(size, rtt, [full, empty + 1e-3, empty, empty])
    assert got_rho == pytest.approx(rho) and got_sigma == pytest.approx(sigma)
    # a link without a bucket (or a first transfer slowed by a busy CPU): no burst
    assert rate_and_burst(size, rtt, [empty + 2e-3, empty, empty])[1] == 0.0
    with pytest.raises(ValueError, match="at least 2 transfers"):
        rate_and_burst(size, rtt, [full])


def test_burst_of_single_messages_after_idle_spells():
    """σ = 32 KiB at 25 MB/s: messages up to σ pass at once, larger ones wait (m − σ)/ρ,
    paced ones longer still; the largest lower bound is σ, and a slow CPU only lowers it."""
    from ringtree.tuning.links import BURST_SIZES, burst_of

    rho, sigma, rtt = 25e6, 32 << 10, 200e-6
    times = [rtt + 20e-6 + max(0, m - sigma) / rho * (1 if m < 4 * sigma else 1.5)
             for m in BURST_SIZES]
    assert burst_of(BURST_SIZES, times, rtt, rho) == pytest.approx(sigma, rel=0.02)
    slow = [t + 1e-3 for t in times]
    assert 0 <= burst_of(BURST_SIZES, slow, rtt, rho) < sigma
    flat = [rtt + m / rho for m in BURST_SIZES]  # a link that serialises at its rate
    assert burst_of(BURST_SIZES, flat, rtt, rho) == 0.0
    with pytest.raises(ValueError, match="7 sizes but 1 times"):
        burst_of(BURST_SIZES, [rtt], rtt, rho)


def test_incast_charges_only_what_the_bucket_does_not_pass_at_once():
    """2x2 at 200 Mbit/s, 8 KiB reduce-scatter: halving-doubling's two 4 KiB flows into
    each host fit the testbed's 32 KiB bucket and took 0.353 ms (their 8 KiB at the
    link's rate: 0.33 ms), hierarchical's one flow 0.423 ms; with no bucket the second
    flow costs INCAST more (and hierarchical still wins: see the next test)."""
    from ringtree.tuning.tuner import incast

    assert incast(1e-3, 1, 0.0) == 1e-3
    assert incast(1e-3, 3, 0.0) == pytest.approx(1e-3 * (1 + 2 * INCAST))
    assert incast(1e-3, 2, 2e-3) == 1e-3
    assert incast(1e-3, 2, 0.4e-3) == pytest.approx(1e-3 + INCAST * 0.6e-3)
    free = LinkModel(alpha=0.0, overhead=0.0, beta=0.0, gamma=0.0)
    link = LinkModel(alpha=0.0, overhead=0.0, beta=1 / 25e6, gamma=0.0)
    for burst, factor in ((0.0, 1 + INCAST), ((32 << 10) / 25e6, 1.0)):
        hm = HostModel(free, link, burst=burst)
        assert estimate(Collective.REDUCE_SCATTER, "halving", 8 << 10, 4, hm, TWO_BY_TWO) \
            == pytest.approx((8 << 10) / 25e6 * factor)


def test_uncrowded_hosts_keep_the_per_rank_model():
    hm, opts, n = _testbed(2, 4, 1e9, cpus=64)
    assert hm.cpu == 0 and hm.inter.overhead == MODELS["tcp"].overhead
    assert hm.call == hm.wake == hm.cpu_remote == 0
    assert hm.inter.alpha == 90e-6


@pytest.mark.parametrize("layout", [(2, 2), (4, 1), (2, 4)])
@pytest.mark.parametrize("rate", [1e9, 200e6])
@pytest.mark.parametrize("coll", [Collective.ALL_REDUCE, Collective.ALL_GATHER,
                                  Collective.REDUCE_SCATTER])
def test_large_calls_move_the_fewest_bytes_over_host_links(layout, rate, coll):
    """At 16 MiB the choice moves no more over a host's link than any other algorithm
    and has no incast (the testbed's bound is the bytes a host's link carries)."""
    hm, opts, n = _testbed(*layout, rate)
    cands = {a for a in algorithms(coll) if not a.startswith(("collnet", "nvls"))}
    algo = choose(coll, 16 << 20, n, cands, hm, opts)
    st = host_stats(coll, algo, n, opts)
    least = min(max(host_stats(coll, a, n, opts).host_out,
                    host_stats(coll, a, n, opts).host_in) for a in cands)
    assert max(st.host_out, st.host_in) == least and st.fan_in == 1, (algo, st)


def test_topology_file_gives_the_inter_host_path(tmp_path):
    t = simtopo.fat_tree(2, gpus_per_node=2, nics_per_node=1, nic_gbps=0.125, nic_ns=20_000,
                         switch_ns=5_000, name="two_hosts_1gbit")
    path = tmp_path / "topo.json"
    simtopo.save(t, path)
    alpha, bw = from_file(str(path))
    assert bw == pytest.approx(0.125e9)
    assert alpha > 40e-6  # two NIC hops and a switch at least
    one = tmp_path / "one.json"
    simtopo.save(simtopo.fat_tree(1, gpus_per_node=4, nics_per_node=1), one)
    with pytest.raises(ValueError, match="no two nodes"):
        from_file(str(one))


@pytest.mark.skipif(not available()[0], reason=available()[1] or "no testbed")
def test_debug_info_prints_the_learned_topology_and_choices(tmp_path):
    t = simtopo.fat_tree(2, gpus_per_node=2, nics_per_node=1, nic_gbps=0.025, name="tb")
    path = tmp_path / "topo.json"
    simtopo.save(t, path)
    script = ("import numpy as np, ringtree\n"
              "c = ringtree.init()\n"
              "c.all_reduce(np.ones(1 << 20, np.float32))\n"
              "c.close()\n")
    cmd = [sys.executable, "-m", "ringtree.cli", "testbed", "--hosts", "2", "--rate",
           "200mbit", "--", "sh", "-c",
           f"RINGTREE_DEBUG=INFO RINGTREE_TOPO_FILE={path} {sys.executable} -m ringtree.cli "
           "run -n 2 --nnodes 2 --node-rank $RINGTREE_TESTBED_HOST "
           f"--master $RINGTREE_TESTBED_MASTER:29500 {sys.executable} -c '{script}'"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = cp.stdout
    assert "topology: 2 hosts (host 0: ranks 0-1; host 1: ranks 2-3)" in out, out
    assert "200 Mbit/s" in out and "RINGTREE_TOPO_FILE" in out, out
    assert "all_reduce 4194304 B: chose" in out and "predicted us" in out, out


@pytest.mark.skipif(not available()[0], reason=available()[1] or "no testbed")
def test_perf_across_hosts_reports_the_fraction_of_the_link_bound(tmp_path):
    """``ringtree perf`` on two testbed hosts: after the rows, the link and per size the
    link bound with the fraction of it each half reached, in the JSON too."""
    import json
    import re

    t = simtopo.fat_tree(2, gpus_per_node=1, nics_per_node=1, nic_gbps=0.025, name="tb")
    path, out = tmp_path / "topo.json", tmp_path / "perf.json"
    simtopo.save(t, path)
    cmd = [sys.executable, "-m", "ringtree.cli", "testbed", "--hosts", "2", "--rate",
           "200mbit", "--", "sh", "-c",
           f"RINGTREE_TOPO_FILE={path} {sys.executable} -m ringtree.cli run -n 1 --nnodes 2 "
           "--node-rank $RINGTREE_TESTBED_HOST --master $RINGTREE_TESTBED_MASTER:29500 "
           f"{sys.executable} -m ringtree.cli perf all_reduce -b 256K -e 1M -f 4 -n 3 -w 1 "
           f"-c 1 -J {out}"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    text = re.sub(r"^\[rt-h\d\] ", "", cp.stdout, flags=re.M)  # the testbed's prefix
    assert re.search(r"# Link bound +: 2 hosts \(1, 1 ranks\), inter-host link 200 Mbit/s "
                     r"each way \(RINGTREE_TOPO_FILE=", text), text
    rows = {int(m[1]): (float(m[2]), float(m[3]), float(m[4])) for m in re.finditer(
        r"^# +(\d+) +-1 +([\d.]+) +([\d.]+)% +([\d.]+)%$", text, re.M)}
    assert sorted(rows) == [256 << 10, 1 << 20], text
    for size, (bound_us, out_of_place, in_place) in rows.items():
        # two hosts: each must send half of its vector and receive the other half twice
        assert bound_us == pytest.approx(size / 25e6 * 1e6, abs=0.1)
        # a shaped link cannot beat its own bound by more than the token bucket's burst
        assert 0 < out_of_place <= 105 and 0 < in_place <= 105, text
    doc = json.loads(out.read_text())
    for row in doc["results"]:
        shown = rows[int(row["size"])]
        assert row["out_of_place"]["of_link_bound"] * 100 == pytest.approx(shown[1], abs=0.06)
        assert row["in_place"]["of_link_bound"] * 100 == pytest.approx(shown[2], abs=0.06)


@pytest.mark.parametrize("layout", [(2, 2), (2, 4)])
@pytest.mark.parametrize("rate", [1e9, 200e6])
def test_large_all_reduce_across_shared_hosts_takes_the_pieced_hierarchical(layout, rate):
    """From 4 MiB on 2x2 and 2x4 the planner's options pipeline the hierarchical
    all-reduce, the tuner counts its phases as overlapping, and it wins (measured on the
    testbed at 1 Gbit/s, 16 MiB: 156 ms pieced, 177 ms in one piece, 160 ms tree)."""
    from ringtree.schedules.hierarchical import pieces_for

    hm, opts, n = _testbed(*layout, rate)
    for nbytes in (4 << 20, 16 << 20, 64 << 20):
        pieced = Options(nodes=opts.nodes, params=pieces_for(nbytes, opts.nodes))
        assert pieced.params, nbytes
        assert choose(Collective.ALL_REDUCE, nbytes, n, ALL_REDUCE_FLAT, hm, pieced) \
            == "hierarchical", nbytes
        assert estimate(Collective.ALL_REDUCE, "hierarchical", nbytes, n, hm, pieced) \
            < estimate(Collective.ALL_REDUCE, "hierarchical", nbytes, n, hm, opts)


def test_one_rank_per_host_slices_a_millisecond_of_the_link():
    """Every step of a 4x1 job crosses the network and forwards whole slices: at 1 Gbit/s
    128 KiB slices (about 1 ms of the link), never below 64 KiB nor above the
    RINGTREE_BUFFSIZE slice; jobs with ranks sharing a host keep that slice."""
    from ringtree.runtime.planner import Planner

    def slices(nodes, bandwidth):
        p = Planner(0, len(nodes), nodes, nchannels=1, slice_bytes=1 << 20, algo_enabled={},
                    link="tcp")
        p.topology = Topology(nodes, alpha=90e-6, bandwidth=bandwidth, source="test")
        return p._slices()

    assert slices((0, 1, 2, 3), 1e9 / 8 * 0.97) == 128 << 10
    assert slices((0, 1, 2, 3), 200e6 / 8) == 64 << 10
    assert slices((0, 1, 2, 3), 100e9 / 8) == 1 << 20
    assert slices((0, 0, 1, 1), 1e9 / 8) == 1 << 20


@pytest.mark.parametrize("layout", [(2, 2), (2, 4)])
def test_an_all_reduce_goes_in_pieces_from_a_smaller_size_than_the_others(layout):
    """The planner pipelines a hierarchical all-reduce from 256 KiB per piece and host
    (2×4 at 1 Gbit/s: 1 and 2 MiB in pieces beat the double binary tree, which in one
    piece they did not), all-gather and reduce-scatter from 1 MiB; with those pieces the
    tuner takes the hierarchical all-reduce at 1 and 2 MiB."""
    from ringtree.runtime.planner import Planner

    hosts, ppn = layout
    hm, opts, n = _testbed(hosts, ppn, 1e9)
    p = Planner(0, n, opts.nodes, nchannels=1, slice_bytes=1 << 20, algo_enabled={},
                link="tcp")
    assert p._options(Collective.ALL_REDUCE, 1 << 20).params == (("pieces", 2),)
    assert p._options(Collective.ALL_REDUCE, (1 << 20) - 1).params == ()
    assert p._options(Collective.ALL_GATHER, 1 << 20).params == ()
    assert p._options(Collective.REDUCE_SCATTER, 4 << 20).params == (("pieces", 2),)
    for nbytes in (1 << 20, 2 << 20):
        pieced = p._options(Collective.ALL_REDUCE, nbytes)
        assert choose(Collective.ALL_REDUCE, nbytes, n, ALL_REDUCE_FLAT, hm, pieced) \
            == "hierarchical", nbytes


def test_a_host_link_is_charged_the_bytes_it_carries():
    """2x2 reduce-scatter of 8 KiB (2 KiB blocks): halving-doubling's first step sends
    half of each rank's input across, 8 KiB per host link, hierarchical's leaders 4 KiB.
    The tuner had charged the schedule's blocks at the call's size, 4x the bytes."""
    free = LinkModel(alpha=0.0, overhead=0.0, beta=0.0, gamma=0.0)
    hm = HostModel(free, LinkModel(alpha=0.0, overhead=0.0, beta=8e-9, gamma=0.0))
    rs = Collective.REDUCE_SCATTER
    for algo, host_bytes in (("halving", 8 << 10), ("hierarchical", 4 << 10)):
        st = host_stats(rs, algo, 4, TWO_BY_TWO)
        incast = 1 + INCAST * (st.fan_in - 1)
        assert estimate(rs, algo, 8 << 10, 4, hm, TWO_BY_TWO) == \
            pytest.approx(8e-9 * host_bytes * incast), algo


@pytest.mark.parametrize("rate", [1e9, 200e6])
@pytest.mark.parametrize("alpha", [55e-6, 90e-6, 125e-6])
def test_small_calls_on_two_hosts_of_two_take_the_flat_exchange(rate, alpha):
    """2x2, 8 B to 8 KiB: recursive doubling (halving for reduce-scatter) and hierarchical
    send the same 8 messages. Hierarchical has only its 2 leaders on the network, so the
    machine's cores spend less on it (benchmarks/multihost_cpu.py --loop on CUBIC sockets:
    0.63-0.81 ms of the ranks' CPU per 256 B all-reduce against 0.76-0.93), but its path is
    longer: three hops in a row (into the leader, across, out of it) against two, the last
    into a rank that slept through the crossing. With ringtree's sockets on CUBIC the flat
    exchange run forced was within 10% of the best at 41 of 51 of these points over five
    runs, hierarchical at 20 (docs/multihost.md; all_gather swaps with the machine's
    state). The flat exchange is CPU-bound, hierarchical path-bound; rank 0 measured α of
    53-123 µs on the testbed."""
    from ringtree.tuning.tuner import CROWDED_CALL, CROWDED_WAKE

    hm, opts, n = _testbed(2, 2, rate, alpha=alpha)
    # at 200 Mbit/s an 8 KiB call's bytes take longer than its path: what the link's
    # token bucket passes at once decides (the probe read 0-15 KiB of the testbed's 32)
    bucket, _, _ = _testbed(2, 2, rate, alpha=alpha, burst=16 << 10)
    assert (hm.call, hm.wake) == (CROWDED_CALL, CROWDED_WAKE)
    for coll, flat in ((Collective.ALL_REDUCE, "recursive_doubling"),
                       (Collective.ALL_GATHER, "recursive_doubling"),
                       (Collective.REDUCE_SCATTER, "halving")):
        a, b = (host_stats(coll, x, n, opts) for x in (flat, "hierarchical"))
        assert a.msgs_total == b.msgs_total == 8 and (a.remote_ranks, b.remote_ranks) == (4, 2)
        assert (a.wakes, b.wakes) == (0, 1), coll
        floor = {x: hm.cpu * st.msgs_total + hm.cpu_remote * st.remote_ranks
                 for x, st in ((flat, a), ("hierarchical", b))}
        assert floor["hierarchical"] < floor[flat]  # fewer ranks on the network
        cands = {x for x in algorithms(coll) if not x.startswith(("collnet", "nvls"))}
        for nbytes in (8, 256):
            assert choose(coll, nbytes, n, cands, hm, opts) == flat, (coll, nbytes)
            # the flat exchange at (or within 10% of) its CPU floor, hierarchical well above
            assert estimate(coll, flat, nbytes, n, hm, opts) < 1.1 * floor[flat]
            assert estimate(coll, "hierarchical", nbytes, n, hm, opts) \
                > 1.2 * floor["hierarchical"]
        if rate >= 1e9:
            assert choose(coll, 8 << 10, n, cands, hm, opts) == flat, coll
        elif coll is not Collective.ALL_REDUCE:
            # recursive doubling's all-reduce puts 16 KiB through each link, a near tie
            # (0.690 ms measured, hierarchical 0.603); the others 8 KiB (0.374 / 0.455 ms
            # against 0.520 / 0.571)
            assert choose(coll, 8 << 10, n, cands, bucket, opts) == flat, coll


@pytest.mark.parametrize("layout,coll,algo,wakes", [
    ((2, 2), Collective.ALL_REDUCE, "hierarchical", 1),
    ((2, 2), Collective.ALL_GATHER, "hierarchical", 1),
    ((2, 2), Collective.REDUCE_SCATTER, "hierarchical", 1),
    # the flat exchanges meet their partner on every hop: recursive doubling crosses
    # hosts last, halving crosses first and then exchanges with a rank that crossed too
    ((2, 2), Collective.ALL_REDUCE, "recursive_doubling", 0),
    ((2, 2), Collective.REDUCE_SCATTER, "halving", 0),
    ((2, 4), Collective.ALL_REDUCE, "recursive_doubling", 0),
    # no shared memory at all
    ((4, 1), Collective.ALL_REDUCE, "hierarchical", 0),
    ((4, 1), Collective.ALL_REDUCE, "rabenseifner", 0)])
def test_a_hop_into_a_rank_that_slept_through_a_crossing_is_a_wake_up(layout, coll, algo,
                                                                      wakes):
    """HostStats.wakes: the shared-memory hops on a dependency path whose receiver waited
    through a host crossing it took no part in. benchmarks/multihost_hops.py timed such a
    hop (a leader's 8 B to its host's other rank after the leaders' TCP round trip) at
    154-196 µs against 107-159 µs after the leaders spun as long instead."""
    opts = Options(nodes=tuple(h for h in range(layout[0]) for _ in range(layout[1])))
    assert host_stats(coll, algo, len(opts.nodes), opts).wakes == wakes


def test_the_wake_up_and_the_call_are_on_the_path():
    """With every other coefficient 0, a crowded host model's estimate is the call's own
    software plus a wake-up per hop that needs one."""
    free = LinkModel(alpha=0.0, overhead=0.0, beta=0.0, gamma=0.0)
    hm = HostModel(free, free, call=140e-6, wake=50e-6)
    ar = Collective.ALL_REDUCE
    assert estimate(ar, "hierarchical", 8, 4, hm, TWO_BY_TWO) == pytest.approx(190e-6)
    assert estimate(ar, "recursive_doubling", 8, 4, hm, TWO_BY_TWO) == pytest.approx(140e-6)


def test_a_pieced_reduce_scatter_counts_its_chain_as_overlapping_the_link():
    """2x4 at 1 Gbit/s: in P pieces per block the link waits for 1/(L·M·P) of the chain
    reduce, so the estimate drops below that of one piece (measured on the testbed,
    16 MiB: 76–78 ms in 4 pieces per block, 82–88 ms a block at a time); more pieces
    then cost more messages than they overlap. On 4 hosts of one rank, or on uneven
    nodes, nothing overlaps."""
    from ringtree.schedules import record

    hm, opts, n = _testbed(2, 4, 1e9)
    fill = record(Collective.REDUCE_SCATTER, "hierarchical").overlap
    est = [estimate(Collective.REDUCE_SCATTER, "hierarchical", 16 << 20, n, hm,
                    Options(nodes=opts.nodes, params=(("pieces", p),))) for p in (1, 2, 4)]
    assert est[0] > max(est[1:]) and est[2] < 0.9 * est[0]
    four = Options(nodes=opts.nodes, params=(("pieces", 4),))
    assert fill(n, four) == 1 / (2 * 4 * 4)
    assert fill(4, Options(nodes=(0, 1, 2, 3), params=(("pieces", 4),))) == 1.0
    assert fill(5, Options(nodes=(0, 0, 0, 1, 1), params=(("pieces", 4),))) == 1.0
