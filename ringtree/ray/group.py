"""``RingtreeGroup``: a ``ray.util.collective`` ``BaseGroup`` over a ringtree communicator.

Rendezvous goes through Ray's internal key-value store (the GCS), as Ray's own gloo group
does: rank 0 of the group starts a ringtree store server on its node's address with a
fresh random token and publishes ``address:port:token`` under a key named for the group;
the other ranks read it, connect, and everyone builds a
:class:`ringtree.Communicator` (which picks shared memory or TCP per peer). Rank 0 deletes
the key once every rank has connected. A group name reused after a crash may find an
older, dead address under the key: connecting is retried, re-reading the key, until the
group's timeout.

Tensors: ``ray.util.collective`` hands every method a one-element list. NumPy arrays are
used in place, zero copy; torch CPU tensors as well (through their NumPy view); a
non-contiguous array is staged in a contiguous copy and copied back. Inputs are never
modified except where the collective writes its result in place (all-reduce, broadcast,
the root of reduce, receive). ``reducescatter`` is ringtree's reduce-scatter: each rank
sends and receives (n-1)/n of the data once, not n all-reduces of every block.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp as RayOp

import ringtree
from ringtree.dtypes import parse_dtype
from ringtree.ops import ReduceOp

BACKEND = "RINGTREE"
DEFAULT_TIMEOUT_S = 300.0
_OPS = {RayOp.SUM: ReduceOp.SUM, RayOp.PRODUCT: ReduceOp.PROD, RayOp.MIN: ReduceOp.MIN,
        RayOp.MAX: ReduceOp.MAX}


def _kv_key(group_name: str) -> str:
    return f"ringtree_collective_{group_name}"


def _one(tensors: Any, what: str) -> Any:
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            raise ValueError(f"ringtree {what}: expected one tensor per process, got "
                             f"{len(tensors)}")
        return tensors[0]
    return tensors


def _stage(t: Any, writes: bool) -> tuple[Any, Callable[[], None] | None]:
    """``t`` as ringtree takes it (contiguous; NumPy or torch CPU), and the copy back."""
    if isinstance(t, np.ndarray):
        if t.flags.c_contiguous:
            return t, None
        c = np.ascontiguousarray(t)
        return c, (lambda: np.copyto(t, c)) if writes else None
    if type(t).__module__.startswith("torch"):
        if t.device.type != "cpu":
            raise ValueError(f"ringtree's Ray backend moves CPU data; got a tensor on "
                             f"{t.device}")
        if t.is_contiguous():
            return t.detach(), None
        c = t.detach().contiguous()
        return c, (lambda: t.detach().copy_(c)) if writes else None
    raise TypeError(f"ringtree's Ray backend takes numpy.ndarray or torch CPU tensors, got "
                    f"{type(t).__name__}")


def _bytes(x: Any) -> Any:
    """A contiguous ``x`` as bytes when ringtree does not know its dtype (data movement
    moves bytes; only reductions need to know the type)."""
    try:
        parse_dtype(x.dtype)
        return x
    except TypeError:
        pass
    if isinstance(x, np.ndarray):
        return x.reshape(-1).view(np.uint8)
    import torch

    flat = x.reshape(-1)
    return torch.view_as_real(flat).view(torch.uint8) if flat.is_complex() else flat.view(
        torch.uint8)


def _op(options: Any) -> ReduceOp:
    op = getattr(options, "reduceOp", RayOp.SUM)
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError(f"ringtree: unsupported reduce op {op!r}") from None


def _timeout(options: Any, default: float) -> float:
    t = getattr(options, "timeout_ms", None)
    ms = t.total_seconds() * 1000 if hasattr(t, "total_seconds") else t
    return default if ms is None or ms <= 0 else ms / 1000.0


def _rendezvous(world_size: int, rank: int, group_name: str,
                timeout: float) -> ringtree.Communicator:
    import ray
    import ray.experimental.internal_kv as kv

    from ringtree.bootstrap.store import StoreClient, StoreError, StoreServer

    key = _kv_key(group_name)
    server = None
    if rank == 0:
        addr = ray.util.get_node_ip_address()
        token = secrets.token_hex(16)
        server = StoreServer(addr, 0, token)
        kv._internal_kv_put(key, f"{addr}|{server.port}|{token}", overwrite=True)
    deadline = time.monotonic() + timeout
    store, delay, last = None, 0.001, None
    while store is None:
        raw = kv._internal_kv_get(key)
        if raw is not None and raw != last:
            addr, port, token = raw.decode().split("|")
            try:
                store = StoreClient(addr, int(port), token, timeout=timeout,
                                    connect_timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                break
            except (StoreError, OSError):
                last = raw  # an earlier group's address: wait for this group's
        if time.monotonic() > deadline:
            if server is not None:
                server.close()
            raise TimeoutError(f"ringtree Ray group {group_name!r}: rank {rank} found no "
                               f"rendezvous from rank 0 within {timeout:g} s (key {key!r})")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    try:
        comm = ringtree.Communicator(
            rank=rank, size=world_size, store=store, prefix=f"ray/{group_name}",
            secret=hashlib.sha256(token.encode()).digest(), master_addr=addr,
            timeout=timeout, server=server, owns_store=True)
        comm.barrier()  # every rank has read the key
    except BaseException:
        store.close()
        if server is not None:
            server.close()
        raise
    if rank == 0:
        kv._internal_kv_del(key)
    return comm


class RingtreeGroup(BaseGroup):
    """One process's membership of a Ray collective group, run by ringtree."""

    def __init__(self, world_size: int, rank: int, group_name: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(world_size, rank, group_name)
        self.timeout = float(timeout_s)
        self.comm = _rendezvous(world_size, rank, group_name, self.timeout)

    @classmethod
    def backend(cls) -> str:
        return BACKEND

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    def destroy_group(self) -> None:
        self.comm.close()

    def _run(self, tensor: Any, writes: bool, fn: Callable[[Any], None],
             moves: bool = False) -> None:
        obj, back = _stage(_one(tensor, "collective"), writes)
        fn(_bytes(obj) if moves else obj)
        if back is not None:
            back()

    # ---- collectives -----------------------------------------------------------------

    def allreduce(self, tensor, allreduce_options=None) -> None:
        op, t = _op(allreduce_options), _timeout(allreduce_options, self.timeout)
        self._run(tensor, True, lambda x: self.comm.all_reduce(x, op, timeout=t))

    def barrier(self, barrier_options=None) -> None:
        self.comm.barrier(timeout=_timeout(barrier_options, self.timeout))

    def reduce(self, tensor, reduce_options=None) -> None:
        op, t = _op(reduce_options), _timeout(reduce_options, self.timeout)
        root = int(getattr(reduce_options, "root_rank", 0))
        self._run(tensor, self.rank == root,
                  lambda x: self.comm.reduce(x, root, op, timeout=t))

    def broadcast(self, tensor, broadcast_options=None) -> None:
        t = _timeout(broadcast_options, self.timeout)
        root = int(getattr(broadcast_options, "root_rank", 0))
        self._run(tensor, self.rank != root,
                  lambda x: self.comm.broadcast(x, root, timeout=t), moves=True)

    def allgather(self, tensor_list, tensor, allgather_options=None) -> None:
        outs = _one(tensor_list, "allgather")
        if len(outs) != self.world_size:
            raise ValueError(f"ringtree allgather: {len(outs)} output tensors for "
                             f"{self.world_size} ranks")
        inp, _ = _stage(_one(tensor, "allgather"), False)
        staged = [_stage(o, True) for o in outs]
        self.comm.all_gather(_bytes(inp), out=[_bytes(o) for o, _ in staged],
                             timeout=_timeout(allgather_options, self.timeout))
        for _, back in staged:
            if back is not None:
                back()

    def reducescatter(self, tensor, tensor_list, reducescatter_options=None) -> None:
        ins = _one(tensor_list, "reducescatter")
        if len(ins) != self.world_size:
            raise ValueError(f"ringtree reducescatter: {len(ins)} input tensors for "
                             f"{self.world_size} ranks")
        op, t = _op(reducescatter_options), _timeout(reducescatter_options, self.timeout)
        staged = [_stage(x, False)[0] for x in ins]
        self._run(tensor, True,
                  lambda out: self.comm.reduce_scatter(staged, op, out=out, timeout=t))

    # ---- point to point --------------------------------------------------------------

    def send(self, tensor, send_options) -> None:
        dst = int(send_options.dst_rank)
        self._run(tensor, False, lambda x: self.comm.send(x, dst, timeout=self.timeout),
                  moves=True)

    def recv(self, tensor, recv_options) -> None:
        src = int(recv_options.src_rank)
        self._run(tensor, True, lambda x: self.comm.recv(x, src, timeout=self.timeout),
                  moves=True)


def register() -> None:
    """Register backend ``"RINGTREE"`` with ``ray.util.collective`` in this process
    (idempotent). Ray needs it on the driver and in every actor; importing
    :mod:`ringtree.ray` does it."""
    from ray.util.collective.backend_registry import (
        _global_registry,
        register_collective_backend,
    )

    if not _global_registry.is_registered(BACKEND):
        register_collective_backend(BACKEND, RingtreeGroup)
