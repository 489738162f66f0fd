"""Named topologies: real systems from their public specifications, and textbook shapes.

Efficiency factors turn line rates into what NCCL's Simple protocol achieves, because a
simulator fed line rates predicts bandwidths nobody measures:

- NVLink: ~80 % of line rate (NCCL maintainers; NCCL caps A100 ring busbw at 235 GB/s in
  ``tuning.cc``, i.e. 78 % of NVLink3's 300 GB/s per direction; SimAI models DGX-H100
  NVLink as 360 GB/s = 80 % of NVLink4's 450 GB/s per direction).
- InfiniBand: NDR 400 Gb/s = 50 GB/s line → 48.5 GB/s (SimAI's ``-nic 48.5``, 97 %);
  HDR 200 Gb/s = 25 GB/s line → ~20 GB/s per NIC as quoted by NCCL maintainers (80 %).
- PCIe between the NVSwitch side and a NIC: Gen4 x16 32 GB/s, Gen5 x16 64 GB/s, at 80 %.

Latencies are per link; with the sender overhead they give per-step costs between NCCL's
LL128 and Simple ``hwLat`` (``tuning.cc``: NVLink 1.9–3.4 µs, network 4–14 µs per step):
an intra-node transfer costs 1.5 + 2·0.5 = 2.5 µs, an inter-node one about 6 µs.
Reductions run at 1/3 of HBM bandwidth (two reads, one write): A100 2.0 TB/s → 650 GB/s,
H100 3.35 TB/s → 1100 GB/s.

``*_sharp`` variants make every InfiniBand switch an in-network reduction switch
(Quantum HDR SHArPv2 / Quantum-2 NDR SHArPv3) for the CollNet schedules.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ringtree.sim.machine import cluster as T
from ringtree.sim.machine.cluster import Topology


def _dgx(nodes: int, sharp: bool, kw: dict[str, Any], name: str, **spec: Any) -> Topology:
    """A DGX SuperPOD: 8 GPUs on NVSwitch, 8 rail-optimized NICs, CPU-side overhead."""
    args: dict[str, Any] = dict(gpus_per_node=8, nics_per_node=8, nvlink_ns=500.0,
                                pcie_ns=300.0, nic_ns=1000.0, switch_ns=300.0,
                                rail_optimized=True, sharp=sharp, overhead_ns=1500.0,
                                name=f"{name}{'_sharp' if sharp else ''}x{nodes}")
    args.update(spec)
    args.update(kw)
    return T.fat_tree(nodes, **args)


def dgx_a100(nodes: int = 1, sharp: bool = False, **kw: Any) -> Topology:
    """DGX-A100: 8 A100 (NVLink3, 600 GB/s bidirectional per GPU) on NVSwitch, 8× HDR
    200 Gb/s NICs (PCIe Gen4), SuperPOD-style rail-optimized leaves of 20 nodes."""
    return _dgx(nodes, sharp, kw, "dgx_a100", nvlink_gbps=235.0, pcie_gbps=25.6,
                nic_gbps=20.0, leaf_ports=20, gpu_reduce_gbps=650.0, arch="ampere")


def dgx_h100(nodes: int = 1, sharp: bool = False, **kw: Any) -> Topology:
    """DGX-H100: 8 H100 (NVLink4, 900 GB/s bidirectional per GPU) on NVSwitch, 8× NDR
    400 Gb/s NICs (PCIe Gen5), SuperPOD-style rail-optimized leaves of 32 nodes. The
    third-generation NVSwitch reduces in the switch (NVLink SHARP, the ``nvls``
    schedules)."""
    return _dgx(nodes, sharp, kw, "dgx_h100", nvlink_gbps=360.0, pcie_gbps=51.2,
                nic_gbps=48.5, leaf_ports=32, gpu_reduce_gbps=1100.0, nvls=True,
                arch="hopper")


def nvswitch(nodes: int = 8, **kw) -> Topology:
    """One node of ``nodes`` GPUs on an NVSwitch (NVLink4 figures); ``nodes`` = GPUs."""
    return dgx_h100(1, gpus_per_node=nodes, name=f"nvswitch{nodes}", **kw)


def mi300x(nodes: int = 2, slow_nic: float = 1.0, **kw: Any) -> Topology:
    """AMD MI300X hosts: 8 GPUs, every pair joined by one Infinity Fabric link (64 GB/s
    per direction → 51.2 at 80 %), and every GPU with its own 400 Gb/s NIC (48.5 GB/s, as
    NDR above; the NIC and its PCIe Gen5 hop folded into one 1.3 µs link) on one network
    switch. Routes are shortest paths: GPUs of a host talk over their link, of two hosts
    through both NICs. ``slow_nic`` < 1 runs host 0's GPU 0 NIC at that fraction of its
    rate (a port that trained at 200 Gb/s: 0.5): an asymmetric fabric."""
    gpus = kw.pop("gpus_per_node", 8)
    devices = [T.Device(f"n{h}.gpu{g}", "gpu", h, 0, False, 1750.0)
               for h in range(nodes) for g in range(gpus)]
    devices.append(T.Device("switch", "switch", -1, 1))
    sw, links = len(devices) - 1, list[T.Link]()
    for h in range(nodes):
        for a in range(gpus):
            g = h * gpus + a
            links += [T.Link(g, h * gpus + b, 51.2, 500.0) for b in range(gpus) if b != a]
            rate = 48.5 * (slow_nic if h == 0 and a == 0 else 1.0)
            links += [T.Link(g, sw, rate, 1300.0), T.Link(sw, g, rate, 1300.0)]
    slow = "" if slow_nic == 1.0 else f"_slow{slow_nic:g}"
    return Topology(kw.pop("name", f"mi300x{slow}x{nodes}"), tuple(devices), tuple(links),
                    tuple(range(nodes * gpus)), "shortest", overhead_ns=1500.0, **kw)


def fat_tree2(nodes: int = 16, oversubscription: float = 1.0, **kw: Any) -> Topology:
    """Two-level fat-tree of single-GPU hosts with one 50 GB/s NIC each, 16-port leaves."""
    args: dict[str, Any] = dict(gpus_per_node=1, nics_per_node=1, nic_gbps=50.0,
                                nic_ns=500.0, switch_ns=500.0, pcie_gbps=64.0, pcie_ns=100.0,
                                leaf_ports=16, oversubscription=oversubscription,
                                rail_optimized=False, levels=2, name=f"fat_tree2x{nodes}")
    args.update(kw)
    return T.fat_tree(nodes, **args)


def fat_tree3(nodes: int = 64, oversubscription: float = 1.0, **kw) -> Topology:
    """Three-level fat-tree (pods of 4 leaves of 8 hosts) of single-GPU hosts."""
    return fat_tree2(nodes, oversubscription, levels=3, leaf_ports=8, pod_leaves=4,
                     name=f"fat_tree3x{nodes}", **kw)


def ring(nodes: int = 8, bandwidth: float = 50.0, latency: float = 500.0, **kw) -> Topology:
    """Bidirectional ring of ``nodes`` NPUs, 50 GB/s and 500 ns per link."""
    return T.ring(nodes, bandwidth, latency, **kw)


def torus(nodes: int = 64, bandwidth: float = 50.0, latency: float = 500.0, **kw) -> Topology:
    """2-D torus as square as ``nodes`` allows (e.g. 8×8), 50 GB/s and 500 ns per link."""
    a = int(nodes ** 0.5)
    while nodes % a:
        a -= 1
    return T.torus((nodes // a, a), bandwidth, latency, **kw)


def switch(nodes: int = 16, bandwidth: float = 50.0, latency: float = 500.0, **kw) -> Topology:
    """``nodes`` NPUs on one switch; ``sharp=True`` makes it a reduction switch."""
    return T.switch(nodes, bandwidth, latency, **kw)


# Measured on the development machine (2 cores) by benchmarks/sim_calibrate.py: ringtree's
# default transport between local processes (shared memory). α: per transfer inside a
# collective; launch: per API call; β: streaming bandwidth; γ: numpy float32 add.
# Rerun the script on another machine and pass its figures to local().
LOCAL_ALPHA_NS = 39_800.0
LOCAL_LAUNCH_NS = 19_500.0
LOCAL_GBPS = 6.23
LOCAL_REDUCE_GBPS = 21.1


def local(nodes: int = 2, alpha_ns: float = LOCAL_ALPHA_NS, gbps: float = LOCAL_GBPS,
          reduce_gbps: float = LOCAL_REDUCE_GBPS, launch_ns: float = LOCAL_LAUNCH_NS,
          cores: int | None = None) -> Topology:
    """This machine: ``nodes`` ranks as processes exchanging through shared memory, a
    direct pipe between every pair (α = per-transfer overhead, β = pipe bandwidth).

    Shared-memory transfers and reductions are CPU work: with more ranks than ``cores``
    (default: this machine's) each rank runs ``cores/nodes`` of the time, so every cost
    is stretched by ``nodes/cores`` (processor sharing).
    """
    share = max(1.0, nodes / (cores or os.cpu_count() or 1))
    t = T.fully_connected(nodes, gbps / share, 0.0, overhead_ns=alpha_ns * share,
                          reduce_gbps=reduce_gbps / share, name=f"local{nodes}")
    return replace(t, launch_ns=launch_ns * share)


def testbed(nodes: int = 2, ppn: int = 4, gbit: float = 1.0, slow: float = 1.0) -> Topology:
    """The namespace testbed (:mod:`ringtree.testbed`): ``nodes`` hosts of ``ppn`` ranks,
    each host's ``eth0`` shaped to ``gbit`` Gbit/s each way (``tc tbf``) on one bridge;
    the ranks of a host talk over shared memory (this machine's pipes, as :func:`local`)
    and share its link. ``slow`` < 1 shapes the last host's link to that fraction."""
    devices = [T.Device("bridge", "switch", -1, 2)]
    links: list[T.Link] = []
    ranks: list[int] = []
    for h in range(nodes):
        first = len(devices)
        devices += [T.Device(f"h{h}.rank{p}", "gpu", h, 0, False, LOCAL_REDUCE_GBPS)
                    for p in range(ppn)]
        ranks += range(first, first + ppn)
        devices.append(T.Device(f"h{h}.eth0", "nic", h, 1))
        nic = len(devices) - 1
        rate = gbit / 8 * (slow if h == nodes - 1 else 1.0)
        links += [T.Link(a, b, rate, 50_000.0) for a, b in ((nic, 0), (0, nic))]
        for a in range(first, first + ppn):
            links += [T.Link(a, nic, LOCAL_GBPS, 0.0), T.Link(nic, a, LOCAL_GBPS, 0.0)]
            links += [T.Link(a, b, LOCAL_GBPS, 0.0) for b in range(first, first + ppn)
                      if a != b]
    name = f"testbed{nodes}x{ppn}" + ("" if slow == 1.0 else f"_slow{slow:g}")
    return Topology(name, tuple(devices), tuple(links), tuple(ranks), "shortest",
                    overhead_ns=LOCAL_ALPHA_NS, launch_ns=LOCAL_LAUNCH_NS)


PRESETS: dict[str, Callable[..., Topology]] = {
    "dgx_a100": dgx_a100,
    "dgx_a100_sharp": lambda nodes=1, **kw: dgx_a100(nodes, sharp=True, **kw),
    "dgx_h100": dgx_h100,
    "dgx_h100_sharp": lambda nodes=1, **kw: dgx_h100(nodes, sharp=True, **kw),
    "nvswitch": nvswitch,
    "mi300x": mi300x,
    "mi300x_slow_nic": lambda nodes=2, **kw: mi300x(nodes, slow_nic=0.5, **kw),
    "fat_tree2": fat_tree2,
    "fat_tree3": fat_tree3,
    "ring": ring,
    "torus": torus,
    "switch": switch,
    "switch_sharp": lambda nodes=16, **kw: switch(nodes, sharp=True, **kw),
    "local": local,
    "testbed": testbed,
    "testbed_slow": lambda nodes=2, **kw: testbed(nodes, slow=0.5, **kw),
}
T.GENERATORS.update(PRESETS)


def get(spec: str, nodes: int | None = None, **kw) -> Topology:
    """A preset by name (``nodes`` = hosts, or NPUs for flat shapes) or a topology file."""
    if spec in PRESETS:
        return PRESETS[spec](nodes, **kw) if nodes is not None else PRESETS[spec](**kw)
    if Path(spec).exists():
        return T.load(spec)
    raise ValueError(f"unknown topology {spec!r}: not a preset ({', '.join(PRESETS)}) "
                     f"nor a file")
