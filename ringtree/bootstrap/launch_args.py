"""``ringtree run``'s command line: its own options, and the mpirun / torchrun ones people
type out of habit.

Accepted from mpirun: ``-H host:slots,...`` and ``--hostfile FILE`` (start the nodes over
ssh, :mod:`ringtree.bootstrap.ssh`), ``-np N`` (= ``-n``), ``-x VAR`` / ``-x VAR=VALUE`` (export to the
ranks), ``--bind-to auto|core|hwthread|none`` (``core``: rank *i* of this node runs on the
*i*-th CPU it may use, modulo their number; ``auto``, the default, binds so when the node's
ranks fit its CPUs and not otherwise, as mpirun binds to cores by default), ``--oversubscribe`` and ``--allow-run-as-root`` (no
effect: ringtree never refuses either). From torchrun: ``--nproc-per-node``,
``--standalone`` (one node, a private store: the default), ``--master-addr`` /
``--master-port`` (= ``--master HOST:PORT``), ``--nnodes N`` and ``--node-rank``.

Options that ask for something ringtree run does not do are refused by name with what to
use instead (elastic rendezvous, restarts, mapping policies); any other unknown
option is refused by name too. The command starts at the first word that is not an option
(or after ``--``); a command ending in ``.py`` runs with the current Python, as torchrun does.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

PROG = "ringtree run"

# option -> takes a value
_VALUED = {
    "-n": True, "-np": True, "--nproc-per-node": True, "--nproc_per_node": True,
    "--nnodes": True, "--node-rank": True, "--node_rank": True, "--master": True,
    "--master-addr": True, "--master_addr": True, "--master-port": True,
    "--master_port": True, "--timeout": True, "--grace": True, "--bind-to": True,
    "-x": True, "--tag-output": False, "--standalone": False, "--oversubscribe": False,
    "--allow-run-as-root": False, "-h": False, "--help": False, "--check-net": False,
    "-H": True, "--host": True, "--hostfile": True, "--enable-recovery": False,
    "--max-restarts": True, "--max_restarts": True,
}
_REFUSED = {
    "--rdzv-backend": "ringtree run has no elastic rendezvous; give --master HOST:PORT",
    "--rdzv-endpoint": "ringtree run has no elastic rendezvous; give --master HOST:PORT",
    "--rdzv-id": "ringtree run has no elastic rendezvous; give --master HOST:PORT",
    "--rdzv-conf": "ringtree run has no elastic rendezvous; give --master HOST:PORT",
    "--no-python": "give the program itself as the command (only *.py runs with Python)",
    "-m": "give the program as `python -m MODULE ...` after the options",
    "--module": "give the program as `python -m MODULE ...` after the options",
    "--map-by": "ringtree run places ranks in order; use --bind-to core to pin them",
    "--rank-by": "ringtree run numbers ranks node by node, in order",
}


class UsageError(Exception):
    pass


@dataclass
class Options:
    nproc: int
    nnodes: int
    node_rank: int
    master: tuple[str, int] | None
    tag_output: bool
    timeout: float | None
    grace: float
    command: list[str]
    bind_to: str = "auto"
    export: dict[str, str | None] = field(default_factory=dict)  # -x: None = inherit
    check_net: bool = False
    hosts: list[tuple[str, int]] | None = None  # -H / --hostfile: start them over ssh
    enable_recovery: bool = False  # a rank that fails does not stop the others
    max_restarts: int = 0  # replacements for dead ranks, in all (implies enable_recovery)


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(option words, command words)."""
    opts: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return opts, argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return opts, argv[i:]
        name = word.split("=", 1)[0]
        if name not in _VALUED:
            short = next((s for s in ("-n", "-x") if word.startswith(s) and word[2:]
                          and word[:3] != "-np"), None)
            if short is not None and (short != "-n" or word[2:].isdigit()):
                opts += [short, word[2:]]  # -n4, -xFOO
                i += 1
                continue
            for refused, hint in _REFUSED.items():
                if name == refused or name.replace("_", "-") == refused:
                    raise UsageError(f"{name} is not supported: {hint}")
            raise UsageError(f"unknown option {name!r} (see `ringtree run --help`); put the "
                             "command after the options, or after --")
        opts.append(word)
        if _VALUED[name] and "=" not in word:
            if i + 1 >= len(argv):
                raise UsageError(f"{name} needs a value")
            opts.append(argv[i + 1])
            i += 1
        i += 1
    return opts, []


def parse(argv: list[str]) -> Options:
    opt_words, command = _split(argv)
    ns = _parser().parse_args(opt_words)
    hosts = _hosts(ns)
    nproc, nnodes_text = _slots(ns, hosts)
    if not command:
        raise UsageError("no command given; usage: ringtree run -n N [options] [--] CMD ARGS...")
    nnodes = _nodes(ns, nproc, nnodes_text)
    if ns.timeout is not None and not ns.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {ns.timeout}")
    if ns.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {ns.max_restarts}")
    if not ns.grace >= 0:
        raise UsageError(f"--grace must be >= 0 seconds, got {ns.grace}")
    master = _master(ns, nnodes, hosts)
    if command[0].endswith(".py"):
        command = [sys.executable, *command]  # torchrun runs scripts with Python too
    return Options(nproc, nnodes, ns.node_rank, master, ns.tag_output, ns.timeout,
                   ns.grace, command, ns.bind_to, _exports(ns.export), ns.check_net, hosts,
                   ns.enable_recovery or ns.max_restarts > 0, ns.max_restarts)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Start N ranks of CMD on this node (see `python -m pydoc "
                    "ringtree.bootstrap.launch` and ringtree.bootstrap.launch_args).")
    parser.add_argument("-n", "-np", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                        type=int, help="ranks to start on this node")
    parser.add_argument("--nnodes", default="1", help="number of nodes (default 1)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                        help="this node's index in 0..nnodes-1 (default 0)")
    parser.add_argument("--master", metavar="HOST:PORT",
                        help="node 0's address for the store (required with --nnodes > 1)")
    parser.add_argument("--master-addr", "--master_addr", dest="master_addr")
    parser.add_argument("--master-port", "--master_port", dest="master_port")
    parser.add_argument("--tag-output", action="store_true",
                        help="prefix each output line with [rank] (stderr is tagged anyway "
                             "when it is not a terminal)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="stop the job after S seconds (exit code 124)")
    parser.add_argument("--grace", type=float, default=3.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping ranks (default 3)")
    parser.add_argument("--bind-to", dest="bind_to", default="auto",
                        choices=("auto", "none", "core", "hwthread"),
                        help="pin each rank to one CPU (core, hwthread), or not (none); "
                             "auto (default): pin when this node's ranks fit its CPUs")
    parser.add_argument("-x", dest="export", action="append", default=[], metavar="VAR[=VAL]",
                        help="export VAR (or set it to VAL) in every rank, as mpirun -x")
    parser.add_argument("--check-net", action="store_true",
                        help="before starting ranks, check that every node reaches the "
                             "addresses the others advertise (prints a host x address table)")
    parser.add_argument("-H", "--host", dest="hosts", metavar="HOST[:SLOTS],...",
                        help="start SLOTS ranks on each HOST over ssh (mpirun syntax; "
                             "$RINGTREE_SSH is the ssh command)")
    parser.add_argument("--hostfile", metavar="FILE",
                        help="hosts in Open MPI's hostfile format (host slots=N)")
    parser.add_argument("--enable-recovery", action="store_true",
                        help="a rank that dies does not stop the others (they can revoke, "
                             "agree and shrink); the exit status and summary still report "
                             "every failure (Open MPI's name)")
    parser.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int,
                        default=0, metavar="K",
                        help="restart a rank that dies, as a replacement that joins the running "
                             "job (at most K restarts in all; implies --enable-recovery)")
    parser.add_argument("--standalone", action="store_true", help="torchrun's: one node")
    parser.add_argument("--oversubscribe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allow-run-as-root", action="store_true", help=argparse.SUPPRESS)
    return parser


def _slots(ns: argparse.Namespace, hosts: list[tuple[str, int]] | None) -> tuple[int, str]:
    """(ranks on this node, --nnodes as typed) from -n / --nnodes or the host list."""
    nproc, nnodes_text = ns.nproc, ns.nnodes
    if hosts is not None:
        total = sum(n for _, n in hosts)
        if nproc is not None and nproc != total:
            raise UsageError(f"-n {nproc} disagrees with the {total} slots of the hosts; "
                             "drop -n (each host runs its slots)")
        if nnodes_text != "1" or ns.node_rank != 0:
            raise UsageError("-H/--hostfile start every node themselves; drop --nnodes and "
                             "--node-rank")
        nproc, nnodes_text = hosts[0][1], str(len(hosts))
    if nproc is None:
        raise UsageError("-n N (ranks on this node) is required; usage: ringtree run -n N "
                         "[options] [--] CMD ARGS...")
    return nproc, nnodes_text


def _nodes(ns: argparse.Namespace, nproc: int, nnodes_text: str) -> int:
    """The number of nodes, checked against -n, --standalone and --node-rank."""
    if ":" in nnodes_text:
        raise UsageError(f"--nnodes {nnodes_text}: ringtree run has no elastic node ranges; "
                         "give the number of nodes")
    try:
        nnodes = int(nnodes_text)
    except ValueError:
        raise UsageError(f"--nnodes {nnodes_text!r} is not an integer") from None
    if nproc < 1:
        raise UsageError(f"-n must be >= 1, got {nproc}")
    if nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {nnodes}")
    if ns.standalone and nnodes != 1:
        raise UsageError("--standalone means one node; drop it or --nnodes")
    if not 0 <= ns.node_rank < nnodes:
        raise UsageError(f"--node-rank {ns.node_rank} is outside 0..{nnodes - 1}")
    return nnodes


def _master(ns: argparse.Namespace, nnodes: int,
            hosts: list[tuple[str, int]] | None) -> tuple[str, int] | None:
    """Node 0's store address: --master HOST:PORT or torchrun's --master-addr/-port."""
    master_text = ns.master
    if ns.master_addr or ns.master_port:
        if ns.master:
            raise UsageError("give --master HOST:PORT or --master-addr/--master-port, not both")
        master_text = f"{ns.master_addr or '127.0.0.1'}:{ns.master_port or 29500}"
    master = parse_master(master_text) if master_text else None
    if master is None and nnodes > 1 and hosts is None:
        raise UsageError(
            "--master HOST:PORT is required with --nnodes > 1: node 0's address, reachable "
            "from every node, and a free port for the store"
        )
    return master


def _exports(items: list[str]) -> dict[str, str | None]:
    """mpirun's -x: ``VAR`` (inherit its value, None here) or ``VAR=VALUE``."""
    export: dict[str, str | None] = {}
    for item in items:
        var, eq, value = item.partition("=")
        if not var.isidentifier():
            raise UsageError(f"-x {item!r}: not an environment variable name")
        export[var] = value if eq else None
    return export


def _hosts(ns) -> list[tuple[str, int]] | None:
    from ringtree.bootstrap.ssh import parse_hostfile, parse_hosts

    if ns.hosts and ns.hostfile:
        raise UsageError("give -H or --hostfile, not both")
    try:
        if ns.hosts:
            return parse_hosts(ns.hosts)
        if ns.hostfile:
            return parse_hostfile(ns.hostfile)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return None


def parse_master(text: str) -> tuple[str, int]:
    host, sep, port_s = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"--master {text!r} is not HOST:PORT")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_s)
    except ValueError:
        raise UsageError(f"--master {text!r}: port {port_s!r} is not an integer") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"--master {text!r}: port must be in 1..65535")
    return host, port
