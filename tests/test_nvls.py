"""NVLink SHARP: the checker proves the NVLS schedules (the NVSwitch as a virtual rank),
and the simulator places them on the NVSwitch and prices them."""

from __future__ import annotations

import pytest

from ringtree.ir.check import CheckError, check_programs, with_virtual
from ringtree.schedules import Options, generate_all, needs_switch, record
from ringtree.sim import presets, programs_for, simulate
from ringtree.sim.machine.placement import place


def _proven(coll: str, algo: str, n: int, opts: Options, in_place: bool = False) -> list:
    progs = with_virtual(generate_all(coll, algo, n, opts))
    check_programs(progs, in_place=in_place)
    return progs


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter"])
def test_one_nvlink_domain_n2_to_72(coll):
    """Every collective NCCL runs on NVLS (``generate.py``), 2..72 GPUs on one NVSwitch
    (an NVL72 rack is one NVLink domain)."""
    for n in range(2, 73):
        progs = _proven(coll, "nvls", n, Options(channels=1 + (n % 7 == 0)),
                        in_place=n % 9 == 0)
        switches = progs[n:]
        assert switches and all(p.meta["domain"] == "nvlink" for p in switches)


@pytest.mark.parametrize("algo", ["nvls", "nvls_tree"])
@pytest.mark.parametrize("n,ppn,channels,fanin", [(4, 2, 1, 0), (16, 8, 1, 0), (24, 8, 2, 2),
                                                  (9, 3, 1, 2), (10, 2, 1, 0),
                                                  (7, 4, 1, 0), (72, 8, 1, 4)])
def test_across_nodes(algo, n, ppn, channels, fanin):
    """NVLS inside nodes of ``ppn`` GPUs (the last may be short, even a single GPU) with
    InfiniBand SHARP (``nvls``) or a double binary tree (``nvls_tree``) between them."""
    opts = Options(channels=channels, nodes=tuple(r // ppn for r in range(n)),
                   params=(("collnet_fanin", fanin),))
    progs = _proven("all_reduce", algo, n, opts)
    _proven("all_reduce", algo, n, opts, in_place=True)
    network = [p for p in progs[n:] if "domain" not in p.meta]
    assert bool(network) == (algo == "nvls")


def test_a_switch_that_forgets_a_gpu_is_caught():
    import dataclasses

    progs = with_virtual(generate_all("all_reduce", "nvls", 4, Options()))
    v = progs[4]
    step = v.channels[0][0]
    bad = dataclasses.replace(step, recv_from=step.recv_from[1:])
    progs[4] = dataclasses.replace(v, channels=((bad,),) + v.channels[1:])
    with pytest.raises(CheckError):
        check_programs(progs)


def test_records_say_only_the_simulator_runs_it():
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        rec = record(coll, "nvls")
        assert rec.switch == "nvlink" and not rec.tuned and needs_switch(coll, "nvls")
    with pytest.raises(ValueError, match="CollNet plugin"):
        generate_all("all_gather", "nvls", 4, Options(nodes=(0, 0, 1, 1)))


def test_placed_on_the_nvswitch_and_never_on_a_network_switch():
    topo = presets.get("dgx_h100_sharp", 2)
    progs = programs_for("all_reduce", "nvls", topo, channels=1)
    devices = place(progs, topo)
    for p, d in zip(progs[topo.nranks:], devices[topo.nranks:]):
        kind = topo.devices[d].kind
        assert kind == ("nvswitch" if p.meta.get("domain") == "nvlink" else "switch")
    with pytest.raises(ValueError, match="NVLink SHARP"):
        simulate("all_reduce", "nvls", presets.get("dgx_a100", 1), 1 << 20)
    with pytest.raises(ValueError, match="in-network reduction switch"):
        simulate("all_reduce", "nvls", presets.get("dgx_h100", 2), 1 << 20)


def test_nvls_beats_the_ring_at_large_sizes_on_one_h100_node():
    """NCCL's default single-node H100 all-reduce: ~480 GB/s busbw against the ring's
    ~360 (sjeaugey, NVIDIA/nccl-tests#212). The simulator prices NVLS at NCCL's Hopper
    nvlsEfficiency and the merged round trip (m/(m+1)), so the bound is exact."""
    topo = presets.get("dgx_h100", 1)
    nvls = simulate("all_reduce", "nvls", topo, 1 << 30)
    ring = simulate("all_reduce", "ring", topo, 1 << 30)
    assert nvls.busbw > ring.busbw
    bound = 360.0 * 0.85 * 8 / 9 * 2 * 7 / 8    # link · efficiency · m/(m+1) · busbw factor
    assert nvls.busbw < bound
    rs = simulate("reduce_scatter", "nvls", topo, 1 << 30)
    assert rs.busbw < 360.0 * 0.85
