"""Modeled clusters as data: devices, directed links, rank placement and routing.

A :class:`Topology` is a graph of :class:`Device` s (GPUs, NICs, NVSwitches, network
switches) joined by directed :class:`Link` s with a latency (ns) and a bandwidth (GB/s,
``gb`` bytes per GB: 1e9 for ringtree, 2**30 to reproduce ASTRA-sim). Ranks live on
devices (``ranks[r]`` is the device of rank r). Switches flagged ``reduce`` can aggregate
in the network (SHArP / NVLS); CollNet schedules place their virtual ranks on them.

Routing is deterministic, as in astra-network-analytical's fixed routes:

- ``updown``: hierarchical networks (fat-trees, DGX nodes). Every device has a ``level``;
  a message climbs to the lowest device that is an ancestor of the destination and comes
  down. Where several uplinks qualify, node-local devices (an NVSwitch choosing a NIC)
  pick by channel — channel c leaves through rail c, NCCL's PXN — and network switches
  by ``uplinks``: ``dmodk`` (default), the destination mod the uplinks, as InfiniBand's
  fat-tree routing does, or ``hash``, ECMP on (source, destination, channel), as
  Ethernet fabrics do (:mod:`.routing`).
- ``dor``: multi-dimensional networks (ASTRA-sim's ``MultiDimTopology``): ring, fully
  connected and switch dimensions, traversed in dimension order; a ring takes the shorter
  way round when bidirectional.
- ``shortest``: breadth-first search, for hand-written graphs.

Constructors: :func:`switch`, :func:`fully_connected`, :func:`ring`, :func:`torus`,
:func:`multidim`, :func:`fat_tree` (nodes of GPUs on an NVSwitch, NICs, a two- or
three-level fat-tree with oversubscription and optional in-network reduction). Files:
:func:`save` / :func:`load` (JSON always, YAML when PyYAML is installed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from ringtree.sim.machine.routing import Router, coords, index

GB = 1e9


@dataclass(frozen=True, slots=True)
class Device:
    """A vertex. ``kind``: gpu, nic, nvswitch, switch. ``node``: host index (-1 for
    network gear). ``reduce``: can reduce in the network. ``reduce_gbps``: throughput of
    reductions and copies done on this device (0 = free)."""

    name: str
    kind: str = "gpu"
    node: int = -1
    level: int = 0
    reduce: bool = False
    reduce_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class Link:
    """A directed link: ``bandwidth`` in GB/s, ``latency`` in ns."""

    src: int
    dst: int
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Topology:
    """A modeled cluster. ``overhead_ns`` is a per-transfer software cost paid at the
    sender (NCCL's per-step latency beyond the wire); ``channels`` the default number of
    channels for schedules run on it; ``dims`` describes ``dor`` networks as
    ``(kind, size, bandwidth, latency)`` per dimension; ``launch_ns`` a fixed cost per
    collective call (NCCL's ``baseLat``; the Python API's call overhead on ``local``);
    ``uplinks`` how network switches choose among uplinks (:mod:`.routing`); ``arch`` the
    GPUs' generation (``volta``, ``ampere``, ``hopper``, ``blackwell``; '' unknown), which
    picks the row of NCCL's per-generation protocol tables (:mod:`.protocols`)."""

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    ranks: tuple[int, ...]
    routing: str = "shortest"
    gb: float = GB
    overhead_ns: float = 0.0
    channels: int = 1
    dims: tuple[tuple[str, int, float, float], ...] = ()
    params: tuple[tuple[str, object], ...] = field(default=())
    launch_ns: float = 0.0
    uplinks: str = "dmodk"
    arch: str = ""

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    def nodes(self) -> tuple[int, ...]:
        """Node (host) of every rank, as ``Options.nodes`` expects."""
        return tuple(self.devices[d].node for d in self.ranks)

    def bytes_per_ns(self, link: int) -> float:
        return self.links[link].bandwidth * self.gb / 1e9

    @cached_property
    def _router(self) -> Router:
        return Router(self)

    @cached_property
    def link_paths(self) -> dict:
        """The same summaries by the route's links, so equal routes share one."""
        return {}

    def route(self, a: int, b: int, channel: int = 0) -> tuple[int, ...]:
        """Link ids of the fixed route from device ``a`` to device ``b``."""
        return self._router.route(a, b, channel)

    def channel_free(self, a: int, b: int) -> bool:
        """Whether the route from ``a`` to ``b``, once asked for on any channel, read no
        channel, so that it is the route of every channel (:meth:`Router.route`)."""
        return (a, b, -1) in self._router.cache

    def split_route(self, a: int, b: int, channel: int = 0
                    ) -> tuple[tuple[int, ...], int, int, tuple[int, ...]]:
        """(head, a', b', tail) with ``route(a, b) == head + route(a', b') + tail``, a GPU
        end replaced by its NVSwitch where the routing allows it (:meth:`Router.split`)."""
        return self._router.split(a, b, channel)

    def leaf_hop(self, d: int, channel: int = -1) -> tuple[int, int, int] | None:
        """(link d → p, link p → d, p) when :meth:`split_route` replaces the end ``d``
        by p (as a source, and as a destination on ``channel`` if given), else None."""
        return self._router.leaf_hop(d, channel)

    def ancestors(self, d: int) -> frozenset[int]:
        """Devices reachable upward from ``d`` (``updown`` routing only)."""
        return self._router.reach(d)


# ---- constructors ----------------------------------------------------------------------


def _both(links: list[Link], a: int, b: int, bw: float, lat: float) -> None:
    links.append(Link(a, b, bw, lat))
    links.append(Link(b, a, bw, lat))


def multidim(dims: list[tuple[str, int, float, float]], *, name: str = "multidim",
             gb: float = GB, overhead_ns: float = 0.0, reduce_gbps: float = 0.0,
             sharp: bool = False) -> Topology:
    """ASTRA-sim style multi-dimensional network of ``prod(size)`` NPUs.

    Each dimension is ``(kind, size, bandwidth GB/s, latency ns)`` with kind ``ring``
    (bidirectional), ``uring`` (unidirectional), ``fc`` (fully connected) or ``switch``.
    NPU i has mixed-radix coordinates, dimension 0 fastest.
    """
    dims = [(k, int(s), float(bw), float(lat)) for k, s, bw, lat in dims]
    n = math.prod(s for _, s, _, _ in dims)
    devices = [Device(f"npu{i}", "gpu", node=i, reduce_gbps=reduce_gbps) for i in range(n)]
    links: list[Link] = []
    for dim, (kind, size, bw, lat) in enumerate(dims):
        if size < 2:
            continue
        for i in range(n):
            c = coords(i, dims)
            if c[dim] != 0:
                continue
            members = [index(c[:dim] + [k] + c[dim + 1:], dims) for k in range(size)]
            if kind == "switch":
                devices.append(Device(f"sw{dim}.{i}", "switch", level=1, reduce=sharp))
                sw = len(devices) - 1
                for m in members:
                    _both(links, m, sw, bw, lat)
            elif kind == "fc":
                for x in members:
                    for y in members:
                        if x != y:
                            links.append(Link(x, y, bw, lat))
            elif kind in ("ring", "uring"):
                pairs = size if size > 2 else 1
                for k in range(pairs):
                    x, y = members[k], members[(k + 1) % size]
                    if kind == "ring" or size == 2:
                        _both(links, x, y, bw, lat)
                    else:
                        links.append(Link(x, y, bw, lat))
            else:
                raise ValueError(f"unknown dimension kind {kind!r}")
    return Topology(name, tuple(devices), tuple(links), tuple(range(n)), "dor", gb,
                    overhead_ns, 1, tuple(dims))


def switch(n: int, bandwidth: float, latency: float, **kw) -> Topology:
    """n NPUs on one switch (2 hops between any two)."""
    return multidim([("switch", n, bandwidth, latency)], name=kw.pop("name", f"switch{n}"), **kw)


def fully_connected(n: int, bandwidth: float, latency: float, **kw) -> Topology:
    """n NPUs, a direct link between every pair (1 hop)."""
    return multidim([("fc", n, bandwidth, latency)], name=kw.pop("name", f"fc{n}"), **kw)


def ring(n: int, bandwidth: float, latency: float, bidirectional: bool = True,
         **kw) -> Topology:
    """n NPUs on a ring; a bidirectional ring routes the shorter way."""
    kind = "ring" if bidirectional else "uring"
    return multidim([(kind, n, bandwidth, latency)], name=kw.pop("name", f"ring{n}"), **kw)


def torus(shape: tuple[int, ...], bandwidth: float, latency: float, **kw) -> Topology:
    """A torus (bidirectional ring in every dimension), dimension-order routed."""
    name = kw.pop("name", "torus" + "x".join(map(str, shape)))
    return multidim([("ring", s, bandwidth, latency) for s in shape], name=name, **kw)


def fat_tree(nodes: int, *, gpus_per_node: int = 8, nics_per_node: int = 8,
             nvlink_gbps: float = 300.0, nvlink_ns: float = 300.0,
             pcie_gbps: float = 50.0, pcie_ns: float = 200.0,
             nic_gbps: float = 25.0, nic_ns: float = 600.0, switch_ns: float = 300.0,
             leaf_ports: int = 32, levels: int = 2, pod_leaves: int = 8,
             oversubscription: float = 1.0, rail_optimized: bool = True,
             sharp: bool = False, gpu_reduce_gbps: float = 0.0, overhead_ns: float = 0.0,
             channels: int = 0, name: str = "fat_tree", uplinks: str = "dmodk",
             nvls: bool = False, arch: str = "") -> Topology:
    """Hosts of GPUs on an NVSwitch, NICs, and a two- or three-level fat-tree.

    Per node: GPUs ↔ NVSwitch (``nvlink_gbps`` each way per GPU), NVSwitch ↔ each NIC
    (``pcie_gbps``), NIC ↔ leaf (``nic_gbps``, ``nic_ns``). Leaves have ``leaf_ports``
    host ports and ``leaf_ports / oversubscription`` uplinks. ``rail_optimized`` puts NIC
    r of ``leaf_ports`` consecutive nodes on one leaf (DGX SuperPOD rails); otherwise NIC
    ports fill leaves in order. Two levels: every leaf reaches every spine. Three levels:
    pods of ``pod_leaves`` leaves with one aggregation switch per leaf uplink, each
    with ``pod_leaves / oversubscription`` core uplinks. ``sharp`` makes every network
    switch an in-network reduction switch. Switch latency is ``switch_ns`` per hop.
    ``uplinks``: ``dmodk`` (InfiniBand's destination-mod-k) or ``hash`` (ECMP).
    ``nvls`` makes every NVSwitch a reduction switch (NVLink SHARP, Hopper on); ``arch``
    names the GPUs' generation (:attr:`Topology.arch`).
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("need at least one node with one GPU")
    devices: list[Device] = []
    links: list[Link] = []
    ranks: list[int] = []
    nics = [_node(devices, links, ranks, n, gpus_per_node, nics_per_node if nodes > 1 else 0,
                  nvlink_gbps, nvlink_ns, pcie_gbps, pcie_ns, gpu_reduce_gbps, nvls)
            for n in range(nodes)]
    if nodes > 1 and nics_per_node > 0:
        up = max(1, round(leaf_ports / oversubscription))
        nleaf = -(-nodes // leaf_ports) * nics_per_node if rail_optimized else \
            -(-nodes * nics_per_node // leaf_ports)
        base = len(devices)
        for i in range(nleaf):
            devices.append(Device(f"leaf{i}", "switch", -1, 3, sharp))
        for n in range(nodes):
            for k, nic in enumerate(nics[n]):
                leaf = (n // leaf_ports) * nics_per_node + k if rail_optimized else \
                    (n * nics_per_node + k) // leaf_ports
                _both(links, nic, base + leaf, nic_gbps, nic_ns)
        if nleaf > 1 and levels <= 2:
            _spines(devices, links, base, nleaf, up, nic_gbps, switch_ns, sharp)
        elif nleaf > 1:
            _pods(devices, links, base, nleaf, up, pod_leaves, oversubscription, nic_gbps,
                  switch_ns, sharp)
    fanin = leaf_ports if rail_optimized else max(1, leaf_ports // max(1, nics_per_node))
    return Topology(name, tuple(devices), tuple(links), tuple(ranks), "updown", GB,
                    overhead_ns, channels or max(1, nics_per_node),
                    params=(("collnet_fanin", fanin),), uplinks=uplinks, arch=arch)


def _node(devices: list[Device], links: list[Link], ranks: list[int], n: int, gpus: int,
          nics: int, nvlink_gbps: float, nvlink_ns: float, pcie_gbps: float, pcie_ns: float,
          reduce_gbps: float, nvls: bool = False) -> list[int]:
    """One host: GPUs on an NVSwitch, NICs behind it; returns the NICs' devices."""
    first = len(devices)
    for g in range(gpus):
        devices.append(Device(f"n{n}.gpu{g}", "gpu", n, 0, False, reduce_gbps))
    ranks += range(first, first + gpus)
    devices.append(Device(f"n{n}.nvswitch", "nvswitch", n, 1, nvls))
    nvs = len(devices) - 1
    for g in range(first, first + gpus):
        _both(links, g, nvs, nvlink_gbps, nvlink_ns)
    row = []
    for k in range(nics):
        devices.append(Device(f"n{n}.nic{k}", "nic", n, 2))
        row.append(len(devices) - 1)
        _both(links, nvs, row[-1], pcie_gbps, pcie_ns)
    return row


def _spines(devices: list[Device], links: list[Link], base: int, nleaf: int, up: int,
            gbps: float, ns: float, sharp: bool) -> None:
    """Two levels: every leaf reaches every spine."""
    sbase = len(devices)
    for s in range(up):
        devices.append(Device(f"spine{s}", "switch", -1, 4, sharp))
    for i in range(nleaf):
        for s in range(up):
            _both(links, base + i, sbase + s, gbps, ns)


def _pods(devices: list[Device], links: list[Link], base: int, nleaf: int, up: int,
          pod_leaves: int, oversubscription: float, gbps: float, ns: float,
          sharp: bool) -> None:
    """Three levels: pods of leaves with one aggregation switch per leaf uplink, each
    with ``pod_leaves / oversubscription`` core uplinks."""
    pods = -(-nleaf // pod_leaves)
    core_up = max(1, round(pod_leaves / oversubscription))
    abase = len(devices)
    for p in range(pods):
        for a in range(up):
            devices.append(Device(f"agg{p}.{a}", "switch", -1, 4, sharp))
    cbase = len(devices)
    for a in range(up):
        for c in range(core_up):
            devices.append(Device(f"core{a}.{c}", "switch", -1, 5, sharp))
    for i in range(nleaf):
        p = i // pod_leaves
        for a in range(up):
            _both(links, base + i, abase + p * up + a, gbps, ns)
    for p in range(pods):
        for a in range(up):
            for c in range(core_up):
                _both(links, abase + p * up + a, cbase + a * core_up + c, gbps, ns)


# ---- files -----------------------------------------------------------------------------


def to_dict(t: Topology) -> dict:
    """A JSON-able description (devices and links listed explicitly)."""
    return {
        "name": t.name, "routing": t.routing, "gb": t.gb, "overhead_ns": t.overhead_ns,
        "channels": t.channels, "launch_ns": t.launch_ns, "dims": [list(d) for d in t.dims],
        "params": [list(p) for p in t.params],
        "devices": [asdict(d) for d in t.devices],
        "links": [[lk.src, lk.dst, lk.bandwidth, lk.latency] for lk in t.links],
        "ranks": list(t.ranks), "uplinks": t.uplinks, "arch": t.arch,
    }


# the named clusters a file's ``{"generator": NAME}`` may also call: :mod:`.presets` adds
# its own when imported (``ringtree.sim`` imports it), so this module needs not import it
GENERATORS: dict[str, Callable[..., Topology]] = {}


def from_dict(d: dict) -> Topology:
    """Inverse of :func:`to_dict`. A dict ``{"generator": NAME, "args": {...}}`` instead
    calls a constructor of this module (or a preset) with those arguments."""
    if "generator" in d:
        gen = d["generator"]
        fn = GENERATORS.get(gen) or globals().get(gen)
        if fn is None or gen.startswith("_"):
            raise ValueError(f"unknown topology generator {gen!r}")
        return fn(**d.get("args", {}))
    return Topology(
        name=d.get("name", "topology"),
        devices=tuple(Device(**x) for x in d["devices"]),
        links=tuple(Link(int(a), int(b), float(bw), float(lat)) for a, b, bw, lat in d["links"]),
        ranks=tuple(d["ranks"]),
        routing=d.get("routing", "shortest"),
        gb=float(d.get("gb", GB)),
        overhead_ns=float(d.get("overhead_ns", 0.0)),
        channels=int(d.get("channels", 1)),
        dims=tuple((str(k), int(s), float(bw), float(lat)) for k, s, bw, lat in d.get("dims", ())),
        params=tuple((str(k), v) for k, v in d.get("params", ())),
        launch_ns=float(d.get("launch_ns", 0.0)),
        uplinks=str(d.get("uplinks", "dmodk")),
        arch=str(d.get("arch", "")),
    )


def save(t: Topology, path: str | Path) -> None:
    """Write ``t`` as JSON, or YAML if the suffix is .yaml/.yml (needs PyYAML)."""
    path = Path(path)
    data = to_dict(t)
    if path.suffix in (".yaml", ".yml"):
        import yaml

        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        path.write_text(json.dumps(data))


def load(path: str | Path) -> Topology:
    """Read a topology file written by :func:`save` or by hand."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise RuntimeError("YAML topologies need PyYAML (pip install ringtree[yaml])") from e
        return from_dict(yaml.safe_load(text))
    return from_dict(json.loads(text))
