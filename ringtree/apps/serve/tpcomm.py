"""The decode engine's communication: two calls, three implementations.

A tensor-parallel group needs only (a) an in-place sum all-reduce of a float tensor —
twice per layer, after the attention output projection and after the MLP down
projection (Megatron-LM's ``g`` operator, Shoeybi et al. 2019) — and (b) the step plan
broadcast from the group's first rank. :class:`TPComm` is that interface:

- :class:`RingtreeTP` over a ringtree :class:`~ringtree.Communicator` (the default);
- :class:`GlooTP` over a ``torch.distributed`` gloo process group (the comparison);
- :class:`SoloTP` for tp = 1, where both calls are the identity.

The engine computes each row-parallel output into :meth:`TPComm.buffer` (``torch.mm``
with ``out=``), one tensor per row count reused by every layer, so :class:`RingtreeTP`
passes the communicator the same NumPy view of it every call: no allocation and no
``Tensor.numpy`` per all-reduce, and the communicator's hot path (one C call for the
shape it saw last) takes every all-reduce of a decode step.

Plans travel as int64 in one fixed-size broadcast of :data:`PLAN_WORDS` words
(``[length, words...]``); a longer plan sends its remainder in a second broadcast.
"""

from __future__ import annotations

import datetime
import socket
from typing import Protocol

import numpy as np
import torch

from ringtree.bootstrap import environ

PLAN_WORDS = 512
BUFFERS = 8     # row counts whose output buffer (and NumPy view) a group keeps


class TPComm(Protocol):
    rank: int
    size: int
    name: str

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum ``t`` in place over the group; every rank gets the same bits."""

    def broadcast_ints(self, words: list[int] | None) -> list[int]:
        """Group rank 0's ``words`` on every rank (others pass None)."""

    def buffer(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """A reusable ``(rows, cols)`` tensor for a row-parallel output."""


class Buffers:
    """:meth:`TPComm.buffer`: one tensor per shape, the last :data:`BUFFERS` kept, each
    with its NumPy view (``_views``, by data pointer) for the implementations that
    hand NumPy to their library."""

    _bufs: dict | None = None
    _views: dict | None = None

    def buffer(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        if self._bufs is None:
            self._bufs, self._views = {}, {}
        key = (rows, cols, dtype)
        t = self._bufs.get(key)
        if t is None:
            if len(self._bufs) >= BUFFERS:
                self._bufs.clear()
                self._views.clear()
            t = self._bufs[key] = torch.empty(rows, cols, dtype=dtype)
            self._views[t.data_ptr()] = t.numpy()
        return t

    def _numpy(self, t: torch.Tensor) -> np.ndarray:
        """``t``'s NumPy view: the kept one when ``t`` is a buffer of this group (a kept
        view holds its buffer's memory, so an equal data pointer is the same tensor)."""
        views = self._views
        x = views.get(t.data_ptr()) if views is not None else None
        if x is None or x.size != t.numel() or not t.is_contiguous():
            return t.numpy()
        return x


def _pack(words: list[int] | None, rank: int) -> np.ndarray:
    head = np.zeros(PLAN_WORDS, np.int64)
    if rank == 0:
        assert words is not None
        n = min(len(words), PLAN_WORDS - 1)
        head[0] = len(words)
        head[1:1 + n] = words[:n]
    return head


class _BroadcastInts:
    """``broadcast_ints`` from a raw ``_bcast(array)`` (in place, from group rank 0)."""

    rank: int

    def _bcast(self, a: np.ndarray) -> None:
        raise NotImplementedError

    def broadcast_ints(self, words: list[int] | None) -> list[int]:
        head = _pack(words, self.rank)
        self._bcast(head)
        total = int(head[0])
        if total <= PLAN_WORDS - 1:
            return head[1:1 + total].tolist()
        rest = np.zeros(total - (PLAN_WORDS - 1), np.int64)
        if self.rank == 0:
            assert words is not None
            rest[:] = words[PLAN_WORDS - 1:]
        self._bcast(rest)
        return head[1:].tolist() + rest.tolist()


class SoloTP(Buffers):
    """tp = 1: nothing to reduce or share."""

    rank, size, name = 0, 1, "solo"

    def all_reduce(self, t: torch.Tensor) -> None:
        return None

    def broadcast_ints(self, words: list[int] | None) -> list[int]:
        assert words is not None
        return list(words)


class RingtreeTP(Buffers, _BroadcastInts):
    """A ringtree communicator (its small all-reduces take the low-latency path)."""

    name = "ringtree"

    def __init__(self, comm) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def all_reduce(self, t: torch.Tensor) -> None:
        self.comm.all_reduce(self._numpy(t))    # NumPy: the communicator's hot path

    def _bcast(self, a: np.ndarray) -> None:
        self.comm.broadcast(a, root=0)


class GlooTP(Buffers, _BroadcastInts):
    """A gloo process group over the same ranks (``torch.distributed``)."""

    name = "gloo"

    def __init__(self, group, root: int, rank: int, size: int) -> None:
        self.group, self.root, self.rank, self.size = group, root, rank, size

    def all_reduce(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.all_reduce(t, group=self.group)

    def _bcast(self, a: np.ndarray) -> None:
        import torch.distributed as dist

        dist.broadcast(torch.from_numpy(a), src=self.root, group=self.group)


def gloo_groups(world, tp: int, timeout: float = 300.0) -> GlooTP:
    """Initialise gloo over ``world``'s ranks (port from ``MASTER_PORT`` or chosen by
    rank 0) and return this rank's tp group (ranks ``g*tp .. g*tp+tp-1``)."""
    import torch.distributed as dist

    port = environ.get("MASTER_PORT")
    addr = environ.get("MASTER_ADDR", "127.0.0.1")
    if port is None:
        if world.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = str(s.getsockname()[1])
        port = str(world.broadcast_object(port, root=0))
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}",
                                rank=world.rank, world_size=world.size,
                                timeout=datetime.timedelta(seconds=timeout))
    mine = None
    for g in range(world.size // tp):
        ranks = list(range(g * tp, (g + 1) * tp))
        pg = dist.new_group(ranks)
        if world.rank in ranks:
            mine = GlooTP(pg, ranks[0], world.rank - ranks[0], tp)
    assert mine is not None
    return mine
