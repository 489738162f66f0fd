"""Start processes with hand-made launcher environments and call ringtree.init in each."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ringtree.testing import _collect, _ctx, _pack_error

LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GROUP_RANK", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_precondition_transports", "OMPI_MCA_opal_precondition_transports",
    "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "PMI_JOBID", "PMI_KVSNAME", "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID",
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
)


def _entry(env: dict[str, str], conn, fn: Callable | None, init_kw: dict) -> None:
    for k in list(os.environ):
        if k.startswith("RINGTREE_") or k in LAUNCHER_VARS:
            del os.environ[k]
    os.environ.update(env)
    try:
        import ringtree

        comm = ringtree.init(**init_kw)
        try:
            conn.send(("ok", fn(comm) if fn is not None else comm.rank))
        finally:
            comm.close()
    except BaseException as e:  # noqa: BLE001
        conn.send(("err", _pack_error(e)))


def spawn(envs: list[dict[str, str]], fn: Callable | None = None, *, timeout: float = 60.0,
          **init_kw: Any) -> list[Any]:
    """One process per environment; each returns ``fn(comm)`` or the exception it raised."""
    ctx = _ctx()
    conns, procs = [], []
    for env in envs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_entry, args=(env, child, fn, init_kw), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    try:
        return _collect(conns, procs, timeout)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
