"""nccl-tests' flags for ``ringtree perf``: the getopt-compatible parser and its options.

Flags and defaults are nccl-tests' (``src/common.cu``): short and long forms (``-b 8``,
``-b8``, ``--minbytes=8``), K/M/G size suffixes (``parsesize``), C-style integers and
``all`` for ``-o``/``-d``/``-r``; plus ringtree's own (``--backend``, ``--algo``,
``--transport``, ``--nranks``, ``--plot``, ``--progress``). :func:`sizes` is the sweep
from ``-b`` to ``-e`` the options describe.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from ringtree.dtypes import DType, parse_dtype
from ringtree.perf import verify
from ringtree.perf.backends import BACKENDS
from ringtree.perf.bw import COLLECTIVES, spec

PROG = "ringtree perf"
TYPE_ORDER = (DType.INT8, DType.UINT8, DType.INT32, DType.UINT32, DType.INT64, DType.UINT64,
              DType.FLOAT16, DType.FLOAT32, DType.FLOAT64, DType.BFLOAT16)
OP_ORDER = verify.REDUCE_OPS  # sum prod max min avg mulsum (nccl-tests' test_opnames)


class UsageError(Exception):
    pass


# ============================================================================ options


@dataclass
class Options:
    coll: str = "all_reduce"
    nthreads: int = 1
    ngpus: int = 1
    min_bytes: int = 32 << 20
    max_bytes: int = 32 << 20
    step_bytes: int = 1 << 20
    step_factor: int = 1
    iters: int = 0  # 0: auto_iters(bytes)
    warmup: int = 1
    agg: int = 1
    cycles: int = 1
    parallel_init: int = 0
    check: int = 1
    ops: list[str] = field(default_factory=lambda: ["sum"])
    dtypes: list[DType] = field(default_factory=lambda: [DType.FLOAT32])
    root: int = 0  # -1 = all roots
    blocking: int = 0
    timeout: int = 0
    graph: int = 0
    cputime: int = 0
    timestamps: int = 0
    json: str | None = None
    average: int = 1
    unalign: int = 0
    local_register: int = 0  # -R: 1/2, buffers from the communicator's registered memory
    algo: str | None = None
    transport: str | None = None
    backend: str = "ringtree"
    nranks: int = 0
    plot: str | None = None
    progress: bool | None = None
    issue_async: bool = False
    argv: list[str] = field(default_factory=list)


def parse_size(text: str, what: str) -> int:
    """nccl-tests' ``parsesize``: a number with an optional K/M/G (×1024ⁿ) suffix."""
    m = re.match(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S?)", text)
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if not m or m.group(2).lower() not in units or float(m.group(1)) < 0:
        raise UsageError(f"invalid size specified for '{what}': {text!r}")
    return int(float(m.group(1)) * units[m.group(2).lower()])


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise UsageError(f"invalid value for {what}: {text!r} (an integer)") from None


def parse_ops(text: str) -> list[str]:
    key = text.strip().lower()
    if key == "all":
        return list(OP_ORDER)
    key = {"premulsum": "mulsum", "premul_sum": "mulsum", "product": "prod",
           "mean": "avg"}.get(key, key)
    if key not in OP_ORDER:
        raise UsageError(f"invalid op {text!r}; expected one of {'/'.join(OP_ORDER)}/all")
    return [key]


def parse_dtypes(text: str) -> list[DType]:
    if text.strip().lower() == "all":
        return list(TYPE_ORDER)
    try:
        return [parse_dtype(text.strip())]
    except TypeError:
        names = ", ".join(t.nccl_name for t in TYPE_ORDER)
        raise UsageError(f"invalid type {text!r}; expected one of {names} or all") from None


def parse_root(text: str) -> int:
    if text.strip().lower() == "all":
        return -1
    r = _int(text, "-r/--root")
    return -1 if r < 0 else r


_FLAGS = [  # short, long, dest, help
    ("t", "nthreads", "nthreads", "<num threads> (1 only: one rank per process)"),
    ("g", "ngpus", "ngpus", "<gpus per thread> (1 only)"),
    ("b", "minbytes", "min_bytes", "<min size in bytes> K/M/G suffixes (default 32M)"),
    ("e", "maxbytes", "max_bytes", "<max size in bytes> (default 32M)"),
    ("i", "stepbytes", "step_bytes", "<increment size> (default 1M)"),
    ("f", "stepfactor", "step_factor", "<increment factor> (default: disabled)"),
    ("n", "iters", "iters", "<iteration count> (default 0: 20, or more below 1.6 MB "
                               "so a train lasts beyond one wake-up; see auto_iters)"),
    ("m", "agg_iters", "agg", "<aggregated iteration count> (default 1)"),
    ("w", "warmup_iters", "warmup", "<warmup iteration count> (default 1)"),
    ("N", "run_cycles", "cycles", "<cycle count> run & print each cycle (default: 1; 0=infinite)"),
    ("p", "parallel_init", "parallel_init", "<0/1> (accepted, no effect)"),
    ("c", "check", "check", "<check iteration count> (default 1; 0 = no check)"),
    ("o", "op", "ops", "<sum/prod/min/max/avg/mulsum/all> (default sum)"),
    ("d", "datatype", "dtypes", "<nccltype/all> (default float)"),
    ("r", "root", "root", "<root/all> (default 0)"),
    ("z", "blocking", "blocking", "<0/1/2/3> blocking mode (default 0: no wait between "
     "calls; each call completes on the calling thread unless --async)"),
    ("y", "stream_null", "stream_null", "<0/1> (accepted, no effect)"),
    ("T", "timeout", "timeout", "<time in seconds> per wait (default: disabled)"),
    ("G", "cudagraph", "graph", "<num graph launches> (0 only: no CUDA graphs on CPUs)"),
    ("C", "report_cputime", "cputime", "<0/1> report CPU (issue) time instead of latency"),
    ("S", "report_timestamps", "timestamps", "<0/1> report timestamps (default 0)"),
    ("J", "output_file", "json", "<file> write JSON output to filepath (.json)"),
    ("a", "average", "average", "<0/1/2/3> report time of <0=RANK0/1=AVG/2=MIN/3=MAX>"),
    ("u", "unalign", "unalign", "<elements> misalign buffers by N elements (default 0)"),
    ("R", "local_register", "local_register", "<0/1/2> 1 or 2: ringtree's buffers in "
     "registered memory (Communicator.empty: peers read them in place; other backends: "
     "plain buffers; default 0)"),
    ("x", "cta_policy", "cta_policy", "<0/1/2> (accepted, no effect)"),
    ("M", "memory", "memory", "<0/1> (accepted, no effect)"),
]


def usage(coll: str = "COLLECTIVE") -> str:
    lines = [f"USAGE: {PROG} {coll} "]
    for short, long, _, help_ in _FLAGS:
        lines.append(f"\t[-{short},--{long} {help_}] ")
    lines += [
        "\t[--backend ringtree|gloo|mpi] measure ringtree, torch.distributed gloo or mpi4py",
        "\t[--algo NAME] ringtree algorithm (ring, tree, ...) [--transport auto|tcp]",
        "\t[--nranks N] start N local ranks of this command (ringtree run / mpirun)",
        "\t[--plot FILE.png] plot busbw and time against size (needs matplotlib)",
        "\t[--progress | --no-progress] progress bar on stderr (default: if a terminal)",
        "\t[--async] with -z 0, issue ringtree and gloo calls with async_op=True and wait for "
        "them at the end (default: every call runs to completion as a user's blocking call "
        "does)",
        "\t[-h,--help]",
        f"collectives: {', '.join(COLLECTIVES)};  also: {PROG} plot A.json B.json -o OUT.png",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> Options:
    """nccl-tests' getopt_long flags (``-b 8``, ``-b8``, ``--minbytes=8``) plus ours."""
    p = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    p.add_argument("coll", nargs="?")
    for short, long, dest, _ in _FLAGS:
        p.add_argument(f"-{short}", f"--{long}", dest=dest)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--backend", default="ringtree")
    p.add_argument("--algo")
    p.add_argument("--transport")
    p.add_argument("--nranks", type=str)
    p.add_argument("--plot")
    p.add_argument("--progress", dest="progress", action="store_const", const=True)
    p.add_argument("--no-progress", dest="progress", action="store_const", const=False)
    p.add_argument("--async", dest="issue_async", action="store_true")
    try:
        ns, extra = p.parse_known_args(argv)
    except SystemExit as e:
        raise UsageError("bad arguments") from e
    if extra:
        raise UsageError(f"invalid option {extra[0]!r}\n{usage(ns.coll or 'COLLECTIVE')}")
    if ns.help:
        raise SystemExit(0)
    if not ns.coll:
        raise UsageError(f"which collective? {', '.join(COLLECTIVES)}\n{usage()}")
    o = Options(argv=list(argv))
    try:
        o.coll = spec(ns.coll).name
    except ValueError as e:
        raise UsageError(str(e)) from None
    sizes = {"min_bytes": "minbytes", "max_bytes": "maxbytes", "step_bytes": "stepBytes"}
    for dest, what in sizes.items():
        if getattr(ns, dest) is not None:
            setattr(o, dest, parse_size(getattr(ns, dest), what))
    ints = ("nthreads", "ngpus", "step_factor", "iters", "agg", "warmup", "cycles",
            "parallel_init", "check", "blocking", "timeout", "graph", "cputime",
            "timestamps", "average", "unalign", "local_register")
    for dest in ints:
        if getattr(ns, dest) is not None:
            setattr(o, dest, _int(getattr(ns, dest), f"--{dest}"))
    if ns.ops is not None:
        o.ops = parse_ops(ns.ops)
    if ns.dtypes is not None:
        o.dtypes = parse_dtypes(ns.dtypes)
    if ns.root is not None:
        o.root = parse_root(ns.root)
    o.json, o.plot, o.progress = ns.json, ns.plot, ns.progress
    o.algo, o.transport, o.backend = ns.algo, ns.transport, ns.backend.lower()
    o.issue_async = ns.issue_async
    if ns.nranks is not None:
        o.nranks = _int(ns.nranks, "--nranks")
    _validate(o)
    return o


def _validate(o: Options) -> None:
    if o.min_bytes > o.max_bytes:
        raise UsageError(f"invalid sizes for 'minbytes' and 'maxbytes': {o.min_bytes} > "
                         f"{o.max_bytes}")
    if o.nthreads != 1 or o.ngpus != 1:
        raise UsageError("-t/-g: ringtree perf runs one rank per process; start more "
                         "ranks with --nranks N, `ringtree run -n N`, torchrun or mpirun")
    if o.graph:
        raise UsageError("-G: CUDA graphs do not exist for CPU ranks; use -G 0")
    if o.step_factor <= 1 and o.step_bytes <= 0 and o.min_bytes < o.max_bytes:
        raise UsageError("-i 0 without -f never reaches -e")
    if o.average not in (0, 1, 2, 3):
        raise UsageError(f"-a must be 0, 1, 2 or 3, got {o.average}")
    if o.blocking not in (0, 1, 2, 3):
        raise UsageError(f"-z must be 0, 1, 2 or 3, got {o.blocking}")
    if o.local_register not in (0, 1, 2):
        raise UsageError(f"-R must be 0, 1 or 2, got {o.local_register}")
    for what, v in (("-n", o.iters), ("-m", o.agg), ("-w", o.warmup), ("-c", o.check),
                    ("-N", o.cycles), ("-u", o.unalign), ("-T", o.timeout)):
        if v < 0:
            raise UsageError(f"{what} must be >= 0, got {v}")
    if o.agg < 1:
        raise UsageError("-m must be >= 1")
    if o.backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {o.backend!r}")
    if o.nranks < 0:
        raise UsageError("--nranks must be >= 1")


def sizes(o: Options):
    """The swept sizes: ``-b`` to ``-e`` times ``-f``, or plus ``-i``."""
    size = o.min_bytes
    while size <= o.max_bytes:
        yield size
        if o.step_factor > 1:
            size = size * o.step_factor if size else 1
        else:
            size += o.step_bytes
            if o.step_bytes <= 0:
                return


def auto_iters(nbytes: int) -> int:
    """``-n 0`` (the default): the calls timed per size. nccl-tests times 20 calls queued
    on a GPU stream; 20 CPU calls of 2 µs last 40 µs, of which the ranks' skew leaving the
    barrier before the clock (a sleeping rank's wake-up, tens of µs) would be most. So
    below 1.6 MB a train carries about 32 MiB, up to 1,000 calls (OSU's benchmarks time
    1,000-10,000 small calls for the same reason); from there on, nccl-tests' 20."""
    return max(20, min(1000, (32 << 20) // max(nbytes, 1)))


def warmup_sizes(o: Options):
    size = o.min_bytes
    while size <= o.max_bytes:
        yield size
        size = size * 2 if size else 1

