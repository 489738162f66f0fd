"""NCCL's own tuning model for all-reduce, Ring and Tree, evaluated on a modeled cluster:
the formulas of ``src/graph/tuning.cc`` (2.30.7) that NCCL's tuner minimises to pick an
algorithm and a protocol (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``).

It is a reference to compare the simulator with (the protocol crossovers of
``docs/sim-validation.md``), not a part of it. NCCL's inputs that come from its topology
search are taken from the cluster: ``nChannels·bwIntra`` is a GPU's NVLink rate (what
Simple's ring reaches), ``nChannels·bwInter`` a node's NIC rate, ``nChannels`` the
topology's channels.
"""

from __future__ import annotations

import math

from ringtree.sim.machine.cluster import Topology
from ringtree.sim.machine.protocols import (
    AMD_HOSTS,
    ARCHS,
    BASE_LAT,
    HW_LAT,
    LL_MAX_BW,
    PROTOCOLS,
    RING_LL128_BW,
    TREE_LL128_BW,
)

# perChMaxTreeBws [compcap][1, 2, 4+ nodes] and treeCorrectionFactor[proto][log2(size/64)]
TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
              .9, .9, .9, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7,
               .7, .8, .9, .9, .9),
}


def _bus_bw(topo: Topology, nodes: int) -> float:
    """``nChannels · bw``: a GPU's NVLink rate on one or two nodes (``bwIntra``), else the
    lesser of it and its node's NIC rate (``bwInter``)."""
    gpu = min(lk.bandwidth for lk in topo.links if topo.devices[lk.src].kind == "gpu")
    if nodes <= 2:
        return gpu
    nic = sum(lk.bandwidth for lk in topo.links
              if topo.devices[lk.src].kind == "nic" and topo.devices[lk.src].node == 0
              and topo.devices[lk.dst].kind == "switch")
    return min(gpu, nic) if nic else gpu


def _bandwidth(topo: Topology, algo: str, proto: str, nodes: int) -> float:
    """``bandwidths[AllReduce][algo][proto]`` (GB/s of algorithm bandwidth)."""
    arch = ARCHS.index(topo.arch) if topo.arch in ARCHS else 2
    idx = 0 if nodes == 1 else (1 if nodes == 2 else 2)
    ll_row = arch if nodes == 1 else (1 if topo.arch in AMD_HOSTS else 0)
    n, ch = topo.nranks, topo.channels
    bus = _bus_bw(topo, nodes)
    if algo == "ring":
        if proto == "ll":
            bus = min(LL_MAX_BW[ll_row][idx], bus * 0.5)
        elif proto == "ll128":
            bus = min(bus * 0.92, ch * RING_LL128_BW[arch][idx])
        return bus * n / (2 * (n - 1))
    bus = min(bus * 0.92, ch * TREE_BW[arch][idx])
    if proto == "ll":
        bus = min(bus / 3.8, LL_MAX_BW[ll_row][idx])
    elif proto == "ll128":
        bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), ch * TREE_LL128_BW[arch][idx])
    return bus * 0.5


def _latency(topo: Topology, algo: str, proto: str, nodes: int) -> float:
    """Base plus hardware latency (µs) of one all-reduce, ``ncclTopoTuneModel``."""
    i = PROTOCOLS.index(proto)
    n = topo.nranks
    ppn = n // nodes
    lat = BASE_LAT[algo][i]
    intra = HW_LAT["nvlink"][algo][i]
    inter = HW_LAT["net"]["tree" if ppn == 1 else algo][i]
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + int(math.log2(nodes)) * inter)
    if nodes > 1:
        over = (2.0 if topo.arch in AMD_HOSTS else 1.0) * (3 if proto == "simple" else 1)
        intra = max(intra, over)
    steps, inter_steps = 2 * (n - 1), 2 * (nodes - 1)
    return lat + (steps - inter_steps) * intra + inter_steps * inter


def nccl_model_time(topo: Topology, algo: str, proto: str, nbytes: int) -> float:
    """NCCL's estimate (µs) of an all-reduce of ``nbytes`` with ``algo`` (ring or tree)
    and ``proto`` (LL, LL128, Simple) on ``topo``: ``lat + nBytes / (1000·bw)``, with the
    tree correction and the ring's multi-node Simple plateau (``ncclTopoGetAlgoTime``)."""
    algo, proto = algo.lower(), proto.lower()
    nodes = len({topo.devices[d].node for d in topo.ranks})
    bw = _bandwidth(topo, algo, proto, nodes)
    lat = _latency(topo, algo, proto, nodes)
    log_size = (nbytes >> 6).bit_length() - 1
    if algo == "tree" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    if algo == "ring" and proto == "simple" and nodes > 1 and \
            nbytes / (topo.channels * topo.nranks) >= 64:
        lat *= 1.9 if topo.arch in ("volta",) else 1.4
    return lat + nbytes / (1000 * bw)
