"""NCCL's protocols in the simulator: each reduces to its closed form on two ranks and one
link, NCCL_PROTO's syntax, the caps of tuning.cc, and the fastest one per size."""

from __future__ import annotations

import pytest

from ringtree.sim import presets, simulate, simulate_sizes
from ringtree.sim.cli import main
from ringtree.sim.machine import cluster as T
from ringtree.sim.machine import protocols as P

BW, LAT, OVER = 50.0, 700.0, 1000.0        # GB/s = bytes/ns, ns per link, ns per transfer


def _closed_form(proto: str, nbytes: int) -> float:
    """Two ranks, one link each way: a ring all-reduce is two transfers of n/2 bytes
    (reduce-scatter, all-gather), each costing one step's latency and (n/2)/B, plus
    NCCL's base latency (``baseLatencies``). A step between hosts of one GPU costs
    tuning.cc's ``hwLat[NET][Tree]`` for LL and LL128 (NCCL's ppn = 1 rule) and the
    topology's own o + latency for Simple; LL and LL128 carry 8/16 and 120/128 of B."""
    i = P.PROTOCOLS.index(proto)
    step = OVER + LAT if proto == "simple" else P.HW_LAT["net"]["tree"][i] * 1e3
    eff = {"ll": 0.5, "ll128": 120 / 128, "simple": 1.0}[proto]
    return P.BASE_LAT["ring"][i] * 1e3 + 2 * step + nbytes / (BW * eff)


@pytest.mark.parametrize("proto", ["ll", "ll128", "simple"])
@pytest.mark.parametrize("model", ["unaware", "aware"])
def test_each_protocol_is_its_closed_form_on_two_ranks(proto, model):
    topo = T.fully_connected(2, BW, LAT, overhead_ns=OVER)
    for nbytes in (8, 4096, 1 << 20):       # one loop of the ring: two transfers
        run = simulate("all_reduce", "ring", topo, nbytes, model=model, proto=proto)
        assert run.time_ns == pytest.approx(_closed_form(proto, nbytes), rel=1e-12)
        assert run.proto == P.NAMES[proto]


def test_no_protocol_keeps_the_topology_s_own_costs():
    topo = T.fully_connected(2, BW, LAT, overhead_ns=OVER)
    run = simulate("all_reduce", "ring", topo, 1 << 20)
    assert run.proto == "" and run.time_ns == pytest.approx(2 * (OVER + LAT) + (1 << 20) / BW)


def test_nccl_proto_syntax():
    assert P.parse("LL,LL128", "all_reduce") == ("ll", "ll128")
    assert P.parse("^LL128", "all_gather") == ("ll", "simple")
    assert P.parse("simple;allreduce:^LL", "all_reduce") == ("ll128", "simple")
    assert P.parse("simple;allreduce:^LL", "broadcast") == ("simple",)
    assert P.parse("^LL128;allreduce:LL128", "all_reduce") == ("ll128",)
    with pytest.raises(ValueError, match="unrecognized element token 'll64'"):
        P.parse("LL64", "all_reduce")
    with pytest.raises(ValueError, match="must have a prefix"):
        P.parse("LL;Simple", "all_reduce")
    with pytest.raises(ValueError, match="unrecognized prefix token 'alltoall'"):
        P.parse("alltoall:LL", "all_reduce")
    with pytest.raises(ValueError, match="Simple only"):
        P.choices("LL", "all_reduce", "collnet_direct")
    assert P.choices("auto", "all_reduce", "nvls") == ("simple",)


def test_caps_follow_tuning_cc():
    """LL is capped at llMaxBws (Hopper one node: 141 GB/s), LL128 at channels ×
    perChMaxRingLL128Bws (36.7 GB/s a channel on Hopper), on a GPU's outgoing links."""
    h = presets.get("dgx_h100", 1)
    ll = P.priced(h, "all_reduce", "ring", "ll")
    ll128 = P.priced(h, "all_reduce", "ring", "ll128")
    gpu_out = [i for i, lk in enumerate(h.links) if h.devices[lk.src].kind == "gpu"]
    assert {ll.links[i].bandwidth for i in gpu_out} == {141.0}
    assert {ll128.links[i].bandwidth for i in gpu_out} == {
        min(360.0 * 120 / 128, h.channels * 36.7)}
    # across nodes LL's row is the host CPU's: DGX H100 (Intel) 2 nodes 39 GB/s
    two = P.priced(presets.get("dgx_h100", 2), "all_reduce", "ring", "ll")
    assert max(lk.bandwidth for lk in two.links if two.devices[lk.src].kind == "gpu") == 39.0
    assert P.priced(h, "all_reduce", "ring", "ll") is ll      # kept for a sweep


def test_auto_picks_the_fastest_per_size_like_nccl():
    """LL for tiny messages, Simple for large ones (NCCL's tuner does the same)."""
    topo = presets.get("dgx_h100", 1)
    sizes = [8, 1 << 12, 1 << 27]
    runs = simulate_sizes("all_reduce", "ring", topo, sizes, proto="auto")
    assert [r.proto for r in runs] == ["LL", "LL", "Simple"]
    for s, r in zip(sizes, runs):
        each = [simulate("all_reduce", "ring", topo, s, proto=p).time_ns for p in P.PROTOCOLS]
        assert r.time_ns == min(each)


def test_cli_proto(capsys):
    assert main(["all_reduce", "-t", "dgx_h100", "-N", "1", "--algo", "ring,collnet_direct",
                 "-b", "8", "-e", "8", "--proto", "LL", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "protocols LL" in out and "collnet_direct: skipped (no protocol" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("8 "))
    assert row.split()[-1] == "LL"
    assert main(["all_reduce", "-t", "dgx_h100", "-N", "1", "-a", "ring", "-b", "8",
                 "-e", "8", "--proto", "LL9", "-j", "1"]) == 0
    assert "unrecognized element token" in capsys.readouterr().out
    assert main(["all_reduce", "-t", "dgx_h100", "-N", "1", "-a", "ring", "-b", "8",
                 "-e", "8", "--proto", "none", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "protocols" not in out and "proto" not in out


def test_an_msccl_file_runs_on_the_protocol_it_was_written_for(tmp_path):
    """MSCCL's executors run a file on its ``proto``: ``auto`` prices that one only."""
    from ringtree.tools.algo import main as algo_main

    out = tmp_path / "ringll.xml"
    assert algo_main(["export", "ring", "all_reduce", "-n", "8", "--proto", "LL",
                      "-o", str(out)]) == 0
    topo = presets.get("dgx_h100", 1)
    run = simulate("all_reduce", f"msccl:{out}", topo, 1 << 27, proto="auto")
    assert run.proto == "LL"
    with pytest.raises(ValueError, match="runs with LL only"):
        simulate("all_reduce", f"msccl:{out}", topo, 8, proto="Simple")


def test_nccl_tuner_model_gives_tuning_cc_s_latencies():
    """NCCL's formulas at 0 bytes (Hopper, NVLink, Intel): the table NCCL's tuning model
    gives for 8 ranks on one node and 64 on eight (µs; LL, LL128, Simple)."""
    from ringtree.sim.machine.nccl_tuner import nccl_model_time

    want = {(1, "ring"): (15.0, 40.6, 56.0), (1, "tree"): (15.2, 31.5, 64.4),
            (8, "ring"): (156.4, 282.8, 585.2), (8, "tree"): (45.2, 82.5, 148.4)}
    for (nodes, algo), times in want.items():
        topo = presets.get("dgx_h100", nodes)
        got = tuple(round(nccl_model_time(topo, algo, p, 0), 1) for p in ("LL", "LL128",
                                                                         "Simple"))
        assert got == times, (nodes, algo)
