"""``ringtree perf COLLECTIVE [flags]``: nccl-tests for ringtree and its peers.

    ringtree run -n 4 ringtree perf all_reduce -b 8 -e 64M -f 4 -c 1
    ringtree perf all_reduce --nranks 4 -b 8 -e 64M -f 4 --backend gloo -J gloo.json
    mpirun -n 4 ringtree perf all_reduce -b 8 -e 64M -f 4 --backend mpi
    ringtree perf plot ringtree.json gloo.json -o busbw.png

Flags, defaults and output are nccl-tests' (``src/common.cu``). This module wires the
pieces together: :mod:`ringtree.perf.flags` parses the command line,
:mod:`ringtree.perf.spawn` starts ``--nranks`` local ranks, and each rank runs the
:class:`ringtree.perf.bench.Harness` on a backend.
"""

from __future__ import annotations

import sys

from ringtree.perf import spawn
from ringtree.perf.backends import Backend, BackendUnavailable, make_backend
from ringtree.perf.bench import Harness
from ringtree.perf.flags import PROG, Options, UsageError, parse_args, usage


def run_rank(o: Options, backend: Backend | None = None, out=None, err=None) -> int:
    """Run the benchmark as one rank of the job (``backend`` given, or made from env)."""
    err = err or sys.stderr
    owns = backend is None
    try:
        be = backend or make_backend(o.backend, algo=o.algo, transport=o.transport,
                                     timeout=float(o.timeout) if o.timeout else None,
                                     issue_async=o.issue_async)
    except BackendUnavailable as e:
        print(f"{PROG}: {e}", file=err)
        return 2
    except Exception as e:  # noqa: BLE001 - e.g. rendezvous failed: say so in one line
        print(f"{PROG}: cannot start the {o.backend} backend: {type(e).__name__}: {e}",
              file=err)
        return 1
    try:
        return Harness(o, be, out, err).run()
    except UsageError as e:
        if be.rank == 0:
            print(f"{PROG}: {e}", file=err)
        return 2
    except Exception as e:  # noqa: BLE001 - a failed collective ends the test
        print(f"{be.hostname()}: Test failure on rank {be.rank}: {type(e).__name__}: {e}",
              file=err, flush=True)
        return 1
    finally:
        if owns:
            try:
                be.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


def main(argv: list[str]) -> int:
    """``ringtree perf ...``; returns the exit status."""
    argv = list(argv)
    if argv and argv[0] == "plot":
        from ringtree.perf import plot

        return plot.main(argv[1:])
    try:
        o = parse_args(argv)
    except SystemExit:
        coll = next((a for a in argv if not a.startswith("-")), "COLLECTIVE")
        print(usage(coll))
        return 0
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if o.nranks and not spawn.is_child():
        return spawn.self_launch(o)
    return run_rank(o)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
