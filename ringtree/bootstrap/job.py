"""Who am I in the job: rank, world size and rendezvous address from the launcher's env.

ringtree reads the conventions users already have (DESIGN.md §4), first match wins:

==========  ==========================  =======================  ==================================
source      rank / world size           local rank / size        notes
==========  ==========================  =======================  ==================================
args        ``detect(rank, world_size)``  —                       explicit arguments
ringtree    ``RINGTREE_RANK`` /         ``RINGTREE_LOCAL_RANK``  set by ``ringtree run``
            ``RINGTREE_WORLD_SIZE``     / ``_LOCAL_WORLD_SIZE``
torchrun    ``RANK`` / ``WORLD_SIZE``   ``LOCAL_RANK`` /         torch/distributed/run.py
                                        ``LOCAL_WORLD_SIZE``
openmpi     ``OMPI_COMM_WORLD_RANK`` /  ``OMPI_COMM_WORLD_``     Open MPI ``mpirun``
            ``OMPI_COMM_WORLD_SIZE``    ``LOCAL_RANK/_SIZE``
pmi         ``PMI_RANK`` / ``PMI_SIZE``  ``MPI_LOCALRANKID`` /   MPICH / Intel MPI (Hydra); Cray
                                        ``MPI_LOCALNRANKS``      PALS' ``PMI_LOCAL_RANK/_SIZE``
slurm       ``SLURM_PROCID`` /          ``SLURM_LOCALID`` /      ``srun``; local size from
            ``SLURM_NTASKS``            tasks-per-node           ``SLURM_NTASKS_PER_NODE`` or the
                                                                 compressed ``SLURM_TASKS_PER_NODE``
single      rank 0 of 1                 0 / 1                    nothing set
==========  ==========================  =======================  ==================================

Slurm pitfall: inside an ``sbatch`` script but outside ``srun`` the batch step sees
``SLURM_PROCID=0`` with the job's ``SLURM_NTASKS``; start ranks with ``srun``.

When a launcher gives no local rank/size, ``local_rank = rank`` and ``local_world_size =
world_size`` (one host is assumed). These are hints only: co-location of ranks is decided by
exchanging :func:`host_identity` through the store, never from these numbers.
"""

from __future__ import annotations

import hashlib
import operator
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from ringtree.bootstrap.environ import view
from ringtree.bootstrap.slurm import expand_nodelist, parse_tasks_per_node

__all__ = [
    "DEFAULT_MASTER_PORT",
    "JobEnv",
    "deterministic_port",
    "detect",
    "host_identity",
    "job_id",
    "launched",
    "ranks",
]

DEFAULT_MASTER_PORT = 29500
_PORT_RANGE = (20000, 60000)
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class JobEnv:
    """This process's place in the job and how to reach the job's store."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    token: str
    source: str  # "args", "ringtree", "torchrun", "openmpi", "pmi", "slurm" or "single"
    store_external: bool = False  # a launcher hosts the store: rank 0 must not start one
    local_known: bool = False  # the launcher said how many ranks share this host


@dataclass(frozen=True)
class _Ids:
    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    names: tuple[str, str, str, str]  # where each number came from, for error messages


def detect(
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobEnv:
    """Work out this process's :class:`JobEnv` from arguments and the environment.

    Precedence of rank/world size: arguments, ``RINGTREE_*``, torchrun, Open MPI, MPICH/Hydra
    PMI, Slurm, else a single process. Master address: ``master_addr``,
    ``RINGTREE_MASTER_ADDR``, ``MASTER_ADDR``, the first host of the Slurm step/job nodelist,
    ``127.0.0.1``. Master port: ``master_port``, ``RINGTREE_MASTER_PORT``, ``MASTER_PORT``,
    for mpirun/PMI/Slurm a port in 20000..60000 hashed from the job id (so the ranks of a
    single-node job agree without any launcher), else 29500.

    Token: ``token``, ``RINGTREE_TOKEN``, else for a single process a random one, else one
    *derived* from the job id, master address and port. A derived token is the same on every
    rank without configuration, but anyone who can see the job id (``squeue``, ``ps e``) can
    compute it: it keeps separate jobs from talking to each other's stores by accident, it is
    not a secret. Export a random ``RINGTREE_TOKEN`` (``ringtree run`` does) to authenticate.

    Invalid values raise ValueError naming the variable and its value.
    """
    env: Mapping[str, str] = view() if environ is None else environ
    ids = _identify(rank, world_size, env)

    port = _master_port(master_port, env, ids.source)
    addr_name, addr = _master_addr(master_addr, env, ids.source)
    if addr is None:
        if ids.local_world_size < ids.world_size:
            raise ValueError(
                f"the {ids.source} job spans several hosts ({ids.names[3]}={ids.local_world_size}"
                f" < {ids.names[1]}={ids.world_size}) but no master address is set; export "
                "RINGTREE_MASTER_ADDR (or MASTER_ADDR) as rank 0's host name or IP on every rank"
            )
        addr = "127.0.0.1"
    elif not addr.strip():
        raise ValueError(f"{addr_name}={addr!r} is empty")

    if token is None:
        token = _get(env, "RINGTREE_TOKEN")
    if token is None:
        if ids.world_size == 1:
            token = secrets.token_hex(16)
        else:
            seed = f"ringtree-token|{job_id(env) or ''}|{addr}|{port}"
            token = hashlib.sha256(seed.encode()).hexdigest()[:32]

    external = (_get(env, "RINGTREE_STORE_EXTERNAL") or "").strip().lower() in _TRUE
    return JobEnv(
        rank=ids.rank,
        world_size=ids.world_size,
        local_rank=ids.local_rank,
        local_world_size=ids.local_world_size,
        master_addr=addr,
        master_port=port,
        token=token,
        source=ids.source,
        store_external=external,
        local_known=ids.names[3] != ids.names[1],
    )


def ranks(environ: Mapping[str, str] | None = None) -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from the launcher's variables, as
    :func:`detect` finds them, without an address, port or token."""
    ids = _identify(None, None, view() if environ is None else environ)
    return ids.rank, ids.world_size, ids.local_rank, ids.local_world_size


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """Did a launcher (ringtree run, torchrun, mpirun, srun) start this process?"""
    return _identify(None, None, view() if environ is None else environ).source != "single"


def _identify(rank: int | None, world_size: int | None, env: Mapping[str, str]) -> _Ids:
    ids = (
        _from_args(rank, world_size)
        or _from_ringtree(env)
        or _from_conventions(env)
        or _from_slurm(env)
        or _Ids("single", 0, 1, 0, 1, ("rank", "world_size", "local_rank", "local_world_size"))
    )
    _validate(ids)
    return ids


def host_identity(environ: Mapping[str, str] | None = None) -> str:
    """``"hostname|boot_id"``, equal for exactly the processes sharing one OS instance.

    The boot id (``/proc/sys/kernel/random/boot_id``) tells apart containers or restarted
    machines that reuse a host name (the gloo #458 approach). ``RINGTREE_HOST_ID`` overrides
    it, which lets tests fake several hosts on one machine.
    """
    env = view() if environ is None else environ
    override = _get(env, "RINGTREE_HOST_ID")
    if override is not None:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = ""
    return f"{socket.gethostname()}|{boot_id}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def crowded(ranks_on_host: int) -> bool:
    """Do a host's ranks outnumber the cores they may use? The one definition: shm's
    spinning and the tuner's cost model back off when it holds."""
    return ranks_on_host > usable_cores()


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """An id shared by every rank of this job (and by no other job), if a launcher set one.

    Tried in order: ``OMPI_MCA_ess_base_jobid`` (Open MPI), ``PMIX_NAMESPACE`` (PMIx),
    ``PMI_JOBID`` / ``PMI_KVSNAME`` (MPICH Hydra, Cray PMI), ``SLURM_JOB_ID`` plus
    ``SLURM_STEP_ID`` (Slurm; the step makes two ``srun`` of one allocation differ),
    ``TORCHELASTIC_RUN_ID`` (torchrun).
    """
    env = view() if environ is None else environ
    for name in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID", "PMI_KVSNAME"):
        value = _get(env, name)
        if value is not None:
            return f"{name}={value}"
    slurm_job = _get(env, "SLURM_JOB_ID") or _get(env, "SLURM_JOBID")
    if slurm_job is not None:
        step = _get(env, "SLURM_STEP_ID") or _get(env, "SLURM_STEPID") or ""
        return f"SLURM_JOB_ID={slurm_job}.{step}"
    run_id = _get(env, "TORCHELASTIC_RUN_ID")
    return None if run_id is None else f"TORCHELASTIC_RUN_ID={run_id}"


def deterministic_port(job: str) -> int:
    """A port in 20000..60000 that every rank computes identically from the job id."""
    digest = hashlib.sha256(b"ringtree-port|" + job.encode()).digest()
    lo, hi = _PORT_RANGE
    return lo + int.from_bytes(digest[:8], "big") % (hi - lo + 1)


# ---------------------------------------------------------------------------- sources


def _from_args(rank: int | None, world_size: int | None) -> _Ids | None:
    if rank is None and world_size is None:
        return None
    if rank is None or world_size is None:
        raise ValueError(
            f"pass rank and world_size together (got rank={rank!r}, world_size={world_size!r})"
        )
    r, w = _as_int("rank", rank), _as_int("world_size", world_size)
    return _Ids("args", r, w, r, w, ("rank", "world_size", "rank", "world_size"))


def _from_ringtree(env: Mapping[str, str]) -> _Ids | None:
    has_rank, has_world = _get(env, "RINGTREE_RANK"), _get(env, "RINGTREE_WORLD_SIZE")
    if (has_rank is None) != (has_world is None):
        missing = "RINGTREE_WORLD_SIZE" if has_world is None else "RINGTREE_RANK"
        present = "RINGTREE_RANK" if has_world is None else "RINGTREE_WORLD_SIZE"
        raise ValueError(f"{present} is set but {missing} is not; set both (or neither)")
    return _convention(env, "ringtree", ("RINGTREE_RANK", "RINGTREE_WORLD_SIZE"),
                       ("RINGTREE_LOCAL_RANK",), ("RINGTREE_LOCAL_WORLD_SIZE",))


# Launchers that name rank, size, local rank and local size by plain variables, in the
# order they are tried: (source, (rank, world size), local rank names, local size names).
_CONVENTIONS = (
    ("torchrun", ("RANK", "WORLD_SIZE"), ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",)),
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
     ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("pmi", ("PMI_RANK", "PMI_SIZE"), ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
     ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
)


def _from_conventions(env: Mapping[str, str]) -> _Ids | None:
    for source, world, local_rank, local_world in _CONVENTIONS:
        ids = _convention(env, source, world, local_rank, local_world)
        if ids is not None:
            return ids
    return None


def _from_slurm(env: Mapping[str, str]) -> _Ids | None:
    world_name = "SLURM_NTASKS" if _get(env, "SLURM_NTASKS") is not None else "SLURM_NPROCS"
    ids = _convention(env, "slurm", ("SLURM_PROCID", world_name), ("SLURM_LOCALID",), ())
    if ids is None:
        return None
    local_world, local_world_name = ids.world_size, ids.names[1]
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        spec = _get(env, name)
        if spec is None:
            continue
        try:
            counts = parse_tasks_per_node(spec)
        except ValueError:
            raise ValueError(f"{name}={spec!r} is not a Slurm tasks-per-node list") from None
        node = _int_var(env, "SLURM_NODEID")
        local_world = counts[node] if node is not None and 0 <= node < len(counts) else counts[0]
        local_world_name = name
        break
    return _Ids(
        "slurm",
        ids.rank,
        ids.world_size,
        ids.local_rank if _get(env, "SLURM_LOCALID") is not None else ids.rank % local_world,
        local_world,
        (ids.names[0], ids.names[1], ids.names[2], local_world_name),
    )


def _convention(
    env: Mapping[str, str],
    source: str,
    global_names: tuple[str, str],
    local_rank_names: tuple[str, ...],
    local_size_names: tuple[str, ...],
) -> _Ids | None:
    rank_name, world_name = global_names
    rank, world = _int_var(env, rank_name), _int_var(env, world_name)
    if rank is None or world is None:
        return None
    local_rank, lr_name = _first_int(env, local_rank_names, rank, rank_name)
    local_world, lw_name = _first_int(env, local_size_names, world, world_name)
    names = (rank_name, world_name, lr_name, lw_name)
    return _Ids(source, rank, world, local_rank, local_world, names)


def _first_int(
    env: Mapping[str, str], names: tuple[str, ...], default: int, default_name: str
) -> tuple[int, str]:
    for name in names:
        value = _int_var(env, name)
        if value is not None:
            return value, name
    return default, default_name


def _validate(ids: _Ids) -> None:
    rank_n, world_n, lrank_n, lworld_n = ids.names
    if ids.world_size < 1:
        raise ValueError(f"{world_n}={ids.world_size} must be >= 1")
    if not 0 <= ids.rank < ids.world_size:
        raise ValueError(f"{rank_n}={ids.rank} is outside [0, {world_n}={ids.world_size})")
    if ids.local_world_size < 1:
        raise ValueError(f"{lworld_n}={ids.local_world_size} must be >= 1")
    if not 0 <= ids.local_rank < ids.local_world_size:
        raise ValueError(
            f"{lrank_n}={ids.local_rank} is outside [0, {lworld_n}={ids.local_world_size})"
        )


# ---------------------------------------------------------------------------- address / port


def _master_addr(
    explicit: str | None, env: Mapping[str, str], source: str
) -> tuple[str, str | None]:
    if explicit is not None:
        return "master_addr", explicit
    for name in ("RINGTREE_MASTER_ADDR", "MASTER_ADDR"):
        value = _get(env, name)
        if value is not None:
            return name, value
    if source == "slurm":
        for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            value = _get(env, name)
            if value is not None:
                try:
                    hosts = expand_nodelist(value)
                except ValueError as e:
                    raise ValueError(f"{name}={value!r}: {e}") from None
                if hosts:
                    return name, hosts[0]
    return "", None


def _master_port(explicit: int | None, env: Mapping[str, str], source: str) -> int:
    if explicit is not None:
        name, port = "master_port", _as_int("master_port", explicit)
    else:
        name, port = "", None
        for var in ("RINGTREE_MASTER_PORT", "MASTER_PORT"):
            port = _int_var(env, var)
            if port is not None:
                name = var
                break
        if port is None:
            job = job_id(env) if source in ("openmpi", "pmi", "slurm") else None
            return deterministic_port(job) if job is not None else DEFAULT_MASTER_PORT
    if not 1 <= port <= 65535:
        raise ValueError(f"{name}={port} is not a TCP port (1..65535)")
    return port


# ---------------------------------------------------------------------------- parsing


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when it is unset or empty."""
    value = env.get(name)
    return value if value else None


def _int_var(env: Mapping[str, str], name: str) -> int | None:
    value = _get(env, name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _as_int(name: str, value: object) -> int:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an integer") from None
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not an integer")
    try:
        return operator.index(value)  # int, numpy integers; not floats
    except TypeError:
        raise ValueError(f"{name}={value!r} is not an integer") from None
