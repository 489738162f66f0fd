"""``ringtree perf``: nccl-tests for ringtree and its peers (gloo, MPI).

- :mod:`ringtree.perf.cli`      ``main``: wires flags, self-launch and the harness together
- :mod:`ringtree.perf.flags`    nccl-tests' getopt flags, size suffixes, ``all``; ``Options``
- :mod:`ringtree.perf.bench`    the TimeTest/BenchTime/CheckData harness of one rank
- :mod:`ringtree.perf.spawn`   ``--nranks N``: start N local ranks of the same command
- :mod:`ringtree.perf.console`  rank 0's whole-line stdout and the progress bar
- :mod:`ringtree.perf.bw`       buffer counts and algbw/busbw of each collective
- :mod:`ringtree.perf.format`   the preamble, table and footer text; the ``-J`` JSON file
- :mod:`ringtree.perf.verify`   inputs whose reductions are exact; ``#wrong`` counting
- :mod:`ringtree.perf.backends` ringtree, torch.distributed gloo and mpi4py behind one API
- :mod:`ringtree.perf.plot`     busbw/time against size from ``-J`` files (matplotlib)
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """``ringtree perf ...`` (see :func:`ringtree.perf.cli.main`)."""
    from ringtree.perf.cli import main as _main

    return _main(argv)
