"""What ``ringtree perf`` prints and writes, byte for byte in nccl-tests' layout.

Pure functions over values, transcribing ``src/util.cu`` of nccl-tests (its printf format
strings are quoted next to each function) so that tools that parse nccl-tests output parse
ours. The JSON writer reproduces nccl-tests' ``-J`` file (``JSON_FILE_VERSION`` 3): the
same keys in the same order, ``%lf`` doubles, booleans as the strings ``"true"/"false"``.
"""

# ruff: noqa: UP031 - printf formats are kept verbatim from nccl-tests to compare them

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ringtree.bootstrap.environ import view
from ringtree.perf.flags import Options

JSON_FILE_VERSION = 3
TIME_STRING_FORMAT = "%Y-%m-%d %H:%M:%S"


def float_str(value: float, width: int) -> str:
    """``getFloatStr``: ``%*.2f``, else ``.1f``, else ``.0f`` if it fits in ``width``,
    else ``%*.1e`` (``%*.0e`` below width 7), cut to ``width`` like ``snprintf``."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        s = fmt % (width, value)
        if len(s) <= width:
            return s
    return (("%*.1e" if width >= 7 else "%*.0e") % (width, value))[:width]


# ---------------------------------------------------------------------------- preamble


@dataclass(frozen=True)
class RankInfo:
    """One ``#  Rank`` line of the preamble (``writeDeviceReport``)."""

    rank: int
    group: int
    pid: int
    hostname: str
    device: int
    device_hex: str  # "%04x:%02x:%02x" bus id; "0000:00:00" for a CPU rank
    device_info: str


def rank_line(ri: RankInfo) -> str:
    """``#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s``"""
    return (f"#  Rank {ri.rank:2d} Group {ri.group:2d} Pid {ri.pid:6d} on {ri.hostname:>10s} "
            f"device {ri.device:2d} [{ri.device_hex}] {ri.device_info}")


def preamble(version: str, headers: int, library: int, program: str, cfg: Options,
             ranks: Sequence[RankInfo]) -> list[str]:
    """The lines before the table header (``writeDeviceReport``)."""
    step = cfg.step_factor if cfg.step_factor > 1 else cfg.step_bytes
    kind = "factor" if cfg.step_factor > 1 else "bytes"
    lines = [
        f"# nccl-tests version {version} nccl-headers={headers} nccl-library={library}",
        f"# Collective test starting: {program}",
        f"# nThread {cfg.nthreads} nGpus {cfg.ngpus} minBytes {cfg.min_bytes} "
        f"maxBytes {cfg.max_bytes} step: {step}({kind}) warmup iters: {cfg.warmup} "
        f"iters: {cfg.iters} agg iters: {cfg.agg} validation: {cfg.check} "
        f"graph: {cfg.graph} unalign: {cfg.unalign}",
    ]
    if cfg.blocking == 1:
        lines.append("# Blocking Enabled: wait and barrier after each inner iteration (-m) ")
    elif cfg.blocking == 2:
        lines.append("# Blocking Enabled: wait after each inner iteration (-m), no barrier ")
    elif cfg.blocking == 3:
        lines.append("# Blocking Enabled: wait and barrier after each outer iteration (-n); "
                     "time excludes barrier ")
    if not cfg.iters:
        lines.append("# Iters 0: per size, 20 calls from 1.6 MB, more below (up to 1000; "
                     "each row's count in -J's actual_iterations) ")
    if cfg.parallel_init:
        lines.append("# Parallel Init Enabled: threads call into NcclInitRank concurrently ")
    if cfg.local_register:
        lines.append("# Local Register: buffers in registered memory (Communicator.empty; "
                     "ringtree only) ")
    lines.append("#")
    lines.append("# Using devices")
    lines.extend(rank_line(r) for r in ranks)
    return lines


# ---------------------------------------------------------------------------- table


def header(report_cputime: bool = False, report_timestamps: bool = False) -> list[str]:
    """``writeResultHeader``: ``#``, then the group line and the two column lines."""
    ts_lbl = "timestamp" if report_timestamps else ""
    ts_pad = 19 if report_timestamps else 0
    ts_fmt = TIME_STRING_FORMAT if report_timestamps else ""
    t = "cputime" if report_cputime else "time"
    fmt = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
    return [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
        "          " % ("", "", "", "", ""),
        fmt % ("size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong",
               t, "algbw", "busbw", "#wrong", ts_pad, ts_lbl),
        fmt % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
               "(GB/s)", "(GB/s)", "", ts_pad, ts_fmt),
    ]


def row_preamble(nbytes: int, count: int, type_name: str, op_name: str, root: int) -> str:
    """``%12li  %12li  %8s  %6s  %6s`` with the root printed ``%6i``."""
    return "%12li  %12li  %8s  %6s  %6s" % (nbytes, count, type_name, op_name, "%6i" % root)


def row_body(time_us: float, algbw: float, busbw: float, wrong: int | None) -> str:
    """``  %7s  %6s  %6s  %6g``, or ``    N/A`` for #wrong when checking is off."""
    head = "  %7s  %6s  %6s" % (float_str(time_us, 7), float_str(algbw, 6),
                                float_str(busbw, 6))
    return head + ("    N/A" if wrong is None else "  %6g" % float(wrong))


def timestamp(now: float | None = None) -> str:
    """``writeTimestamp``: the local time, right-aligned in 21 columns (``-S 1``)."""
    return "%21s" % time.strftime(TIME_STRING_FORMAT, time.localtime(now))


def footer(errors: int, avg_busbw: float, program: str, min_bw: float | None = None
           ) -> list[str]:
    """``writeResultFooter`` + ``finalizeFooter`` + ``writeErrors`` (no error: empty line).

    ``Avg bus bandwidth`` is the plain mean of every printed busbw (both halves of each
    row); with ``NCCL_TESTS_MIN_BW`` set it says OK or FAILED against 0.9 × that minimum.
    """
    verdict = "" if min_bw is None else ("FAILED" if avg_busbw < min_bw * 0.9 else "OK")
    return [
        "# %-20s : %d %s" % ("Out of bounds values", errors, "FAILED" if errors else "OK"),
        "# %-20s : %g %s" % ("Avg bus bandwidth", avg_busbw, verdict),
        "#",
        f"# Collective test concluded: {program}",
        "#",
        "",
    ]


def link_block(link, rows: Sequence[tuple[int, int, float, Sequence[float]]]) -> list[str]:
    """ringtree's addition after the rows, when the ranks span hosts
    (:mod:`ringtree.perf.linkbound`): the hosts and their link, then per row the link
    bound (the least time the busiest host's link allows) and the fraction of it each
    half reached (bound ÷ time; TCP over Ethernet tops out near 95%)."""
    per = Counter(link.nodes)
    ranks = ", ".join(str(per[h]) for h in sorted(per))
    out = ["#",
           f"# {'Link bound':<20} : {len(per)} hosts ({ranks} ranks), inter-host link "
           f"{link.bandwidth * 8 / 1e6:,.0f} Mbit/s each way ({link.source})",
           "# %12s %6s %13s %13s %9s" % ("size", "root", "bound (us)", "out-of-place",
                                         "in-place")]
    for nbytes, root, bound, fractions in rows:
        shown = [f"{f:.1%}" for f in fractions] + [""] * (2 - len(fractions))
        out.append("# %12i %6i %13.1f %13s %9s" % (nbytes, root, bound * 1e6, *shown))
    return out


# ---------------------------------------------------------------------------- JSON


def _json_str(s: str) -> str:
    """``sanitizeJson``: escape ``" \\ /`` tab and newline; other characters verbatim."""
    out = []
    for ch in s:
        if ch in '"\\/':
            out.append("\\" + ch)
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) >= 0x7F:
            out.append(json.dumps(ch)[1:-1])
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _json_double(v: float | None) -> str:
    if v is None:
        return "null"
    if v != v:
        return '"nan"'
    if v in (float("inf"), float("-inf")):
        return '"inf"' if v > 0 else '"-inf"'
    return "%f" % v


def _json_bool(b: bool) -> str:
    return '"true"' if b else '"false"'


def _obj(items: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{_json_str(k)}:{v}" for k, v in items) + "}"


@dataclass
class JsonReport:
    """Accumulates one run's ``-J`` document; ``render()`` gives nccl-tests' text."""

    args: list[str]
    env: list[str]
    library: int
    cfg: Options
    devices: list[RankInfo]
    extra_config: dict[str, str] = field(default_factory=dict)
    start_time: str = field(default_factory=lambda: time.strftime(TIME_STRING_FORMAT))
    results: list[str] = field(default_factory=list)
    _row: list[tuple[str, str]] | None = None

    def begin_row(self, nbytes: int, count: int, type_name: str, op_name: str,
                  root: int) -> None:
        self._row = [("size", str(nbytes)), ("count", str(count)),
                     ("type", _json_str(type_name)), ("redop", _json_str(op_name)),
                     ("root", _json_str("%6i" % root))]

    def body(self, in_place: bool, time_us: float, algbw: float, busbw: float,
             wrong: int | None, of_link_bound: float | None = None) -> None:
        """One half of a row; ``of_link_bound`` (ringtree's addition, only across hosts):
        the link bound ÷ the time."""
        assert self._row is not None
        key = "cpu_time" if self.cfg.cputime else "time"
        extra = [] if of_link_bound is None else [("of_link_bound",
                                                   _json_double(of_link_bound))]
        self._row.append(("in_place" if in_place else "out_of_place", _obj([
            (key, _json_double(time_us)), ("alg_bw", _json_double(algbw)),
            ("bus_bw", _json_double(busbw)),
            ("nwrong", "null" if wrong is None else _json_double(float(wrong))), *extra])))

    def end_row(self, iters: int, name: str = "") -> None:
        assert self._row is not None
        self._row += [("actual_iterations", str(iters)), ("experiment_name", _json_str(name))]
        self.results.append(_obj(self._row))
        self._row = None

    def render(self, errors: int, avg_busbw: float, min_bw: float | None = None,
               error_text: str = "") -> str:
        c = self.cfg
        step = (("step_factor", str(c.step_factor)) if c.step_factor > 1
                else ("step_bytes", str(c.step_bytes)))
        devices = "[" + ",".join(_obj([
            ("rank", str(d.rank)), ("group", str(d.group)), ("pid", str(d.pid)),
            ("hostname", _json_str(d.hostname)), ("device", str(d.device)),
            ("device_hex", _json_str(d.device_hex)), ("device_info", _json_str(d.device_info)),
        ]) for d in self.devices) + "]"
        config = _obj([
            ("nthreads", str(c.nthreads)), ("ngpus", str(c.ngpus)),
            ("minimum_bytes", str(c.min_bytes)), ("maximum_bytes", str(c.max_bytes)), step,
            ("warmup_iters", str(c.warmup)), ("iterations", str(c.iters)),
            ("aggregated_iterations", str(c.agg)), ("validation", str(c.check)),
            ("graph", str(c.graph)), ("blocking_collectives", _json_bool(bool(c.blocking))),
            ("per_iter_timing", _json_bool(False)), ("per_iter_skip", "0"),
            ("parallel_init", _json_bool(bool(c.parallel_init))),
            *((k, _json_str(v)) for k, v in self.extra_config.items()),
            ("devices", devices),
        ])
        okay_bw = _json_str("unchecked") if min_bw is None else _json_bool(
            avg_busbw >= min_bw * 0.9)
        doc = _obj([
            ("version", str(JSON_FILE_VERSION)), ("start_time", _json_str(self.start_time)),
            ("args", "[" + ",".join(_json_str(a) for a in self.args) + "]"),
            ("env", "[" + ",".join(_json_str(e) for e in self.env) + "]"),
            ("nccl_version", str(self.library)), ("config", config),
            ("results", "[" + ",".join(self.results) + "]"),
            ("out_of_bounds", _obj([("count", str(errors)), ("okay", _json_bool(errors == 0))])),
            ("average_bus_bandwidth", _obj([("bandwidth", _json_double(avg_busbw)),
                                            ("okay", okay_bw)])),
            ("errors", "[" + _json_str(error_text) + "]"),
            ("end_time", _json_str(time.strftime(TIME_STRING_FORMAT))),
        ])
        return doc


_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "AUTH")


def redacted_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """``NAME=value`` lines for the JSON ``env`` list, with secrets (``RINGTREE_TOKEN``,
    anything named like a token, secret, password or key) replaced by ``<redacted>``."""
    env = view() if environ is None else environ
    out = []
    for k, v in env.items():
        secret = any(w in k.upper() for w in _SECRET_WORDS) or k.upper().endswith("_KEY")
        out.append(f"{k}={'<redacted>' if secret else v}")
    return out


def open_exclusive(path: str) -> tuple[object, str] | None:
    """``jsonOutputInit``'s ``fopen(path, "wx")``: never overwrite; try ``path.0``,
    ``path.1`` ... Returns (file, actual path), or None if the directory is unwritable."""
    attempt, n = path, 0
    while True:
        try:
            return open(attempt, "x", encoding="utf-8"), attempt
        except FileExistsError:
            attempt = f"{path}.{n}"
            n += 1
        except OSError:
            return None


def load_json(path: str) -> dict:
    """Read a ``-J`` file (ours or nccl-tests'): the parsed document with ``"nan"``
    doubles turned back into floats."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)

    def fix(v):
        if v in ("nan", "inf", "-inf"):
            return float(v)
        return v

    for row in doc.get("results", []) or []:
        for half in ("out_of_place", "in_place"):
            rec = row.get(half)
            if isinstance(rec, dict):
                for k in list(rec):
                    rec[k] = fix(rec[k])
    return doc
