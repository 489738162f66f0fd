"""A ringtree process group that can be rebuilt over a new world: torchft's contract.

torchft (``torchft.process_group.ProcessGroup``) drives its data-parallel replica group
through five calls besides the collectives: ``configure(store_addr, replica_id, rank,
world_size, ...)`` builds the group anew over a store (``host:port/prefix``, a fresh
prefix each quorum) — after a failure, over a smaller or larger world; ``abort()`` fails
everything pending at once; ``errored()`` returns the asynchronous error that calls for a
reconfiguration (``None`` while healthy); ``shutdown()``; ``set_timeout()``.
:class:`ReconfigurableGroup` keeps that contract on ringtree, with no torchft import: each
``configure`` aborts the current :class:`~ringtree.torch.backend.RingtreeProcessGroup`
(its peers blocked on it get an error naming this rank) and builds a new one through a
client of the TCP store at ``store_addr``, under its prefix, so nothing of an older world
can reach the new one (its communicator id differs: see docs/fault-tolerance.md).

The collectives torchft calls (``allreduce``, ``allreduce_coalesced``, ``allgather``,
``allgather_into_tensor_coalesced``, ``alltoall_base``, ``barrier``, ``broadcast``,
``broadcast_one``, ``reduce_scatter``, ``reduce_scatter_tensor_coalesced``, ``send``,
``recv``) go to the current group. To plug it into torchft, subclass both (this class
first), as ``benchmarks/torchft_loop.py`` does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ringtree.errors import CommAborted
from ringtree.torch.backend import RingtreeProcessGroup
from ringtree.torch.work import _seconds


def store_client(store_addr: str, timeout: float) -> dist.Store:
    """A client of the TCP store at ``host:port/prefix`` (torchft's address form; an
    IPv6 host may be bracketed), under that prefix."""
    addr, _, prefix = store_addr.partition("/")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"store address {store_addr!r}: expected host:port/prefix")
    store = dist.TCPStore(host.strip("[]"), int(port), is_master=False,
                          wait_for_workers=False, timeout=timedelta(seconds=timeout))
    return dist.PrefixStore(prefix, store) if prefix else store


class ReconfigurableGroup(dist.ProcessGroup):
    """torchft's reconfigurable process group on ringtree (see the module docstring)."""

    def __init__(self, timeout: timedelta | float = 60.0, *args: Any, **kwargs: Any):
        super().__init__(0, 1)
        self._timeout = float(_seconds(timeout) or 60.0)
        self._pg: RingtreeProcessGroup | None = None
        self._error: BaseException | None = None
        self.configured = 0  # how many worlds this group has had

    # ---- the contract ----------------------------------------------------------------------

    def configure(self, store_addr: str, replica_id: str | None = None, rank: int = 0,
                  world_size: int = 1, quorum_id: int | None = None,
                  group_rank: int | None = None, group_world_size: int | None = None,
                  global_ranks: list[int] | None = None) -> None:
        """Build the group over ``world_size`` ranks at ``store_addr`` (aborting the
        previous one); blocks until every rank of the new world has joined."""
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"configure: rank {rank} is outside world_size {world_size}")
        self.abort()
        store = store_client(store_addr, self._timeout)
        self._pg = RingtreeProcessGroup.from_store(store, int(rank), int(world_size),
                                                   self._timeout)
        self._error = None
        self.configured += 1

    def abort(self) -> None:
        """Fail every pending operation now and release the group (peers blocked on
        this rank get an error naming it); ``configure`` makes a new one."""
        pg, self._pg = self._pg, None
        if pg is not None:
            self._error = self._error or pg.comm.health.broken
            pg.abort()

    def shutdown(self) -> None:
        """Finish pending work (up to the timeout), then release the group."""
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()

    def errored(self) -> Exception | None:
        """The failure that calls for a reconfiguration (``None`` while healthy)."""
        err = self._pg.comm.health.broken if self._pg is not None else None
        err = err or self._error
        return err if isinstance(err, Exception) or err is None else RuntimeError(str(err))

    def set_timeout(self, timeout: timedelta | float) -> None:
        self._timeout = float(_seconds(timeout) or self._timeout)
        if self._pg is not None:
            self._pg.set_timeout(timeout)

    # ---- identity --------------------------------------------------------------------------

    @property
    def parent(self) -> RingtreeProcessGroup:
        if self._pg is None:
            raise CommAborted("ringtree reconfigurable group: not configured (call "
                              "configure after an abort)")
        return self._pg

    def size(self) -> int:
        return self.parent.size()

    def rank(self) -> int:
        return self.parent.rank()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "torchft-ringtree"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pg={self._pg!r})"

    # ---- the collectives torchft calls -----------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if isinstance(opts, dist.ReduceOp) or isinstance(opts, dist.ReduceOp.RedOpType):
            o = dist.AllreduceOptions()
            o.reduceOp = opts
            opts = o
        return self.parent.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.parent.allreduce_coalesced(tensors, opts)

    def allgather(self, output_tensors, input_tensor, opts=None):
        return self.parent.allgather(output_tensors, input_tensor, opts)

    def allgather_into_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        return self.parent.all_gather_single_coalesced(output_tensors, input_tensors, opts)

    def alltoall_base(self, output_buffer, input_buffer, output_split_sizes,
                      input_split_sizes, opts=None):
        return self.parent.all_to_all_single(output_buffer, input_buffer,
                                             output_split_sizes or None,
                                             input_split_sizes or None, opts)

    def barrier(self, opts=None):
        return self.parent.barrier(opts)

    def broadcast(self, tensor_list, opts=None):
        return self.parent.broadcast(tensor_list, opts)

    def broadcast_one(self, tensor: torch.Tensor, root: int):
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return self.broadcast([tensor], opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self.parent.reduce_scatter(output_tensors, input_tensors, opts)

    def reduce_scatter_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        return self.parent.reduce_scatter_single_coalesced(output_tensors, input_tensors,
                                                           opts)

    def send(self, tensors, dst_rank: int, tag: int = 0):
        return self.parent.send(tensors, dst_rank, tag)

    def recv(self, tensors, src_rank: int, tag: int = 0):
        return self.parent.recv(tensors, src_rank, tag)
