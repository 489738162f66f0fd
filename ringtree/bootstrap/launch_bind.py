"""Where ``ringtree run`` binds each local rank (``--bind-to``), and saying so."""

from __future__ import annotations

import os
import sys

from ringtree.bootstrap.launch_args import PROG


def cpu_for(opts, local: int) -> int | None:
    """The CPU this local rank is bound to (None: not bound). ``--bind-to auto`` binds
    rank *i* to the *i*-th CPU the launcher may use when every rank of this node gets
    one of its own (Open MPI's default ``--bind-to core`` for np ≤ 2, and the
    pinning every polling library needs on a small machine: unpinned, two ranks that
    wait by spinning lose a scheduler tick of 4 ms per call whenever the kernel puts
    them on one CPU); with more ranks than CPUs it leaves placement to the kernel."""
    mode = opts.bind_to
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "none" or (mode == "auto" and opts.nproc > len(cpus)):
        return None
    return cpus[local % len(cpus)]


def say_binding(opts, cpus: list[int | None]) -> None:
    """With ``RINGTREE_DEBUG=INFO``: where each local rank runs."""
    from ringtree.settings import current

    if current().debug not in ("INFO", "TRACE"):
        return
    base = opts.node_rank * opts.nproc
    where = ", ".join(f"rank {base + i} on CPU {c}" for i, c in enumerate(cpus)
                      if c is not None) or \
        f"not bound ({opts.nproc} ranks, {len(os.sched_getaffinity(0))} CPUs; " \
        f"--bind-to {opts.bind_to})"
    print(f"{PROG}: binding: {where}", file=sys.stderr, flush=True)
