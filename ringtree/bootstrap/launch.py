"""``ringtree run``: start N ranks per node, torchrun/mpirun style.

::

    ringtree run -n N [--nnodes M --node-rank R --master HOST:PORT] [--tag-output]
                 [--timeout S] [--grace S] [--check-net] [--] CMD ARGS...
    ringtree run -H host1:4,host2:4 | --hostfile FILE [options] [--] CMD ARGS...

``-H``/``--hostfile`` start the per-node launchers over ssh (:mod:`ringtree.bootstrap.ssh`);
``--check-net`` first checks that every node reaches the addresses the others advertise
(:mod:`ringtree.bootstrap.netmatrix`).

The launcher of node 0 hosts the job's :class:`~ringtree.bootstrap.store.StoreServer` (so rank 0 does
not: ``RINGTREE_STORE_EXTERNAL=1``), authenticated by ``RINGTREE_TOKEN`` (random for one node;
multi-node jobs must export the same token on every node). Each rank gets::

    RINGTREE_RANK RINGTREE_WORLD_SIZE RINGTREE_LOCAL_RANK RINGTREE_LOCAL_WORLD_SIZE
    RINGTREE_NODE_RANK RINGTREE_MASTER_ADDR RINGTREE_MASTER_PORT RINGTREE_TOKEN
    RINGTREE_STORE_EXTERNAL=1
    RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT

The torchrun-compatible ``MASTER_PORT`` is a different port from the ringtree store's (a free
one on a single node, the store port + 1 across nodes), so a ``torch.distributed`` script runs
unchanged: its rank 0 hosts its own TCPStore there.

Process handling follows mpirun/torchrun:

- every rank runs in its own process group with stdin from ``/dev/null``; SIGINT/SIGTERM sent
  to the launcher (e.g. Ctrl-C) are forwarded once to each rank's group, and the launcher exits
  with 128+signal when they are gone (a second signal kills them with SIGKILL). If the
  launcher itself dies, Linux kills the ranks (``PR_SET_PDEATHSIG``);
- the first rank to fail (non-zero exit or killed by a signal) stops the job: the others
  get ``launch_report.SETTLE`` seconds to leave on their own (a rank already on its way
  out — it left the job, its peers failed on that — is reported by its own exit, not by
  our signal), then SIGTERM, then SIGKILL after ``--grace`` seconds, and the launcher
  exits with that rank's code (128+signal for a signal) after one summary line on stderr;
  with ``--enable-recovery`` the others run on (``--max-restarts K``: and dead ranks are
  replaced), the code and summary the same;
- ``--timeout S`` stops the job after S seconds and exits with 124, naming the ranks that were
  still running;
- ``--tag-output`` prefixes every line with ``[rank]`` (and sets ``PYTHONUNBUFFERED=1`` unless
  it is set, so lines appear as they are printed); otherwise ranks inherit stdout/stderr.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from ringtree.bootstrap import environ
from ringtree.bootstrap.jobtoken import bind_address
from ringtree.bootstrap.launch_args import PROG, Options, UsageError, parse
from ringtree.bootstrap.launch_bind import cpu_for, say_binding
from ringtree.bootstrap.launch_report import LAST_LINES, SETTLE, Exit, how, isatty, plural, report
from ringtree.bootstrap.procs import child_setup, routed_signals, signal_groups, sleep_on
from ringtree.bootstrap.store import StoreError, StoreServer

__all__ = ["main"]



@dataclass
class _Rank:
    rank: int
    local_rank: int
    proc: subprocess.Popen
    code: int | None = None
    readers: list[threading.Thread] = field(default_factory=list)
    exit: Exit | None = None
    lines: deque = field(default_factory=lambda: deque(maxlen=LAST_LINES))  # last stderr


def main(argv: list[str]) -> int:
    """Run ``ringtree run`` with ``argv`` (the arguments after ``run``); return the exit code."""
    try:
        opts = parse(argv)
    except SystemExit as e:  # --help, or an argparse error already printed
        return int(e.code or 0) if isinstance(e.code, int) else 2
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2

    if opts.hosts is not None:  # -H / --hostfile: every node over ssh
        from ringtree.bootstrap.ssh import launch

        return launch(opts, PROG)
    token = environ.get("RINGTREE_TOKEN") or ""
    if not token:
        if opts.nnodes > 1:
            print(
                f"{PROG}: --nnodes {opts.nnodes} needs one job token shared by every node; "
                "export the same RINGTREE_TOKEN on each node, e.g. "
                "export RINGTREE_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')",
                file=sys.stderr,
            )
            return 2
        token = secrets.token_hex(16)

    server: StoreServer | None = None
    try:
        if opts.master is None:  # single node, nothing given: a free loopback port
            server = StoreServer("127.0.0.1", 0, token)
            addr, port = "127.0.0.1", server.port
        else:
            addr, port = opts.master
            if opts.node_rank == 0:
                server = StoreServer(_bind_host(addr), port, token)
    except StoreError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    try:
        torch_port = _free_port(addr) if opts.nnodes == 1 else port + 1
        if not 1 <= torch_port <= 65535:
            print(f"{PROG}: --master port must be below 65535 (port+1 is MASTER_PORT)",
                  file=sys.stderr)
            return 2
        if opts.check_net:
            from ringtree.bootstrap.netmatrix import launcher_check

            try:
                if launcher_check(addr, port, token, opts.node_rank, opts.nnodes):
                    return 1
            except StoreError as e:
                print(f"{PROG}: --check-net: {e}", file=sys.stderr)
                return 1
        return _Job(opts, addr, port, torch_port, token, server).run()
    finally:
        if server is not None:
            server.close()


# ---------------------------------------------------------------------------- addresses


def _bind_host(master_host: str) -> str:
    """Listen on loopback for a loopback master, else only on the local address the
    master names (every interface when it names none of this host's)."""
    try:
        ip = ipaddress.ip_address(master_host)
    except ValueError:
        return "127.0.0.1" if master_host == "localhost" else bind_address(master_host)
    if ip.is_loopback or ip.version == 6:
        return str(ip)
    return bind_address(str(ip))


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- the job


class _Job:
    def __init__(self, opts: Options, addr: str, port: int, torch_port: int, token: str,
                 server: StoreServer | None = None):
        self.opts = opts
        self.server = server
        # tag stderr unless a person watches it: several ranks' tracebacks interleave
        self.tag_err = opts.tag_output or not isatty(sys.stderr)
        self.addr, self.port, self.torch_port, self.token = addr, port, torch_port, token
        self.ranks: list[_Rank] = []
        self.pending_signals: list[int] = []
        self.out_lock = threading.Lock()
        self.start = time.monotonic()
        self.restarts = 0  # replacements started (--max-restarts)
        self.cpus: list[int | None] = []

    def env_for(self, local_rank: int) -> dict[str, str]:
        o = self.opts
        rank, world = o.node_rank * o.nproc + local_rank, o.nnodes * o.nproc
        env = environ.child({
            "RINGTREE_RANK": str(rank),
            "RINGTREE_WORLD_SIZE": str(world),
            "RINGTREE_LOCAL_RANK": str(local_rank),
            "RINGTREE_LOCAL_WORLD_SIZE": str(o.nproc),
            "RINGTREE_NODE_RANK": str(o.node_rank),
            "RINGTREE_MASTER_ADDR": self.addr,
            "RINGTREE_MASTER_PORT": str(self.port),
            "RINGTREE_TOKEN": self.token,
            "RINGTREE_STORE_EXTERNAL": "1", "RINGTREE_MAX_RESTARTS": str(o.max_restarts),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(o.nproc),
            "GROUP_RANK": str(o.node_rank),
            "MASTER_ADDR": self.addr,
            "MASTER_PORT": str(self.torch_port),
        })
        for var, value in o.export.items():  # mpirun -x
            if value is not None:
                env[var] = value
            elif environ.get(var) is None:
                raise _ExportError(var)
        if o.tag_output or self.tag_err:
            env.setdefault("PYTHONUNBUFFERED", "1")
        if o.nproc > 1:
            # as torchrun does: N ranks each spawning one OpenMP thread per core would
            # oversubscribe the host many times over (torch and BLAS read this)
            env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def run(self) -> int:
        with routed_signals(self.pending_signals) as wait_fd:
            try:
                self._spawn_all()
            except _ExportError as e:
                print(f"{PROG}: -x {e.args[0]}: not set in this environment (use -x VAR=VALUE)",
                      file=sys.stderr)
                self._stop(self._alive(), signal.SIGKILL)
                self._reap_all_blocking()
                return 2
            except OSError as e:
                cmd = " ".join(self.opts.command)
                print(f"{PROG}: cannot start {cmd!r}: {e}", file=sys.stderr)
                self._stop(self._alive(), signal.SIGKILL)
                self._reap_all_blocking()
                return 127 if isinstance(e, FileNotFoundError) else 126
            code, summary = self._supervise(wait_fd)
        self._join_readers()  # let tagged output drain before the summary line
        if summary:
            print(f"{PROG}: {summary}", file=sys.stderr, flush=True)
        return code

    # -- starting ------------------------------------------------------------------------

    def _spawn_all(self) -> None:
        cpus = [cpu_for(self.opts, local) for local in range(self.opts.nproc)]
        say_binding(self.opts, cpus)
        self.cpus = cpus
        for local in range(self.opts.nproc):
            self._spawn(local)

    def _spawn(self, local: int, extra: dict[str, str] | None = None) -> None:
        # ranks run unbuffered whenever we pump stderr, so stdout is pumped too: an
        # unbuffered print() writes its text and its newline separately, and ranks
        # sharing one stdout would interleave mid-line
        pipe_out = subprocess.PIPE if self.opts.tag_output or self.tag_err else None
        pipe_err = subprocess.PIPE if self.tag_err else None
        env = {**self.env_for(local), **(extra or {})}
        proc = subprocess.Popen(
            self.opts.command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=pipe_out,
            stderr=pipe_err,
            preexec_fn=child_setup(os.getpid(), self.cpus[local]),  # see there
        )
        r = _Rank(self.opts.node_rank * self.opts.nproc + local, local, proc)
        self.ranks.append(r)
        prefix = f"[{r.rank}] ".encode()
        out_prefix = prefix if self.opts.tag_output else b""
        for src, dst, pre, keep in ((proc.stdout, sys.stdout, out_prefix, None),
                                    (proc.stderr, sys.stderr, prefix, r.lines)):
            if src is None:
                continue
            t = threading.Thread(target=self._pump, args=(src, dst, pre, keep),
                                 daemon=True)
            t.start()
            r.readers.append(t)

    def _restart(self, dead: list[_Rank]) -> None:
        """``--max-restarts``: start a replacement for each dead rank while the budget
        lasts; it joins the running job (``RINGTREE_JOIN=1``: ``ringtree.init`` takes
        the seat the survivors offer, :mod:`ringtree.resilience.replace`)."""
        for r in dead:
            if self.restarts >= self.opts.max_restarts:
                return
            self.restarts += 1
            with self.out_lock:
                print(f"{PROG}: rank {r.rank} (pid {r.proc.pid}) {how(r.code)}; starting a "
                      f"replacement (restart {self.restarts} of {self.opts.max_restarts})",
                      file=sys.stderr, flush=True)
            self._spawn(r.local_rank, {"RINGTREE_JOIN": "1",
                                       "RINGTREE_RESTART": str(self.restarts)})

    def _pump(self, src: IO[bytes], dst: IO[str], prefix: bytes,
              keep: deque | None = None) -> None:
        """Copy ``src`` to ``dst`` line by line with ``prefix``; keep draining if dst breaks.
        ``keep``: remember the last lines (for the failure report)."""
        out = getattr(dst, "buffer", None)
        broken = False
        for line in iter(src.readline, b""):
            if keep is not None:
                keep.append(line.rstrip(b"\n").decode("utf-8", "replace"))
            if broken:
                continue
            if not line.endswith(b"\n"):
                line += b"\n"
            try:
                with self.out_lock:
                    if out is not None:
                        out.write(prefix + line)
                    else:
                        dst.write((prefix + line).decode("utf-8", "replace"))
                    dst.flush()
            except (OSError, ValueError):
                broken = True  # e.g. `ringtree run ... | head`
        src.close()

    def _join_readers(self) -> None:
        deadline = time.monotonic() + 2.0  # a rank's orphaned children may hold the pipe open
        for r in self.ranks:
            for t in r.readers:
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- supervising ---------------------------------------------------------------------

    def _supervise(self, wait_fd: int | None) -> tuple[int, str]:
        """Wait for the ranks; return the exit code and the summary line (or "")."""
        o = self.opts
        deadline = self.start + o.timeout if o.timeout is not None else None
        failure: tuple[_Rank, int] | None = None  # first failing rank, and how many we stopped
        got_signal: int | None = None
        timed_out: list[_Rank] | None = None
        kill_at: float | None = None
        stop_at: float | None = None  # when the ranks left after a failure are stopped
        stopping = False              # they were: a rank that goes now was stopped

        while True:
            now = time.monotonic()
            exited = []
            running = len(self._alive())
            for r in self._alive():
                r.code = r.proc.poll()
                if r.code is not None:
                    exited.append(r)
                    r.exit = Exit(r.rank, r.proc.pid, r.code, now - self.start, running - 1,
                                  stopped=stopping)
            alive = self._alive()
            bad = [r for r in exited if r.code != 0]
            if bad and failure is None and got_signal is None and timed_out is None:
                failure = (bad[0], 0)
                if not o.enable_recovery:  # else the survivors go on (they shrink)
                    stop_at = now + SETTLE
            if stop_at is not None and (now >= stop_at or not alive):
                failure, stop_at, stopping = (failure[0], len(alive)), None, True
                self._stop(alive, signal.SIGTERM)
                kill_at = now + o.grace
            if bad and o.enable_recovery and got_signal is None and timed_out is None:
                self._restart(bad)
                alive = self._alive()
            if not alive:
                break

            sig = self._take_signals(alive, got_signal is not None or failure is not None
                                     or timed_out is not None)
            got_signal = got_signal if sig is None else sig

            if deadline is not None and now >= deadline and timed_out is None and failure is None \
                    and got_signal is None:
                timed_out = alive
                self._stop(alive, signal.SIGTERM)
                kill_at = now + o.grace
            if kill_at is not None and now >= kill_at:
                self._stop(alive, signal.SIGKILL)
                kill_at = None

            wake = [1.0]
            if stop_at is not None:
                wake.append(stop_at - now)
            if kill_at is not None:
                wake.append(kill_at - now)
            if deadline is not None and timed_out is None:
                wake.append(deadline - now)
            sleep_on(wait_fd, max(0.0, min(wake)))

        return self._outcome(failure, timed_out, got_signal)

    def _take_signals(self, alive: list[_Rank], stopping: bool) -> int | None:
        """Handle the signals received: SIGUSR1 is passed on; the first SIGINT/SIGTERM is
        forwarded (returned); another, or one while stopping, kills the ranks."""
        first = None
        while self.pending_signals:
            sig = self.pending_signals.pop(0)
            if sig == signal.SIGUSR1:  # "dump your flight recorders": pass it on
                for r in alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(r.proc.pid, sig)
                continue
            if not stopping:
                stopping, first = True, sig
                with self.out_lock:
                    print(f"{PROG}: got {signal.Signals(sig).name}, forwarded it to "
                          f"{plural(len(alive), 'rank')} (send it again to kill them)",
                          file=sys.stderr, flush=True)
                self._stop(alive, sig)
            else:  # impatient user, or already stopping: no more waiting
                self._stop(alive, signal.SIGKILL)
        return first

    def _outcome(self, failure: tuple[_Rank, int] | None, timed_out: list[_Rank] | None,
                 got_signal: int | None) -> tuple[int, str]:
        """The exit code and summary line once every rank is gone."""
        o = self.opts
        if failure is not None:
            r, stopped = failure
            rc = r.code if r.code is not None else 1
            code = 128 - rc if rc < 0 else rc
            self._join_readers()
            for x in self.ranks:
                if x.exit is not None:
                    x.exit.lines = x.lines
            exits = [x.exit for x in self.ranks if x.exit is not None]
            return code, report(exits, r.exit or Exit(r.rank, r.proc.pid, rc, 0.0, 0), stopped,
                                self._abort_line(), self.tag_err, every=o.enable_recovery)
        if timed_out is not None:
            names = ", ".join(str(r.rank) for r in timed_out)
            return 124, f"timed out after {o.timeout:g}s; stopped the ranks still running: {names}"
        if got_signal is not None:
            return 128 + got_signal, ""
        return 0, ""

    def _abort_line(self) -> str | None:
        """The world communicator's abort line in our store: who the ranks blamed."""
        if self.server is None:
            return None
        raw = self.server.peek("rt/world/abort")
        return raw.decode("utf-8", "replace") if raw else None

    def _alive(self) -> list[_Rank]:
        return [r for r in self.ranks if r.code is None]

    def _stop(self, ranks: list[_Rank], sig: int) -> None:
        signal_groups([r.proc for r in ranks], sig)

    def _reap_all_blocking(self) -> None:
        for r in self.ranks:
            if r.code is None:
                r.code = r.proc.wait()


class _ExportError(Exception):
    pass
