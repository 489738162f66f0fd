"""Let ``init_process_group("ringtree")`` (``env://``) start under mpirun, MPICH and srun.

torch's ``env://`` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``,
which torchrun and ``ringtree run`` export but ``mpirun`` and ``srun`` do not. When none of
``RANK``/``WORLD_SIZE`` is set and :func:`ringtree.bootstrap.job.detect` finds an Open MPI, MPICH
(PMI) or Slurm job, the missing variables are filled from it: rank and size from the
launcher, ``MASTER_ADDR`` from the environment or Slurm's node list (``127.0.0.1`` for a
one-host job), ``MASTER_PORT`` hashed from the job id so every rank picks the same one.
Variables already set are never changed.
"""

from __future__ import annotations

from ringtree.bootstrap.environ import export, view

_LAUNCHERS = ("openmpi", "pmi", "slurm")


def fill_torch_env(environ: dict | None = None) -> dict[str, str]:
    """Export what ``env://`` needs from an MPI/Slurm launcher (into ``environ``, default
    this process's); returns what it set."""
    env = view() if environ is None else environ
    if env.get("RANK") or env.get("WORLD_SIZE"):
        return {}
    from ringtree.bootstrap.job import detect

    try:
        job = detect(environ=env)
    except ValueError:
        return {}  # let torch report what is missing
    if job.source not in _LAUNCHERS:
        return {}
    values = {
        "RANK": job.rank, "WORLD_SIZE": job.world_size, "LOCAL_RANK": job.local_rank,
        "LOCAL_WORLD_SIZE": job.local_world_size, "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": job.master_port,
    }
    added = {k: str(v) for k, v in values.items() if not env.get(k)}
    if environ is None:
        export(added)
    else:
        environ.update(added)
    return added
