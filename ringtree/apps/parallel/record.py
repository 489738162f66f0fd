"""``--record-comm``: one training step's communication as a JSON workload.

Format ``ringtree-comm/1`` (read by ``ringtree sim --workload``,
:mod:`ringtree.sim.workload`)::

    {"format": "ringtree-comm/1",
     "grid": {"dp": 2, "tp": 2, "pp": 2}, "world": 8,
     "model": {GPTConfig fields}, "batch_size": 16, "micro_batches": 4,
     "schedule": "1f1b", "zero": 0, "step": 3,
     "ranks": [
       {"rank": 0, "coords": {"dp": 0, "pp": 0, "tp": 0},
        "events": [
          {"id": 0, "op": "all_reduce", "axis": "tp", "ranks": [0, 1], "bytes": 8192,
           "phase": "F0", "deps": []},
          {"id": 1, "op": "send", "axis": "pp", "ranks": [0, 2], "peer": 2,
           "bytes": 8192, "phase": "F0", "deps": [[0, 0]]},
          ...]},
       ...]}

- ``op``: ``all_reduce``, ``reduce_scatter``, ``all_gather`` (``bytes`` = the whole
  buffer: input of all-reduce / reduce-scatter, output of all-gather), ``send``,
  ``recv`` (``peer`` = the other global rank).
- ``axis``: the grid axis of the group, ``tp``, ``pp`` or ``dp``; ``ranks``: the
  group's global ranks.
- ``phase``: what the rank was doing: ``F<j>`` / ``B<j>`` forward / backward of
  micro-batch j (a DP bucket launched from a backward hook carries that backward's
  label), ``optim`` for the update (ZeRO-1's all-gather).
- ``deps``: ``[rank, id]`` pairs that must finish first: the rank's previous event
  (each rank issues its communication in this order), and for a ``recv`` the matching
  ``send`` (the k-th send from a to b matches the k-th receive at b from a).

Metric reductions (the printed loss) are not part of the workload.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import torch.distributed as dist

from ringtree.apps.parallel import comms

FORMAT = "ringtree-comm/1"


def start() -> comms.CommRecorder:
    rec = comms.CommRecorder()
    comms.set_recorder(rec)
    return rec


def stop() -> None:
    comms.set_recorder(None)


def link(per_rank: list[dict]) -> list[dict]:
    """Number every rank's events and add their ``deps`` (program order, send→recv)."""
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in per_rank:
        for i, ev in enumerate(r["events"]):
            ev["id"] = i
            ev["deps"] = [[r["rank"], i - 1]] if i else []
            if ev["op"] == "send":
                sends[(r["rank"], ev["peer"])].append(i)
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for r in per_rank:
        for ev in r["events"]:
            if ev["op"] == "recv":
                key = (ev["peer"], r["rank"])
                k = seen[key]
                seen[key] += 1
                if k >= len(sends[key]):
                    raise ValueError(f"rank {r['rank']} receives from {ev['peer']} more "
                                     f"often than {ev['peer']} sends to it")
                ev["deps"].append([ev["peer"], sends[key][k]])
    return per_rank


def write(path: str | os.PathLike, rec: comms.CommRecorder, trainer) -> None:
    """Gather every rank's events on rank 0 and write the workload file there."""
    g = trainer.grid
    mine = {"rank": g.rank, "coords": {"dp": g.dp_rank, "pp": g.pp_rank, "tp": g.tp_rank},
            "events": rec.events}
    everyone: list = [None] * g.world if g.rank == 0 else []
    dist.gather_object(mine, everyone if g.rank == 0 else None, dst=0)
    if g.rank != 0:
        return
    spec = trainer.spec
    doc = {"format": FORMAT, "grid": {"dp": g.dp, "tp": g.tp, "pp": g.pp}, "world": g.world,
           "model": trainer.cfg.to_dict(), "batch_size": spec.batch_size,
           "micro_batches": spec.micro_batches, "schedule": spec.schedule, "zero": spec.zero,
           "step": trainer.step - 1, "ranks": link(sorted(everyone, key=lambda r: r["rank"]))}
    with open(path, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
