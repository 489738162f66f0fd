"""The ``ringtree perf`` harness: nccl-tests' ``TimeTest``/``BenchTime``/``CheckData`` loop.

1. warm-up: ``-w`` operations at every size from ``-b`` to ``-e`` doubling;
2. per size and per half (out-of-place, then in-place): one synchronising operation and a
   barrier, then ``-n`` iterations of ``-m`` operations (grouped when ``-m`` > 1) timed by
   one host clock up to the completion of the last, divided by ``n·m``; that time is
   all-reduced over ranks as ``-a`` says (0 rank 0, 1 mean, 2 min, 3 max);
3. ``-c`` times: fresh verifiable inputs, one operation, ``#wrong`` = mismatching elements
   summed over ranks (:mod:`ringtree.perf.verify`).

``-z`` picks blocking modes, ``-N`` repeats the sweep and ``-T`` arms a :class:`Watchdog`.
Each operation of an iteration uses a different offset into buffers of ``-e`` bytes, as
nccl-tests does to avoid cache effects. Rank 0 prints; a non-zero ``#wrong`` anywhere makes
the exit status 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time

import numpy as np

from ringtree.bootstrap import environ
from ringtree.dtypes import DType
from ringtree.perf import format as fmt
from ringtree.perf import verify
from ringtree.perf.backends import Backend, Operands, version_code
from ringtree.perf.bw import CollSpec, Counts, spec
from ringtree.perf.console import Printer, Progress
from ringtree.perf.flags import PROG, Options, UsageError, auto_iters, sizes, warmup_sizes
from ringtree.perf.linkbound import link_bound
from ringtree.perf.watchdog import Watchdog

CHUNK = 1 << 20  # elements generated/checked at a time (bounds temporaries)


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
        self.link = be.link()
        self.link_rows: list[tuple[int, int, float, list[float]]] = []  # size, root, s, of

    # ---- setup -------------------------------------------------------------------------

    def config(self) -> Options:
        """The options as run (the sizes clamped to what the backend can hold)."""
        return dataclasses.replace(self.o, min_bytes=self.min_bytes, max_bytes=self.max_bytes)

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
        self.sendbuf = be.zeros(self.max_bytes + pad, bool(o.local_register))
        self.recvbuf = be.zeros(self.max_bytes + pad, bool(o.local_register))
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
        min_bw_env = environ.get("NCCL_TESTS_MIN_BW")
        min_bw = float(min_bw_env) if min_bw_env else None
        if self.link is not None:
            self.p.lines(fmt.link_block(self.link, self.link_rows))
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
        from ringtree.tools.figure import FigureUnavailable

        try:
            plot.plot_docs([(None, json.loads(doc))], self.o.plot)
            print(f"{PROG}: wrote {self.o.plot}", file=self.err)
        except FigureUnavailable as e:
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
                if self.link is not None:
                    nbytes = c.nbytes(dt.itemsize)
                    self.link_rows.append((nbytes, root, link_bound(
                        self.o.coll, nbytes, self.link.nodes, self.link.bandwidth,
                        max(root, 0)), []))
                self.bench_time(dt, op, root, in_place=False)
                self.bench_time(dt, op, root, in_place=True)
                if o.timestamps:
                    self.p.write(fmt.timestamp())
                self.p.write("\n")
                if self.report is not None:
                    self.report.end_row(self.iters)
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
        self.iters = self.o.iters or auto_iters(total)

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
        calls = [[self.operands(op, root, in_place, i * o.agg + a) for a in range(o.agg)]
                 for i in range(self.iters)]
        t0, paused = self._train(calls, blocking)
        nops = max(1, self.iters * o.agg)
        cpu_sec = (time.perf_counter() - t0 - paused) / nops
        self.complete()
        sec = (time.perf_counter() - t0 - paused) / nops
        if o.average == 1:
            sec = be.allreduce_f64(sec, "sum") / self.n
        elif o.average in (2, 3):
            sec = be.allreduce_f64(sec, "min" if o.average == 2 else "max")
        algbw, busbw = self.spec.bw(self.counts.param, dt.itemsize, sec, self.n)
        be.barrier()
        self.rep += 1
        wrong = self.verify(dt, op, root, in_place, blocking)
        t_us = (cpu_sec if o.cputime else sec) * 1e6
        self.p.write(fmt.row_body(t_us, algbw, busbw, wrong))
        of_bound = None
        if self.link is not None:  # the fraction of the link bound this half reached
            bound, fractions = self.link_rows[-1][2], self.link_rows[-1][3]
            of_bound = bound / sec if sec > 0 else float("inf")
            fractions.append(of_bound)
        if self.report is not None:
            self.report.body(in_place, t_us, algbw, busbw, wrong, of_bound)
        self.bw_sum += busbw
        self.bw_count += 1

    def _train(self, calls: list[list[Operands]], blocking: bool) -> tuple[float, float]:
        """A barrier, then the timed calls; return the start time and the seconds ``-z 3``
        spent in its barriers. Each call is prepared before the barrier
        (:meth:`Backend.issuer`), so with no ``-T`` and no per-call barrier the loop pays
        only what a user's loop of the same calls pays."""
        o, be, dog = self.o, self.be, self.dog
        grouped = o.agg > 1 and not blocking
        trains = [] if grouped else [[be.issuer(c, blocking) for c in ops] for ops in calls]
        bare = not grouped and dog.seconds <= 0 and o.blocking not in (1, 3)
        flat = [f for fs in trains for f in fs] if bare else []
        be.barrier()
        if bare:
            t0 = time.perf_counter()
            for f in flat:
                f()
            return t0, 0.0
        paused = 0.0
        t0 = time.perf_counter()
        for i, ops in enumerate(calls):
            if grouped:
                with dog.guard(), be.group():
                    for call in ops:
                        be.run(call, False)
            else:
                for f in trains[i]:
                    with dog.guard():
                        f()
                        if o.blocking == 1:
                            be.barrier()
            if o.blocking == 3:
                self.complete()
                t1 = time.perf_counter()
                be.barrier()
                paused += time.perf_counter() - t1
        return t0, paused

    def verify(self, dt: DType, op: str | None, root: int, in_place: bool,
               blocking: bool) -> int | None:
        """Wrong elements over all ranks after ``-c`` checked runs (None: not checked)."""
        o, be = self.o, self.be
        # nccl-tests: "We don't support in-place sendrecv" (not checked, not counted)
        if not o.check or (in_place and o.coll == "sendrecv"):
            return None
        wrong = 0
        for _ in range(o.check):
            self.init_data(op, root, in_place, self.rep)
            self.start(dt, op, root, in_place, 0, blocking)
            self.complete()
            mine = self.check_data(op, root, in_place, self.rep)
            wrong = int(round(be.allreduce_f64(float(mine), "sum")))
            if wrong:
                self.errors += 1
                break
        return wrong

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
