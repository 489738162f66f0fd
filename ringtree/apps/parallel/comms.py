"""Every collective and p2p of the training layer goes through here.

Each call names the grid axis it runs on (``"tp"``, ``"pp"``, ``"dp"``), skips groups of
one rank (a ``None`` group, never torch's WORLD), and, while a :class:`CommRecorder` is
active, appends one event: operation, axis, the group's global ranks, bytes, peer. The
recorder is how ``ringtree train --record-comm`` writes a step's communication for the
simulator (:mod:`ringtree.apps.parallel.record`).

Every blocking call (and every wait on an async one through :func:`wait`) also adds the
time this rank's thread spent in it to its axis; :func:`take_waits` returns and resets
those sums, so a step can be split into communication waits per axis and the rest.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommRecorder:
    """Events of this rank, in issue order."""

    events: list[dict] = field(default_factory=list)
    phase: str = ""               # free-form label the schedule sets ("F3", "B0", "optim")

    def add(self, op: str, axis: str, group, nbytes: int, peer: int | None = None) -> None:
        ranks = list(range(dist.get_world_size())) if group is None else \
            dist.get_process_group_ranks(group)
        ev = {"op": op, "axis": axis, "ranks": ranks, "bytes": int(nbytes), "phase": self.phase}
        if peer is not None:
            ev["peer"] = int(peer)
        self.events.append(ev)


_RECORDER: CommRecorder | None = None
# torch 2.13 names (the older ones are deprecated there); fall back on older torch
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


AXES = ("tp", "pp", "dp", "loss")
_WAITS = dict.fromkeys(AXES, 0.0)   # seconds blocked in communication, per axis


@contextmanager
def waiting(axis: str):
    """Count the time spent inside the block as communication on ``axis``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _WAITS[axis] += time.perf_counter() - t0


def take_waits() -> dict[str, float]:
    """Seconds blocked per axis since the last call, then reset."""
    out = dict(_WAITS)
    for k in _WAITS:
        _WAITS[k] = 0.0
    return out


def wait(work, axis: str) -> None:
    """Wait for an async call's work (None: nothing to wait for), timed on ``axis``."""
    if work is not None:
        with waiting(axis):
            work.wait()


def set_recorder(rec: CommRecorder | None) -> None:
    global _RECORDER
    _RECORDER = rec


def recorder() -> CommRecorder | None:
    return _RECORDER


def set_phase(label: str) -> None:
    if _RECORDER is not None:
        _RECORDER.phase = label


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(t: torch.Tensor, group, axis: str, op=dist.ReduceOp.SUM,
               async_op: bool = False):
    """In-place all-reduce over ``group`` (nothing for a one-rank axis)."""
    if group is None:
        return None
    if _RECORDER is not None:
        _RECORDER.add("all_reduce", axis, group, _nbytes(t))
    if async_op:
        return dist.all_reduce(t, op=op, group=group, async_op=True)
    with waiting(axis):
        return dist.all_reduce(t, op=op, group=group)


def _into(fn, name: str, out: torch.Tensor, inp: torch.Tensor, group, axis: str,
          nbytes: int, async_op: bool):
    """``fn(out, inp)`` over ``group``; a one-rank axis only copies."""
    if group is None:
        out.copy_(inp)
        return None
    if _RECORDER is not None:
        _RECORDER.add(name, axis, group, nbytes)
    if async_op:
        return fn(out, inp, group=group, async_op=True)
    with waiting(axis):
        return fn(out, inp, group=group)


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group, axis: str,
                   async_op: bool = False):
    """``out`` = this rank's block of the sum of ``inp`` over ``group``."""
    return _into(_REDUCE_SCATTER, "reduce_scatter", out, inp, group, axis, _nbytes(inp),
                 async_op)


def all_gather(out: torch.Tensor, inp: torch.Tensor, group, axis: str,
               async_op: bool = False):
    """``out`` = the concatenation of every rank's ``inp`` along dim 0."""
    return _into(_ALL_GATHER, "all_gather", out, inp, group, axis, _nbytes(out), async_op)


def isend(t: torch.Tensor, peer: int, group):
    """Start sending ``t`` to global rank ``peer``; the caller keeps ``t`` alive and
    waits on the returned work before the step ends.

    Pipeline sends never block: a stage that sends an activation forward while its
    neighbour sends a gradient back (1F1B's steady state) cannot deadlock.
    """
    if _RECORDER is not None:
        _RECORDER.add("send", "pp", group, _nbytes(t), peer)
    with waiting("pp"):
        return dist.isend(t, peer, group=group)


def recv(t: torch.Tensor, peer: int, group) -> None:
    """Receive into ``t`` from global rank ``peer`` (blocking)."""
    if _RECORDER is not None:
        _RECORDER.add("recv", "pp", group, _nbytes(t), peer)
    with waiting("pp"):
        dist.recv(t, peer, group=group)
