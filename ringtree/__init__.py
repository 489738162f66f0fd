"""ringtree: collective communication for Python processes, built the way NCCL is built.

    import numpy as np, ringtree
    comm = ringtree.init()              # reads torchrun / mpirun / srun / ringtree run env
    x = np.ones(1 << 20, np.float32)
    comm.all_reduce(x)                  # in place, bitwise identical on every rank
"""

from __future__ import annotations

from ringtree.api import CollectivesMixin
from ringtree.comm import CommCore
from ringtree.dtypes import DType
from ringtree.errors import (
    CollectiveTimeout,
    CommAborted,
    MismatchError,
    PeerError,
    RingtreeError,
)
from ringtree.ops import PremulSum, ReduceOp, UserOp, premul_sum
from ringtree.prof import dump_flight_recorder, profile
from ringtree.work import Work

__version__ = "0.1.0"

__all__ = [
    "CollectiveTimeout", "CommAborted", "Communicator", "DType", "MismatchError", "PeerError",
    "PremulSum", "ReduceOp", "RingtreeError", "UserOp", "Work", "dump_flight_recorder", "init",
    "premul_sum", "profile", "world",
]


class Communicator(CollectivesMixin, CommCore):
    """A group of ranks that run collectives together (``ncclComm_t``)."""


_WORLD: Communicator | None = None


def init(rank: int | None = None, world_size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None, *,
         token: str | None = None, timeout: float | None = None) -> Communicator:
    """Create the world communicator from arguments or the launcher's environment.

    Precedence: arguments; ``RINGTREE_*``; torchrun (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``); Open MPI; MPICH/Hydra ``PMI_*``; Slurm. Rank 0
    hosts the rendezvous store unless a launcher already does.
    """
    global _WORLD
    from ringtree.bootstrap.job import detect
    from ringtree.bootstrap.store import StoreClient, StoreServer

    env = detect(rank, world_size, master_addr, master_port, token)
    server = None
    port = env.master_port
    if env.source == "torchrun" and master_port is None:
        port += 1  # torchrun's own TCPStore owns MASTER_PORT
    if env.world_size == 1 and env.source == "single":
        server = StoreServer("127.0.0.1", 0, env.token)
        port = server.port
    elif env.rank == 0 and not env.store_external:
        server = StoreServer("0.0.0.0", port, env.token)
    wait = timeout if timeout is not None else 300.0
    store = StoreClient(env.master_addr if server is None else "127.0.0.1", port, env.token,
                        timeout=wait)
    import hashlib

    secret = hashlib.sha256(env.token.encode()).digest()
    comm = Communicator(rank=env.rank, size=env.world_size, store=store, prefix="rt/world",
                        secret=secret, master_addr=env.master_addr, timeout=timeout,
                        server=server, local_rank=env.local_rank, owns_store=True)
    _WORLD = comm
    return comm


def world() -> Communicator:
    """The communicator made by the last :func:`init`."""
    if _WORLD is None:
        raise RuntimeError("ringtree.init() has not been called")
    return _WORLD
