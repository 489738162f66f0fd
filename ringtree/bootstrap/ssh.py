"""``ringtree run -H host1:4,host2:4 CMD`` / ``--hostfile FILE``: start a job on other hosts
over ``ssh``.

Hosts come in mpirun's ``-H`` syntax (``host[:slots]``, comma-separated, slots default 1) or
an Open MPI hostfile (one host per line, ``host slots=N`` or ``host:N``, ``#`` comments).
Every host runs ``slots`` ranks (the same number on each: ranks are numbered host by host).
For host *i* this launcher runs, over ``$RINGTREE_SSH`` (default ``ssh -o BatchMode=yes``)::

    ssh HOST 'cd CWD; exec PYTHON -m ringtree.bootstrap.ssh --remote'

and writes one JSON line to its stdin: the environment to add (``RINGTREE_*``,
``PYTHONPATH``, ``-x`` variables, and the job's token — so the secret never appears on a
command line) and the per-node launcher to run, ``ringtree run -n SLOTS --nnodes H
--node-rank i --master HOST0:PORT ... CMD``. Host 0's launcher hosts the store
(``--master`` overrides the address and port; the default port is 29500). The same
Python and working directory are assumed on every host, as mpirun assumes the same
installation prefix.

The remote helper keeps watching that stdin: when it closes — this launcher stops the job,
dies, or the connection drops — it stops its node's launcher (SIGTERM, SIGKILL after the
grace period), so no rank outlives the job even though ssh sends no signal of its own. The
first host whose launcher fails stops the others, and its exit code is this launcher's.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from ringtree.bootstrap import environ
from ringtree.settings import current

FORWARD_PREFIXES = ("RINGTREE_",)
FORWARD_NAMES = ("PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS")
_NOT_FORWARDED = {"RINGTREE_RANK", "RINGTREE_WORLD_SIZE", "RINGTREE_LOCAL_RANK",
                  "RINGTREE_LOCAL_WORLD_SIZE", "RINGTREE_NODE_RANK", "RINGTREE_MASTER_ADDR",
                  "RINGTREE_MASTER_PORT", "RINGTREE_STORE_EXTERNAL", "RINGTREE_HOST_ID"}


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """mpirun ``-H``: ``a:2,b:2`` -> ``[("a", 2), ("b", 2)]``; a repeated host adds slots."""
    out: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        host, sep, slots = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        n = _slots(slots, item) if sep else 1
        out[host] = out.get(host, 0) + n
    if not out:
        raise ValueError(f"-H {spec!r}: no hosts")
    return list(out.items())


def _slots(text: str, where: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{where!r}: slots must be a positive integer")
    return n


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """An Open MPI hostfile: ``host``, ``host slots=N [max_slots=M]`` or ``host:N`` lines."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as e:
        raise ValueError(f"--hostfile {path}: {e.strerror}") from None
    items = []
    for k, raw in enumerate(lines, 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        host, slots = words[0], 1
        if ":" in host:
            host, _, s = host.partition(":")
            slots = _slots(s, f"{path}:{k}")
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "slots":
                slots = _slots(value, f"{path}:{k}")
            elif key not in ("max_slots", "max-slots"):
                raise ValueError(f"{path}:{k}: unknown field {w!r} (expected slots=N)")
        items.append(f"{host}:{slots}")
    if not items:
        raise ValueError(f"--hostfile {path}: no hosts")
    return parse_hosts(",".join(items))


def remote_argv(opts, hosts: list[tuple[str, int]], i: int, master: tuple[str, int]) -> list[str]:
    """The per-node ``ringtree run`` host ``i`` runs."""
    argv = [sys.executable, "-m", "ringtree.cli", "run", "-n", str(hosts[i][1]),
            "--nnodes", str(len(hosts)), "--node-rank", str(i),
            "--master", f"{master[0]}:{master[1]}", "--grace", str(opts.grace)]
    if opts.tag_output:
        argv.append("--tag-output")
    if opts.timeout is not None:
        argv += ["--timeout", str(opts.timeout)]
    if opts.bind_to != "none":
        argv += ["--bind-to", opts.bind_to]
    if getattr(opts, "check_net", False):
        argv.append("--check-net")
    if getattr(opts, "enable_recovery", False):
        argv.append("--enable-recovery")
    if getattr(opts, "max_restarts", 0):
        argv += ["--max-restarts", str(opts.max_restarts)]
    return [*argv, "--", *opts.command]


def forwarded_env(opts, token: str) -> dict[str, str]:
    env = {k: v for k, v in environ.view().items()
           if (k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES) and k not in _NOT_FORWARDED}
    for var, value in opts.export.items():
        v = environ.get(var) if value is None else value
        if v is not None:
            env[var] = v
    env["RINGTREE_TOKEN"] = token
    return env


def launch(opts, prog: str) -> int:
    """Run the job on ``opts.hosts`` over ssh; the exit code of the first failure."""
    hosts = opts.hosts
    if len({s for _, s in hosts}) != 1:
        print(f"{prog}: every host needs the same number of slots (ranks are numbered host by "
              f"host); got {', '.join(f'{h}:{s}' for h, s in hosts)}", file=sys.stderr)
        return 2
    s = current()
    master = opts.master or (hosts[0][0], s.master_port or 29500)
    token = s.token or secrets.token_hex(16)
    ssh = shlex.split(s.ssh or "ssh -o BatchMode=yes")
    remote = f"cd {shlex.quote(os.getcwd())} 2>/dev/null; exec {shlex.quote(sys.executable)}" \
             " -m ringtree.bootstrap.ssh --remote"
    procs: list[subprocess.Popen] = []
    stop = threading.Event()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    got: list[int] = []
    for s in old:
        signal.signal(s, lambda signum, _f: (got.append(signum), stop.set()))
    try:
        for i, (host, _) in enumerate(hosts):
            try:
                p = subprocess.Popen([*ssh, host, remote], stdin=subprocess.PIPE,
                                     start_new_session=True)
            except OSError as e:
                print(f"{prog}: cannot run {ssh[0]!r}: {e}", file=sys.stderr)
                _stop(procs, opts.grace)
                return 127
            procs.append(p)
            line = json.dumps({"env": forwarded_env(opts, token),
                               "argv": remote_argv(opts, hosts, i, master),
                               "grace": opts.grace}) + "\n"
            try:
                _stdin(p).write(line.encode())
                _stdin(p).flush()
            except OSError:
                pass  # ssh already failed: its exit code says why
        first: tuple[int, int] | None = None
        while not stop.is_set():
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            done = all(c is not None for c in codes)
            if bad and (done or not getattr(opts, "enable_recovery", False)):
                first = bad[0]  # with recovery, the other hosts' ranks ran on until now
                break
            if done:
                return 0
            stop.wait(0.1)
        _stop(procs, opts.grace)
        if first is not None:
            i, code = first
            print(f"{prog}: host {hosts[i][0]} (node {i}) exited with code {code}; stopped "
                  "the other hosts", file=sys.stderr)
            return code if code > 0 else 128 - code
        return 128 + got[0] if got else 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _stdin(p: subprocess.Popen) -> IO[bytes]:
    """The pipe to a remote's helper (every remote is started with ``stdin=PIPE``)."""
    assert p.stdin is not None
    return p.stdin


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    """Close every remote's stdin (its helper then stops its launcher), wait, then kill."""
    for p in procs:
        try:
            _stdin(p).close()
        except OSError:
            pass
    deadline = time.monotonic() + grace + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---- on the remote host -----------------------------------------------------------------

def remote() -> int:
    """Read the job line from stdin, run the node's launcher, stop it when stdin closes."""
    line = b""
    while not line.endswith(b"\n"):  # unbuffered: the rest of stdin is the watcher's
        chunk = os.read(0, 1)
        if not chunk:
            return 1
        line += chunk
    job = json.loads(line)
    env = environ.child(job["env"])
    child = subprocess.Popen(job["argv"], env=env, stdin=subprocess.DEVNULL)
    grace = float(job.get("grace", 3.0))

    def watch() -> None:
        while os.read(0, 4096):
            pass
        if child.poll() is None:  # the job was stopped, or its launcher vanished
            child.terminate()
            try:
                child.wait(timeout=grace + 5)
            except subprocess.TimeoutExpired:
                child.kill()

    threading.Thread(target=watch, daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    if sys.argv[1:] != ["--remote"]:
        sys.exit(2)
    code = remote()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if code >= 0 else 128 - code)  # the watcher may still sit in read(2)
