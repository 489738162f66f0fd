"""What ``ringtree run`` says when a job fails: the root cause, as torchrun's elastic agent
does ("Root Cause (first observed failure)"), not merely the first non-zero exit code.

The root cause is, first match wins:

1. the rank the ranks themselves blamed: the communicator's abort line in the launcher's
   store names the rank that died, was stopped or hung ("culprit: rank 2", "rank 2 died
   or closed its connection") — ringtree ranks write it before they give up;
2. otherwise the first rank to fail in time (non-zero exit or a signal), or one that left
   early with code 0 while the others were still running and then failed.

The report then shows that rank's and the first failing rank's last lines of stderr, each
line tagged ``[rank]``.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

_CULPRIT = re.compile(r"culprit: rank (\d+)")
_NAMED = re.compile(r"rank (\d+)(?: died|, which hosts the store, is gone| called abort"
                    r"| is gone| was started twice)")
# seconds between the first failure and SIGTERM to the ranks still running: a rank that
# called sys.exit(0) mid-job closes its connections in its exit handlers, its peers fail
# on it at once, and on a loaded host the first of them could exit before it did; it was
# then stopped by the launcher and reported as stuck instead of as the rank that left
SETTLE = 1.0
LAST_LINES = 12


@dataclass
class Exit:
    rank: int
    pid: int
    code: int
    at: float                    # seconds since the job started
    others_running: int          # ranks still running when it exited
    stopped: bool = False        # it went when ringtree run stopped the job
    lines: deque = field(default_factory=lambda: deque(maxlen=LAST_LINES))


def how(code: int) -> str:
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def blamed_rank(abort_line: str | None) -> int | None:
    """The rank an abort line names as the cause, if it names one."""
    if not abort_line:
        return None
    first = abort_line.strip().splitlines()[0]  # the error itself, before any report
    m = _NAMED.search(first) or _CULPRIT.search(abort_line)
    return int(m.group(1)) if m else None


def root_cause(exits: list[Exit], abort_line: str | None) -> Exit | None:
    """The exit to blame (see the module docstring); None if nothing failed."""
    by_rank: dict[int, Exit] = {}
    for e in exits:  # a replaced rank (--max-restarts): its failed incarnation
        if e.rank not in by_rank or by_rank[e.rank].code == 0:
            by_rank[e.rank] = e
    failed = [e for e in exits if e.code != 0]
    if not failed:
        return None
    named = blamed_rank(abort_line)
    if named is not None and named in by_rank:
        return by_rank[named]
    first_bad = min(failed, key=lambda e: e.at)
    early = [e for e in exits if e.code == 0 and e.at < first_bad.at and e.others_running]
    return min(early, key=lambda e: e.at) if early and abort_line else first_bad


def report(exits: list[Exit], first_bad: Exit, stopped: int, abort_line: str | None,
           captured: bool, every: bool = False) -> str:
    """The summary: one ``ringtree run:`` line, then the root-cause block; ``every``
    (``--enable-recovery``: the others ran on) adds how every rank ended."""
    root = root_cause(exits, abort_line) or first_bad
    tail = f"; stopped the other {stopped} rank{'s' if stopped != 1 else ''}" if stopped else ""
    head = f"rank {first_bad.rank} (pid {first_bad.pid}) {how(first_bad.code)}{tail}"
    lines = [head]
    what = f"rank {root.rank} (pid {root.pid})"
    if root.stopped:
        what += f" — named by the other ranks; it {how(root.code)} only when ringtree run " \
                "stopped the job (stuck or stopped?)"
    elif root is not first_bad:
        what += f" {how(root.code)} at +{root.at:.2f}s, while {root.others_running} other " \
                "rank(s) were still running"
    else:
        what += f" {how(root.code)} at +{root.at:.2f}s"
    lines.append(f"  root cause (first failure): {what}")
    if abort_line:
        first = abort_line.strip().splitlines()[0]
        lines.append(f"  the ranks recorded: {first[:400]}")
    if every:
        bad = [e for e in sorted(exits, key=lambda e: e.rank) if e.code != 0]
        ok = len(exits) - len(bad)
        lines.append(f"  with --enable-recovery the others ran on: {ok} rank(s) exited with "
                     f"code 0; failed: " + "; ".join(f"rank {e.rank} {how(e.code)} at "
                                                     f"+{e.at:.2f}s" for e in bad))
    if captured:
        for e in ([root, first_bad] if root is not first_bad else [root]):
            if e.lines:
                lines.append(f"  last lines of rank {e.rank}:")
                lines += [f"    [{e.rank}] {ln}" for ln in e.lines]
    return "\n".join(lines)


def isatty(f) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError):
        return False


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
