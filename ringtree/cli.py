"""The ``ringtree`` command: a thin dispatcher to one module per subcommand.

Each subcommand lives in its own module exposing ``main(argv: list[str]) -> int``; the
module is imported only when its subcommand runs, so optional extras stay optional.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ringtree.bootstrap.launch", "start N local ranks (torchrun/mpirun-style launcher)"),
    "perf": ("ringtree.perf.cli", "nccl-tests style benchmark of a collective"),
    "algo": ("ringtree.tools.algo", "show an algorithm's schedule as a step table"),
    "sim": ("ringtree.sim.cli", "simulate a collective on a modeled cluster"),
    "train": ("ringtree.apps.parallel.train_cli", "train a small GPT with data/tensor/pipeline parallelism"),
    "trace": ("ringtree.prof.cli", "merge profiler output into a Chrome/Perfetto trace"),
    "doctor": ("ringtree.prof.doctor", "analyse dumped flight recorders of a hung job"),
    "testbed": ("ringtree.testbed.cli", "namespace hosts on shaped links: run a job on them"),
    "switch": ("ringtree.switch.cli", "a software SHARP switch (in-network aggregation)"),
    "env": ("ringtree.settings", "every RINGTREE_* environment variable, with its default"),
    "generate": ("ringtree.apps.serve.cli", "greedy GPT generation with a paged, prefix-cached KV"),
}


def _usage() -> str:
    lines = ["usage: ringtree COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_) in SUBCOMMANDS.items():
        lines.append(f"  {name:<8} {help_}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from ringtree import __version__

        print(f"ringtree {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"ringtree: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except BrokenPipeError:  # `ringtree trace --summary | head`: the reader has enough
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141  # 128 + SIGPIPE, as shell tools report it


if __name__ == "__main__":
    sys.exit(main())
