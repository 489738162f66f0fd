"""NCCL's three protocols on the GPUs of a modeled cluster: Simple, LL and LL128.

The simulator moves bytes the way the topology prices them, which the presets calibrate
to NCCL's Simple protocol. A protocol is priced here as a modified topology, so every
engine runs it unchanged (NCCL 2.30.7 ``src/graph/tuning.cc``, ``src/include/device.h``):

- **wire efficiency** — LL sends 16-byte lines of 8 data and 8 flag bytes
  (``union ncclLLFifoLine``): every link carries data at 8/16 of its rate; LL128 sends
  128-byte lines of 120 data bytes and one 8-byte flag (``NCCL_LL128_LINESIZE``,
  ``DATAELEMS 15`` of 16): 120/128; Simple 1 (a maintainer: "LL maximum bandwidth 50%
  of the peak … LL128 can achieve 95% peak", NVIDIA/nccl#281);
- **per-step latency** — NCCL's ``hwLatencies[link][algo][proto]``. LL and LL128: the
  per-transfer overhead o and the latencies of links inside a node are scaled so that a
  step between two GPUs of a node costs ``hwLat[NVLINK]``, and the links between nodes so
  that a step between nodes costs ``hwLat[NET]`` (:func:`_scales`). Simple keeps the
  topology's own costs (what the presets calibrate, as Ring/Simple), Tree's scaled by
  NCCL's Tree/Ring Simple ratio;
- **base latency** — ``baseLatencies[algo][proto]`` once per call (``launch_ns``), plus,
  for the algorithms NCCL prices per call rather than per step (CollNet, NVLS), their
  ``hwLat`` terms as its formulas combine them (:func:`_per_call`); the schedule's own
  hops keep the topology's costs, so those are slightly counted twice;
- **bandwidth caps per link type** — a GPU's outgoing links are capped at LL's
  ``llMaxBws[arch][nodes]`` and LL128's ``channels · perChMax{Ring,Tree}LL128Bws``
  (GB/s of bus bandwidth, which a GPU's egress bounds); the table row is the GPU
  generation (:attr:`~.cluster.Topology.arch`), or, for LL across nodes, the CPU vendor
  as NCCL indexes it (DGX A100: AMD EPYC → row 1; DGX H100: Intel Xeon → row 0);
- **NVLS** — ``nvlsEfficiency[arch]`` (0.85 on Hopper) on NVLink for the ``nvls``
  schedules, and on one node m/(m+1) more (m GPUs): the head's ``ld_reduce``/``st``
  round trip that :mod:`ringtree.schedules.nvls` merges into the switch's multicast.

NCCL's algorithm rows: ``ring`` and ``tree`` are NCCL's; ``collnet_*`` and ``nvls*``
exist in NCCL with Simple only (``src/device/generate.py``: "LL and LL128 exist only for
Ring and Tree"), so only Simple is offered for them; ringtree's own algorithms
(halving-doubling, Bruck, direct, hierarchical, …) may run every protocol with the Ring
row's latencies; an MSCCL-IR file runs the protocol it declares (:func:`choices`). Not modeled: NCCL's Tree-specific factors (``busBw/3.8`` for Tree LL,
``7/9`` for single-node Tree LL128, ``treeCorrectionFactor``), LL128's enable rules
(assumed on: NVLink systems of one GPU generation), channel and thread reduction for
small messages.
"""

from __future__ import annotations

from dataclasses import replace

from ringtree.sim.machine.cluster import Link, Topology

PROTOCOLS = ("ll", "ll128", "simple")          # NCCL's order (NCCL_PROTO_LL = 0, ...)
NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
EFFICIENCY = {"ll": 8 / 16, "ll128": 120 / 128, "simple": 1.0}
FUNCTIONS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")

# tuning.cc (2.30.7) per algorithm row, values for (LL, LL128, Simple), µs
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
            "collnet_direct": (0.0, 0.0, 0.0), "collnet_chain": (0.0, 0.0, 0.0),
            "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)}
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
               "nvls": (0, 0, 25.0), "nvls_tree": (0, 0, 25.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
            "collnet_direct": (0, 0, 31.0), "collnet_chain": (0, 0, 30.0),
            "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 20.9)},
}
# [compcap row][1 node, 2 nodes, 4+ nodes], GB/s
ARCHS = ("volta", "ampere", "hopper", "blackwell")
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
RING_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
TREE_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
AMD_HOSTS = {"ampere"}       # DGX A100 runs on AMD EPYC; DGX H100 on Intel Xeon


def row(algo: str) -> str:
    """NCCL's row of the tables for a ringtree algorithm (ringtree's own: Ring's)."""
    return algo if algo in BASE_LAT else "ring"


def allowed(algo: str) -> tuple[str, ...]:
    """Protocols ``algo`` runs with: NCCL's non-Ring/Tree algorithms Simple only."""
    return ("simple",) if row(algo) not in ("ring", "tree") else PROTOCOLS


def parse(spec: str, function: str) -> tuple[str, ...]:
    """The protocols ``NCCL_PROTO=spec`` enables for ``function`` (``allreduce``, or a
    collective NCCL does not tune, which only the first, prefix-less entry reaches).

    ``tuning.cc::parseList``: entries separated by ``;``, each ``[prefix:]elements``;
    only the first may lack a prefix (it applies to every function); elements are
    comma-separated, case-insensitive; a leading ``^`` enables all but those listed.
    """
    enabled = dict.fromkeys(PROTOCOLS, True)
    fn = function.replace("_", "").lower()
    for i, entry in enumerate(e for e in spec.split(";") if e.strip()):
        prefix, _, elems = entry.rpartition(":")
        prefix = prefix.strip().lower()
        if not prefix and i > 0:
            raise ValueError(f"NCCL_PROTO {spec!r}: all entries except the first must "
                             f"have a prefix")
        if prefix and prefix not in FUNCTIONS:
            raise ValueError(f"NCCL_PROTO {spec!r}: unrecognized prefix token {prefix!r} "
                             f"(expected one of {', '.join(FUNCTIONS)})")
        if prefix and prefix != fn:
            continue
        elems = elems.strip()
        negate = elems.startswith("^")
        names = [t.strip().lower() for t in elems.lstrip("^").split(",") if t.strip()]
        bad = [t for t in names if t not in PROTOCOLS]
        if bad or not names:
            raise ValueError(f"NCCL_PROTO {spec!r}: unrecognized element token "
                             f"{(bad or [''])[0]!r} (expected LL, LL128, Simple)")
        for p in PROTOCOLS:
            enabled[p] = (p not in names) if negate else (p in names)
    return tuple(p for p in PROTOCOLS if enabled[p])


def _arch_row(topo: Topology) -> int | None:
    return ARCHS.index(topo.arch) if topo.arch in ARCHS else None


def _nodes(topo: Topology) -> int:
    return len({topo.devices[d].node for d in topo.ranks})


def _caps(topo: Topology, algo: str, proto: str) -> float | None:
    """GB/s cap of a GPU's outgoing links under ``proto`` (None: no cap)."""
    arch = _arch_row(topo)
    if arch is None or proto == "simple":
        return None
    nodes = _nodes(topo)
    idx = 0 if nodes == 1 else (1 if nodes == 2 else 2)
    if proto == "ll":
        r = arch if nodes == 1 else (1 if topo.arch in AMD_HOSTS else 0)
        return LL_MAX_BW[r][idx]
    table = TREE_LL128_BW if row(algo) == "tree" else RING_LL128_BW
    return topo.channels * table[arch][idx]


def _ratio(cls: str, algo: str, proto: str) -> float:
    """Simple's per-step latency of NCCL's row against Ring/Simple's, which the topology's
    own costs stand for; 1 for the rows NCCL prices per call (:func:`_per_call`)."""
    if row(algo) not in ("ring", "tree"):
        return 1.0
    return HW_LAT[cls][row(algo)][PROTOCOLS.index(proto)] / HW_LAT[cls]["ring"][2]


def _route_latency(topo: Topology, a: int, b: int) -> tuple[float, float]:
    """(Σ latency of the links inside nodes, Σ of the others) from rank a to rank b."""
    intra = net = 0.0
    for i in topo.route(topo.ranks[a], topo.ranks[b]):
        if _intra(topo, topo.links[i]):
            intra += topo.links[i].latency
        else:
            net += topo.links[i].latency
    return intra, net


def _scales(topo: Topology, algo: str, proto: str) -> tuple[float, float]:
    """Factors for (the overhead and links inside nodes, links between nodes).

    Simple: NCCL's Simple ratios (:func:`_ratio`). LL and LL128: a step costs what
    ``tuning.cc`` tabulates, ``hwLat[NVLINK]`` between two GPUs of a node and
    ``hwLat[NET]`` between nodes (the Tree row when nodes hold one GPU: NCCL's
    ``ppn == 1`` rule; at least ``netOverhead``, 1 µs on Intel / 2 µs on AMD hosts, inside
    a node for multi-node rings), measured on the routes from rank 0."""
    if proto == "simple" or row(algo) not in ("ring", "tree"):
        return _ratio("nvlink", algo, proto), _ratio("net", algo, proto)
    i, r = PROTOCOLS.index(proto), row(algo)
    node = [topo.devices[d].node for d in topo.ranks]
    mate = next((q for q in range(1, topo.nranks) if node[q] == node[0]), None)
    far = next((q for q in range(1, topo.nranks) if node[q] != node[0]), None)
    want_intra = HW_LAT["nvlink"][r][i] * 1e3
    if far is not None and r == "ring":
        want_intra = max(want_intra, 2e3 if topo.arch in AMD_HOSTS else 1e3)
    if mate is None:
        k_in = _ratio("nvlink", algo, proto)
    else:
        k_in = want_intra / max(1e-9, topo.overhead_ns + sum(_route_latency(topo, 0, mate)))
    if far is None:
        return k_in, k_in
    want_net = HW_LAT["net"]["tree" if mate is None else r][i] * 1e3
    intra, net = _route_latency(topo, 0, far)
    if net <= 0:
        return k_in, k_in
    return k_in, max(0.0, want_net - (topo.overhead_ns + intra) * k_in) / net


def _per_call(topo: Topology, algo: str) -> float:
    """NCCL's hardware latency of the algorithms it prices per call, not per step
    (``tuning.cc``, µs): NVLS ``intraLat (+ interLat)``; NVLSTree ``intraLat +
    2·log2(nodes)·interLat``; CollNetDirect ``2·min(1, ppn−1)·intraLat + interLat``;
    CollNetChain ``2(ppn−1)·intraLat + interLat``."""
    r = row(algo)
    if r in ("ring", "tree"):
        return 0.0
    nodes = _nodes(topo)
    ppn = max(1, topo.nranks // nodes)
    intra, inter = HW_LAT["nvlink"][r][2], HW_LAT["net"][r][2] if nodes > 1 else 0.0
    hops = max(0, nodes - 1).bit_length()
    return {"nvls": intra + inter, "nvls_tree": intra + 2 * hops * inter,
            "collnet_direct": 2 * min(1, ppn - 1) * intra + inter,
            "collnet_chain": 2 * (ppn - 1) * intra + inter}[r]


def _intra(topo: Topology, lk: Link) -> bool:
    a, b = topo.devices[lk.src], topo.devices[lk.dst]
    return a.node >= 0 and a.node == b.node


def _nvls_factor(topo: Topology, collective: str, algo: str) -> float:
    if not algo.startswith("nvls"):
        return 1.0
    eff = NVLS_EFFICIENCY.get(topo.arch, 1.0)
    if collective == "all_reduce" and _nodes(topo) == 1:
        m = topo.nranks
        eff *= m / (m + 1)
    return eff


_MEMO: dict[tuple, tuple[Topology, Topology]] = {}


def priced(topo: Topology, collective: str, algo: str, proto: str | None) -> Topology:
    """``topo`` as ``algo`` sees it under NCCL protocol ``proto`` (None: the topology's
    own costs, with only NVLS's efficiency for the ``nvls`` schedules). The same object
    is returned for the same inputs, so a sweep keeps its routes."""
    key = (id(topo), collective, algo, proto)
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is topo:
        return hit[1]
    nvls = _nvls_factor(topo, collective, algo)
    if proto is None and nvls == 1.0:
        return topo
    if proto is not None and proto not in PROTOCOLS:
        raise ValueError(f"unknown protocol {proto!r} (expected LL, LL128, Simple)")
    p = proto or "simple"
    if p not in allowed(algo):
        raise ValueError(f"{algo} runs with the Simple protocol only (NCCL has no "
                         f"{NAMES[p]} kernel for it)")
    eff, cap = EFFICIENCY[p], _caps(topo, algo, p)
    r_nvl, r_net = _scales(topo, algo, p)
    links = []
    for lk in topo.links:
        intra = _intra(topo, lk)
        bw = lk.bandwidth * eff
        if intra and nvls != 1.0 and "nvswitch" in (topo.devices[lk.src].kind,
                                                    topo.devices[lk.dst].kind):
            bw *= nvls
        if cap is not None and topo.devices[lk.src].kind == "gpu":
            bw = min(bw, cap)
        links.append(Link(lk.src, lk.dst, bw, lk.latency * (r_nvl if intra else r_net)))
    base = (BASE_LAT[row(algo)][PROTOCOLS.index(p)] + _per_call(topo, algo)) * 1e3 \
        if proto is not None else 0.0
    out = replace(topo, links=tuple(links), overhead_ns=topo.overhead_ns * r_nvl,
                  launch_ns=topo.launch_ns + base, name=f"{topo.name}:{NAMES[p]}")
    if len(_MEMO) >= 64:
        _MEMO.clear()
    _MEMO[key] = (topo, out)
    return out


def choices(spec: str, collective: str, algo: str, declared: str | None = None
            ) -> tuple[str, ...]:
    """The protocols to try for ``algo``: ``auto`` (every one it runs with, the fastest
    wins, as NCCL's tuner picks) or an ``NCCL_PROTO`` string, within :func:`allowed`, or
    only ``declared`` (an MSCCL-IR file's protocol, the one its executors run)."""
    wanted = PROTOCOLS if spec.strip().lower() == "auto" else parse(spec, collective)
    runs = allowed(algo) if declared is None else (declared,)
    got = tuple(p for p in wanted if p in runs)
    if not got:
        raise ValueError(f"no protocol for {algo}: NCCL_PROTO={spec!r} enables "
                         f"{', '.join(NAMES[p] for p in wanted) or 'none'} for "
                         f"{collective}, and {algo} runs with "
                         f"{', '.join(NAMES[p] for p in runs)} only")
    return got
