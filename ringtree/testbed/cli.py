"""``ringtree testbed``: build namespace hosts, run a command on them, tear them down.

::

    ringtree testbed [--hosts N] [--rate R] [--burst B] [--cpus own|shared] [--on I[,J...]] \
        -- CMD ARGS...
    ringtree testbed [--hosts N] [--rate R] --hold

CMD runs on every host at once (or on those ``--on`` names), each line of its output
prefixed with ``[host]``; the exit code is the first non-zero one. Each host's CMD sees::

    RINGTREE_TESTBED_HOST     this host's index (0..N-1)
    RINGTREE_TESTBED_HOSTS    N
    RINGTREE_TESTBED_ADDRS    every host's address, comma-separated
    RINGTREE_TESTBED_MASTER   host 0's address
    RINGTREE_TOKEN            one random job token for all hosts

e.g. two hosts of two ranks, all-reduce over 1 Gbit/s links::

    ringtree testbed --hosts 2 --rate 1gbit -- sh -c 'ringtree run -n 2 --nnodes 2 \\
        --node-rank $RINGTREE_TESTBED_HOST --master $RINGTREE_TESTBED_MASTER:29500 \\
        ringtree perf all_reduce -b 1M -e 64M'

``--hold`` prints how to enter each host (``nsenter``) and keeps the testbed until Ctrl-C.
Everything is removed on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import subprocess
import sys
import threading

from ringtree.bootstrap import environ
from ringtree.testbed.netns import Testbed, available

PROG = "ringtree testbed"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="namespace hosts on shaped links")
    p.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    p.add_argument("--rate", default="1gbit",
                   help="each link's rate each way, tc units (default 1gbit; 'none': unshaped)")
    p.add_argument("--burst", default=None, help="token bucket burst (bytes or tc units)")
    p.add_argument("--cpus", choices=("own", "shared"), default="own",
                   help="'own' (default): each host's processes are bound to its share of "
                        "the CPUs; 'shared': every host on every CPU")
    p.add_argument("--on", default=None, help="run CMD only on these host indices (0,2)")
    p.add_argument("--hold", action="store_true", help="keep the hosts until Ctrl-C")
    p.add_argument("command", nargs=argparse.REMAINDER, help="command to run on each host")
    return p


def _pump(stream, tag: str, out) -> None:
    for line in iter(stream.readline, b""):
        out.buffer.write(tag.encode() + line)
        out.flush()
    stream.close()


def _hold(tb: Testbed) -> int:
    for h in tb.hosts:
        pin = "" if h.cpus is None else f"taskset -c {','.join(map(str, sorted(h.cpus)))} "
        print(f"{h.name}  {h.addr} on {h.ifname}  enter: nsenter -t {h.pid} -n -u -m "
              f"{pin}bash", flush=True)
    print("Ctrl-C removes the testbed.", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    return 0


def _run(tb: Testbed, which: list[int], command: list[str]) -> int:
    env = environ.child()
    env.update({"RINGTREE_TESTBED_HOSTS": str(len(tb.hosts)),
                "RINGTREE_TESTBED_ADDRS": ",".join(h.addr for h in tb.hosts),
                "RINGTREE_TESTBED_MASTER": tb.hosts[0].addr,
                "RINGTREE_TOKEN": env.get("RINGTREE_TOKEN") or secrets.token_hex(16)})
    procs, pumps = [], []
    for i in which:
        h = tb.hosts[i]
        p = h.popen(command, env={**env, "RINGTREE_TESTBED_HOST": str(i)},
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[{h.name}] ", sys.stdout),
                             daemon=True)
        t.start()
        pumps.append(t)
    code = 0
    for p in procs:
        rc = p.wait()
        if rc and not code:
            code = rc if rc > 0 else 128 - rc
    for t in pumps:
        t.join(timeout=5)
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and not args.hold:
        print(f"{PROG}: give a command to run on the hosts (after --), or --hold",
              file=sys.stderr)
        return 2
    ok, reason = available()
    if not ok:
        print(f"{PROG}: {reason}", file=sys.stderr)
        return 1
    which = list(range(args.hosts))
    if args.on:
        try:
            which = [int(x) for x in args.on.split(",")]
        except ValueError:
            which = [-1]
        if any(not 0 <= i < args.hosts for i in which):
            print(f"{PROG}: --on {args.on!r}: host indices are 0..{args.hosts - 1}",
                  file=sys.stderr)
            return 2
    rate = None if args.rate.lower() == "none" else args.rate
    # SIGTERM unwinds like Ctrl-C, so the finally below removes everything
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with Testbed(args.hosts, rate=rate, burst=args.burst, cpus=args.cpus) as tb:
            return _hold(tb) if args.hold else _run(tb, which, command)
    except KeyboardInterrupt:
        return 130
    except (OSError, RuntimeError, ValueError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
