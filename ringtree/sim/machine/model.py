"""Network and compute models: what a transfer and a reduction cost.

Two fidelities, after astra-network-analytical (ASTRA-sim 2.0, ISPASS'23):

- :class:`Unaware` — congestion-unaware closed form per message (``BasicTopology``):
  ``t = o + Σ latency(hop) + bytes / min bandwidth(hop)`` — Hockney's α-β model with
  α = o + hops·latency. Transfers of different connections never interact; one
  connection is a pipe that carries one slice at a time, so a message cut into k slices
  still costs α + n/B (not α + n/(k·B)). A rank's connections are static shares of the
  links they cross: a link that k connections of one sender use gives each B/k
  (:func:`channel_shares`; NCCL's topology search likewise books every channel's
  bandwidth on every link of its path, ``graph/search.cc``), so more channels or peers
  never exceed a link's bandwidth. This assumes a rank's connections are all busy at
  once — true of channels and of direct exchanges, pessimistic for schedules that visit
  their peers one after another (recursive doubling). Flows of different senders still
  ignore each other.
- :class:`Aware` — congestion-aware: every directed link is a FIFO. A chunk occupies a
  link for ``bytes/B`` and reaches the next device ``latency + bytes/B`` after it started
  (``Link::schedule_chunk_transmission``), store-and-forward at every hop.

Compute (the γ of the α-β-γ model, Thakur et al. 2005): a reduction of k inputs into one
costs ``(k−1)·bytes/R`` and a local copy ``bytes/R`` on the device doing it, R its
``reduce_gbps`` (0 = free). Receiving straight into the destination costs nothing (the
executor receives in place).

A transfer also costs the topology's ``overhead_ns`` o at the sender (software/proxy cost
per step, NCCL's per-step ``hwLat`` beyond the wire). ``integer_ns`` truncates every
transfer delay to whole ns, as ASTRA-sim's integer event clock does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ringtree.sim.machine.cluster import Topology


@dataclass(frozen=True)
class Unaware:
    """Congestion-unaware α-β model: hops·α + bytes/B per message."""

    integer_ns: bool = False
    name: str = "unaware"


@dataclass(frozen=True)
class Aware:
    """Congestion-aware model: FIFO links, store-and-forward per hop."""

    integer_ns: bool = False
    name: str = "aware"


MODELS = {"unaware": Unaware, "aware": Aware}


@dataclass(frozen=True)
class Rules:
    """The model's rules, read by every engine (:mod:`ringtree.sim.engines`) from here.

    - ``aware``: links are FIFOs (:class:`Aware`), else every connection is its own α-β
      pipe (:class:`Unaware`);
    - ``integer_ns``: every transfer delay is truncated to whole ns (ASTRA-sim's integer
      event clock): a hop's arrival ``float(int(t))`` in the event engines, ``floor`` of
      the same positive floats in the array ones;
    - ``overhead_ns``: o, paid by every transfer at its sender (NCCL's per-step software
      cost beyond the wire), added to the injection time;
    - ``launch_ns``: once per collective call (NCCL's ``baseLat``), added to the last
      rank's finish;
    - ``gb``: bytes per GB of the topology's rates, so γ's rate R of a device in bytes/ns
      is ``reduce_gbps · gb / 1e9`` (:meth:`reduce_rates`) and a step of ``ops`` passes
      over ``b`` bytes computes for ``ops · b / R`` (:func:`compute_ns`; Thakur,
      Rabenseifner & Gropp 2005).
    - ``alpha_beta``: the run asked for the vectorised α-β engine (``model="fast"``),
      which answers the unaware model's time only.
    """

    aware: bool
    integer_ns: bool
    overhead_ns: float
    launch_ns: float
    gb: float
    alpha_beta: bool = False

    @classmethod
    def of(cls, model: str | Unaware | Aware, topo: Topology) -> Rules:
        """The rules of ``model`` (``aware``, ``unaware``, ``fast`` or a model) on ``topo``."""
        fast = isinstance(model, str) and model.lower() == "fast"
        m = Unaware() if fast else parse_model(model)
        return cls(isinstance(m, Aware), m.integer_ns, topo.overhead_ns, topo.launch_ns,
                   topo.gb, fast)

    @property
    def model(self) -> Unaware | Aware:
        """The model object these rules come from."""
        return (Aware if self.aware else Unaware)(self.integer_ns)

    @property
    def name(self) -> str:
        return "fast" if self.alpha_beta else self.model.name

    def reduce_rates(self, topo: Topology, devices: list[int]) -> list[float]:
        """γ's rate R (bytes/ns) of every rank's device; 0: reduces for free."""
        return [topo.devices[d].reduce_gbps * self.gb / 1e9 for d in devices]


def parse_model(model: str | Unaware | Aware) -> Unaware | Aware:
    if isinstance(model, (Unaware, Aware)):
        return model
    try:
        return MODELS[model.lower()]()
    except KeyError:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(MODELS)}") from None


@dataclass(frozen=True, slots=True)
class Path:
    """A route summarised for the closed form: Σ latency, bottleneck and first-hop rate
    (bytes/ns), and the link ids."""

    latency: float
    bottleneck: float
    first: float
    links: tuple[int, ...]


def path(topo: Topology, links: tuple[int, ...], share: dict[int, int] | None = None
         ) -> Path:
    """The route ``links`` summarised; with ``share`` a link's rate is divided by the
    number of channels using it."""
    if not links:
        return Path(0.0, math.inf, math.inf, ())
    lat = sum(topo.links[i].latency for i in links)
    if share:
        rates = [topo.bytes_per_ns(i) / share.get(i, 1) for i in links]
    else:
        rates = [topo.bytes_per_ns(i) for i in links]
    return Path(lat, min(rates), rates[0], links)


def channel_shares(flows: Iterable[tuple[int, tuple[int, ...]]]) -> dict[int, int]:
    """From ``(sender, route)`` of every connection: for each link, the largest number of
    one sender's connections crossing it (only links shared more than once)."""
    load: dict[tuple[int, int], int] = {}
    for sender, links in flows:
        for li in links:
            load[(li, sender)] = load.get((li, sender), 0) + 1
    out: dict[int, int] = {}
    for (li, _), k in load.items():
        if k > out.get(li, 1):
            out[li] = k
    return out


def unaware_delay(p: Path, nbytes: int, overhead: float, integer_ns: bool) -> float:
    """ASTRA-sim ``comms_delay = hops·latency + size/bandwidth`` (+ sender overhead)."""
    d = overhead + p.latency + (nbytes / p.bottleneck if nbytes else 0.0)
    return float(int(d)) if integer_ns else d


def compute_ns(nbytes: int, ops: int, reduce_bpns: float) -> float:
    """γ cost: ``ops`` passes over ``nbytes`` at ``reduce_bpns`` bytes/ns (0 = free)."""
    if not ops or not reduce_bpns:
        return 0.0
    return ops * nbytes / reduce_bpns


# ---- closed forms (Thakur, Rabenseifner & Gropp 2005; NCCL tuning.cc) ------------------


def ring_all_reduce(p: int, nbytes: float, alpha: float, beta: float, gamma: float = 0.0
                    ) -> float:
    """2(p−1)·α + 2(p−1)/p·n·β + (p−1)/p·n·γ (unpipelined ring, one slice per step)."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta + (p - 1) / p * nbytes * gamma


def tree_all_reduce_latency(nodes: int, ppn: int, alpha: float) -> float:
    """Latency term of NCCL's tree all-reduce: 2·((ppn−1) + log2(nodes))·α."""
    return 2 * ((ppn - 1) + math.log2(max(1, nodes))) * alpha
