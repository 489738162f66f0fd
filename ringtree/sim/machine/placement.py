"""Where every rank runs: real ranks where the topology puts them, virtual ranks (CollNet's
in-network reduction, ``ringtree.schedules.collnet``) on a reduction-capable switch."""

from __future__ import annotations

from collections.abc import Sequence

from ringtree.ir.program import Program
from ringtree.sim.machine.cluster import Topology

__all__ = ["place"]


def place(programs: Sequence[Program], topo: Topology) -> list[int]:
    """Device of every rank: real ranks where the topology puts them; a virtual rank on
    the reduction-capable switch closest to its members (lowest common ancestor for
    hierarchical networks; ties broken by the virtual rank's ``meta['tree']``). A virtual
    rank of ``meta['domain'] == 'nvlink'`` (NVLS) goes on an NVSwitch, the others on
    network switches."""
    n = topo.nranks
    devices = list(topo.ranks)
    kinds = {True: [], False: []}  # type: dict[bool, list[int]]
    for i, d in enumerate(topo.devices):
        if d.reduce:
            kinds[d.kind == "nvswitch"].append(i)
    for p in programs[n:]:
        nvlink = p.meta.get("domain") == "nvlink"
        cands = kinds[nvlink]
        if not cands:
            if nvlink:
                raise ValueError(f"{topo.name} has no NVLink SHARP switch (algorithm "
                                 f"{p.algo} needs an NVSwitch that reduces, as dgx_h100's)")
            raise ValueError(f"{topo.name} has no in-network reduction switch "
                             f"(algorithm {p.algo} needs one; try a *_sharp preset)")
        members = [devices[m] for m in p.meta.get("members", ())]
        tie = int(p.meta.get("tree", 0))
        if topo.routing == "updown":
            common = set(cands)
            for d in members:
                common &= topo.ancestors(d) | {d}
            if common:
                lo = min(topo.devices[c].level for c in common)
                best = sorted(c for c in common if topo.devices[c].level == lo)
                devices.append(best[tie % len(best)])
                continue
        sample = members[:: max(1, len(members) // 16)]
        score = {c: sum(len(topo.route(d, c)) for d in sample) for c in cands}
        lo = min(score.values())
        best = [c for c in cands if score[c] == lo]
        devices.append(best[tie % len(best)])
    return devices
