"""ringtree: collective communication for Python processes, built the way NCCL is built.

    import numpy as np, ringtree
    comm = ringtree.init()              # reads torchrun / mpirun / srun / ringtree run env
    x = np.ones(1 << 20, np.float32)
    comm.all_reduce(x)                  # in place, bitwise identical on every rank
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ringtree.communicator import Communicator
from ringtree.dtypes import DType
from ringtree.errors import (
    CollectiveTimeout,
    CommAborted,
    CommRevoked,
    MismatchError,
    PeerError,
    RecoveryError,
    RendezvousError,
    RingtreeError,
)
from ringtree.ops import PremulSum, ReduceOp, UserOp, premul_sum
from ringtree.prof import dump_flight_recorder, profile
from ringtree.work import Work

if TYPE_CHECKING:
    from ringtree.bootstrap.job import JobEnv
    from ringtree.bootstrap.store import StoreClient, StoreServer

__version__ = "0.1.0"

__all__ = [
    "CollectiveTimeout", "CommAborted", "CommRevoked", "Communicator", "DType", "MismatchError",
    "PeerError", "PremulSum", "RecoveryError", "ReduceOp", "RingtreeError", "UserOp", "Work", "dump_flight_recorder", "init",
    "premul_sum", "profile", "world",
]


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
    import hashlib

    from ringtree.bootstrap.job import detect
    from ringtree.bootstrap.jobtoken import remove_host_token
    from ringtree.settings import as_timeout, current

    if _WORLD is not None and not _WORLD._closed:
        raise RuntimeError(
            f"ringtree.init() was already called in this process (rank {_WORLD.rank} of "
            f"{_WORLD.size}); use ringtree.world() for that communicator, comm.split() or "
            "comm.new_group() for another one, or close it before calling init() again")
    if timeout is not None:
        timeout = as_timeout(timeout, "init(timeout=...)")
    settings = current()
    wait = timeout if timeout is not None else settings.timeout
    init_wait = settings.init_timeout or wait
    env = detect(rank, world_size, master_addr, master_port, token)
    server, connect, port, tok, token_file = _serve_store(env, master_port, token)
    store, tok = _connect_store(env, connect, port, tok, token_file, wait, init_wait)
    secret = hashlib.sha256(tok.encode()).digest()
    try:
        if _joining(env):  # a replacement: take the seat the survivors offer
            comm = _join(env, store, secret, timeout, init_wait)
        else:
            comm = Communicator(rank=env.rank, size=env.world_size, store=store,
                                prefix="rt/world", secret=secret, master_addr=env.master_addr,
                                timeout=timeout, server=server, local_rank=env.local_rank,
                                owns_store=True)
    except BaseException as e:
        from ringtree.errors import CommAborted, RendezvousError

        if server is not None and isinstance(e, (RendezvousError, CommAborted)):
            time.sleep(2.5)  # the others poll the abort line once a second: let them read it
        store.close()
        if server is not None:
            server.close()
        raise
    finally:
        if env.rank == 0:
            remove_host_token(token_file)  # every rank has connected (or it failed)
    if not env.store_external and env.world_size > 1:
        comm.store_host_rank = 0
    if server is not None and env.world_size > 1:
        import atexit

        atexit.register(_linger, comm, server)
    _WORLD = comm
    return comm


def _joining(env: JobEnv) -> bool:
    from ringtree.bootstrap import environ

    return environ.get("RINGTREE_JOIN") == "1" and env.world_size > 1


def _join(env: JobEnv, store, secret: bytes, timeout, init_wait: float) -> Communicator:
    """``RINGTREE_JOIN=1`` (``ringtree run --max-restarts`` restarting a dead rank): join
    the running job in that rank's place (:mod:`ringtree.resilience.replace`)."""
    from ringtree.resilience.replace import join_seat
    from ringtree.resilience.state import state

    if not env.store_external:
        raise RendezvousError("RINGTREE_JOIN=1 needs the launcher's store (ringtree run): "
                              "the store of a job whose rank 0 hosts it may be gone")
    prefix, rank, size, world = join_seat(store, "rt/world", env.rank, init_wait)
    comm = Communicator(rank=rank, size=size, store=store, prefix=prefix, secret=secret,
                        master_addr=env.master_addr, timeout=timeout, world_ranks=world,
                        local_rank=env.local_rank)
    state(comm).root = "rt/world"
    return comm


def _serve_store(env: JobEnv, master_port: int | None, token: str | None
                 ) -> tuple[StoreServer | None, str, int, str, str | None]:
    """Where the world's rendezvous store is: (the server this process runs or None, the
    address and port to connect to, the token, the host token file or None)."""
    from ringtree.bootstrap.job import job_id
    from ringtree.bootstrap.jobtoken import plan_store, remove_host_token
    from ringtree.bootstrap.store import StoreError, StoreServer

    port = env.master_port
    if env.source == "torchrun" and master_port is None:
        port += 1  # torchrun's own TCPStore owns MASTER_PORT
    if env.world_size == 1 and env.source == "single":
        server = StoreServer("127.0.0.1", 0, env.token)
        return server, "127.0.0.1", server.port, env.token, None
    if env.store_external:  # the launcher hosts the store and handed out its token
        return None, env.master_addr, port, env.token, None
    plan = plan_store(rank=env.rank, world_size=env.world_size,
                      local_world_size=env.local_world_size, local_known=env.local_known,
                      master_addr=env.master_addr, port=port, token=token, job=job_id())
    if env.rank != 0:
        return None, plan.connect, port, plan.token, plan.token_file
    try:
        server = StoreServer(plan.bind, port, plan.token)
    except StoreError as e:
        remove_host_token(plan.token_file)
        raise StoreError(f"{e} (is another process of this job also rank 0, or "
                         "another job using this port?)") from None
    connect = "127.0.0.1" if plan.bind in ("0.0.0.0", "127.0.0.1") else plan.bind
    return server, connect, port, plan.token, plan.token_file


def _connect_store(env: JobEnv, connect: str, port: int, tok: str, token_file: str | None,
                   wait: float, init_wait: float) -> tuple[StoreClient, str]:
    """(a client of the store, the token it was accepted with), retried until
    ``init_wait`` while a rank other than 0 reads a host token file that an earlier job
    may have left (rank 0 rewrites it)."""
    from ringtree.bootstrap.jobtoken import read_host_token
    from ringtree.bootstrap.store import StoreAuthError, StoreClient

    deadline = time.monotonic() + init_wait
    while True:
        if token_file is not None and env.rank != 0:
            tok = read_host_token(token_file, max(1e-3, deadline - time.monotonic()), tok)
        try:
            return StoreClient(connect, port, tok, timeout=wait,
                               connect_timeout=max(1e-3, deadline - time.monotonic())), tok
        except StoreAuthError:
            if token_file is None or env.rank == 0 or time.monotonic() >= deadline:
                raise  # else: the file we read was an earlier job's; read it again


def _linger(comm: Communicator, server) -> None:
    """At exit of a rank that serves the store without having closed its communicator
    (it raised, say): keep serving until every rank has left its last status, so the
    others' doctor reports and abort lines still work (``RINGTREE_DOCTOR_WAIT`` + 1 s)."""
    import json

    from ringtree.prof.watch import CLOSED_GEN
    from ringtree.settings import current

    if comm._closed or server._stopping:
        return
    deadline = time.monotonic() + current().doctor_wait + 1.0
    keys = [f"{comm.prefix}/doctor/status/{r}" for r in range(comm.size) if r != comm.rank]
    while time.monotonic() < deadline:
        try:
            docs = [server.peek(k) for k in keys]
            if all(d and json.loads(d).get("gen", 0) >= CLOSED_GEN for d in docs):
                return
        except (ValueError, TypeError):
            pass
        time.sleep(0.05)


def world() -> Communicator:
    """The communicator made by the last :func:`init`."""
    if _WORLD is None:
        raise RuntimeError("ringtree.init() has not been called")
    return _WORLD
