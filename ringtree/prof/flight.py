"""The flight recorder: the last N operations of every communicator, always on.

Modelled on torch's flight recorder (``TORCH_FR_BUFFER_SIZE``; entries with
``collective_seq_id``, ``profiling_name``, sizes, dtypes, ``state`` scheduled → started →
completed and their timestamps), so the mental model carries over. Costs about a
microsecond per operation: one small record per call in a ring, three timestamps.

What a rank is doing *right now* comes from three places, read only when someone asks:
the ring (last enqueued / started / completed sequence numbers), the executor's list of
requests it is blocked on (refreshed once a second while it waits: which step of which
channel, waiting to receive from or send to which peer, how many bytes have moved), and
the main thread's Python stack (a rank that never called the collective is somewhere
else: that place is named).

Dumps (one JSON file per process, ``fr_rank<R>.json``) are written on timeout, on
``SIGUSR1``, when another rank's doctor asks for them, or on demand
(:func:`ringtree.prof.dump_flight_recorder`). ``ringtree doctor DIR`` reads them.

Environment: ``RINGTREE_FR_BUFFER_SIZE`` (entries per communicator, default 1024, 0 turns
the recorder off), ``RINGTREE_FR_DUMP_DIR`` (default: ``RINGTREE_PROFILE`` if set, else
``$TMPDIR/ringtree-fr-<job>``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import weakref
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringtree.ir.wire import WireHeader
from ringtree.runtime.plan import DescAt

DEFAULT_SIZE = 1024
VERSION = 1
STATES = ("scheduled", "started", "completed", "failed")

# Every live communicator of this process (for process-wide dumps and the watcher).
COMMS: weakref.WeakSet = weakref.WeakSet()

_dump_lock = threading.RLock()  # re-entrant: SIGUSR1 may land inside a dump
_PROF_DIR = os.path.dirname(os.path.abspath(__file__))
_PKG_DIR = os.path.dirname(_PROF_DIR)


@dataclass(slots=True, eq=False)
class Entry:
    """One operation: what it is, its state (an index into :data:`STATES`), when it was
    created, started and completed (``time.time_ns()``), its error, and for a
    point-to-point operation the peer (-1 for collectives)."""

    desc: Any
    state: int
    created_ns: int
    started_ns: int = 0
    completed_ns: int = 0
    error: str | None = None
    peer: int = -1


class FlightRecorder:
    """Ring of the last ``size`` :class:`Entry`.

    The LL all-reduce's hot path records from C (``Round.hot`` in
    ``ringtree/transports/_llc.c``, bound by :meth:`lane`): its slot in ``ring`` holds
    the call's :class:`~ringtree.runtime.plan.Desc` template and row ``marks[slot]`` its
    sequence number, state and times, and it keeps its own four counters in ``native``
    (entries made, last sequence number enqueued, started, completed) beside Python's
    attributes (``enq``, ``sta``, ``com``: attribute stores cost Python a tenth of an
    array's); the properties combine the two and the readers (:meth:`entry`) turn a
    C-recorded slot into an :class:`Entry`. The entries Python made are ``native[4]``,
    which the C entries read for the next slot (an attribute read from C cost 25 ns of
    every hot call; Python makes entries on its general path only)."""

    def __init__(self, size: int = DEFAULT_SIZE):
        self.size = max(1, int(size))
        self.ring: list[Any] = [None] * self.size
        self.enq = self.sta = self.com = 0
        self.native = array("q", bytes(40))
        self.marks = np.zeros((self.size, 4), np.int64)  # seq, state, created, completed

    @property
    def count(self) -> int:
        """Operations recorded so far."""
        return self.native[4] + self.native[0]

    @property
    def last_enqueued(self) -> int:
        return max(self.enq, self.native[1])

    @property
    def last_started(self) -> int:
        return max(self.sta, self.native[2])

    @property
    def last_completed(self) -> int:
        return max(self.com, self.native[3])

    def lane(self) -> tuple:
        """What the compiled round writes: (ring, marks, native)."""
        return self.ring, self.marks, self.native

    def entry(self, i: int) -> Entry | None:
        """Operation ``i`` (``count - size <= i < count``), a C-recorded slot as an Entry."""
        e = self.ring[i % self.size]
        if e is None or type(e) is Entry:
            return e
        seq, state, created, completed = (int(v) for v in self.marks[i % self.size])
        return Entry(DescAt(e, seq), state, created, created, completed)

    def end_native(self, error: BaseException | None = None) -> None:
        """Close the newest operation, recorded by the compiled round, which returned
        before it completed (the rest of its wait ran in Python)."""
        i = (self.count - 1) % self.size
        if error is None:
            self.marks[i, 1], self.marks[i, 3] = 2, time.time_ns()
            self.native[3] = int(self.marks[i, 0])
        else:
            e = self.entry(i)
            e.state, e.error = 3, _error_line(error)
            self.ring[i] = e

    def _keep(self, e: Entry) -> None:
        """Put an entry Python made in the ring's next slot (after the C entries' ones)."""
        native = self.native
        self.ring[(native[4] + native[0]) % self.size] = e
        native[4] += 1

    # ---- hooks (Communicator._run / _submit) ----------------------------------------------

    def scheduled(self, call) -> Entry:
        d = call.desc
        peer = -1
        if d.algo == "p2p":
            st = call.steps[0][0].step
            peer = (st.send_to or st.recv_from)[0]
        else:
            self.enq = d.seq
        e = Entry(d, 0, time.time_ns(), peer=peer)
        self._keep(e)
        call.fr = e
        return e

    def started(self, calls) -> None:
        t = time.time_ns()
        for call in calls:
            e = call.fr if call.fr is not None else self.scheduled(call)
            e.state, e.started_ns = 1, t
            if e.peer < 0:
                self.sta = max(self.sta, e.desc.seq)

    def finished(self, calls, error: BaseException | None = None) -> None:
        t = time.time_ns()
        for call in calls:
            e = call.fr
            if e is None:
                continue
            if error is None:
                e.state, e.completed_ns = 2, t
                if e.peer < 0:
                    self.com = max(self.com, e.desc.seq)
            else:
                e.state, e.error = 3, _error_line(error)

    def begin(self, desc) -> Entry:
        """A call that runs outside the executor (LL) starts now: one entry, already
        started (``desc`` has the fields of :class:`~ringtree.runtime.plan.Desc`)."""
        t = time.time_ns()
        e = Entry(desc, 1, t, t)
        self._keep(e)
        self.enq = self.sta = desc.seq
        return e

    def end(self, e: Entry, error: BaseException | None = None) -> None:
        if error is None:
            e.state, e.completed_ns = 2, time.time_ns()
            self.com = e.desc.seq
        else:
            e.state, e.error = 3, _error_line(error)

    # ---- reading ------------------------------------------------------------------------

    def entries(self, last: int | None = None) -> list[dict]:
        n = min(self.count, self.size)
        if last is not None:
            n = min(n, last)
        out = []
        for i in range(self.count - n, self.count):
            e = self.entry(i)
            if e is not None:
                out.append(entry_dict(e, i))
        return out

    def current(self) -> Entry | None:
        """The operation a hang is in: the oldest one started and not finished, else the
        newest one if it failed (the communicator broke inside it)."""
        n = min(self.count, self.size)
        for i in range(self.count - n, self.count):
            e = self.entry(i)
            if e is not None and e.state == 1:
                return e
        last = self.entry(self.count - 1) if self.count else None
        return last if last is not None and last.state == 3 else None


def _error_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".split("\n")[0][:300]


def entry_dict(e: Entry, record_id: int) -> dict:
    d = e.desc
    p2p = e.peer >= 0
    return {
        "record_id": record_id,
        "collective_seq_id": 0 if p2p else d.seq,
        "p2p_seq_id": d.seq if p2p else 0,
        "profiling_name": f"ringtree:{d.name}",
        "name": d.name, "algo": d.algo, "proto": d.protocol, "count": d.count,
        "dtype": d.dtype, "op": d.op,
        "root": d.root, "peer": e.peer if p2p else None, "is_p2p": p2p,
        "state": STATES[e.state],
        "time_created_ns": e.created_ns, "time_discovered_started_ns": e.started_ns,
        "time_discovered_completed_ns": e.completed_ns, "error": e.error,
    }


# ---- a rank's status (what the doctor gathers) ------------------------------------------

def where_main_thread() -> str:
    """``file:line in func`` of the main thread's innermost frame outside ringtree (and
    the innermost ringtree frame, profiler frames aside, if it is inside ringtree)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    inner = None
    while frame is not None:
        fn = os.path.abspath(frame.f_code.co_filename)
        here = f"{os.path.basename(fn)}:{frame.f_lineno} in {frame.f_code.co_name}"
        if not fn.startswith(_PKG_DIR):
            return f"{here} (inside ringtree: {inner})" if inner else here
        if inner is None and not fn.startswith(_PROF_DIR):
            inner = here
        frame = frame.f_back
    return inner or "unknown"


def _waiting(comm, cur: Entry | None) -> list[dict]:
    waiting = comm.executor.snapshot()
    if cur is None or not waiting:
        return []
    out = []
    for w in sorted(waiting, key=lambda w: w.cs.gid):
        req, cs, call = w.req, w.cs, w.call
        if call.desc is not cur.desc or req is None or (req.done and req.error is None):
            continue
        nbytes = WireHeader.payload_bytes(bytes(req.header))
        out.append({
            "error": str(req.error).split("\n")[0][:200] if req.error is not None else None,
            "seq": call.desc.seq, "name": call.desc.name,
            "channel": call.channel_base + cs.channel, "step": cs.gid,
            "nsteps": sum(len(c) for c in call.steps), "prim": cs.step.name,
            "peer": req.peer, "op": "send" if req.is_send else "recv",
            "bytes_done": max(0, min(req.pos, nbytes)), "bytes": nbytes,
        })
    return out


def status(comm, entries: int | None = 8, closed: bool = False) -> dict:
    """What this rank of ``comm`` is doing, as a JSON-able dict."""
    fr: FlightRecorder | None = getattr(comm, "flight", None)
    cur = fr.current() if fr is not None else None
    health = comm.health
    broken = health.broken
    state = "closed" if closed else "broken" if broken is not None else \
        "in_operation" if cur is not None else "idle"
    return {
        "version": VERSION,
        "rank": comm.rank, "size": comm.size, "comm": comm.prefix,
        "world_rank": comm.world_ranks[comm.rank], "host": socket.gethostname(),
        "pid": os.getpid(), "time_ns": time.time_ns(), "state": state,
        "last_enqueued": fr.last_enqueued if fr else None,
        "last_started": fr.last_started if fr else None,
        "last_completed": fr.last_completed if fr else None,
        "current": entry_dict(cur, -1) if cur is not None else None,
        "waiting": _waiting(comm, cur),
        "where": where_main_thread(),
        "error": str(broken).split("\n")[0][:300] if broken is not None else None,
        "after_abort": (health.after_abort or "")[:300] or None,
        "failing": health.failing,
        "timeout_s": comm.timeout,
        "stale_dropped": comm.fabric.stale(),
        "entries": fr.entries(entries) if fr is not None else [],
    }


# ---- dumps -----------------------------------------------------------------------------

def job_id(comm) -> str:
    return hashlib.sha256(comm.secret).hexdigest()[:8]


def dump_dir(comm=None) -> str:
    from ringtree.settings import current

    s = current()
    d = s.fr_dump_dir or s.profile
    if d:
        return d
    comm = comm if comm is not None else next(iter(list(COMMS)), None)
    job = job_id(comm) if comm is not None else str(os.getpid())
    return os.path.join(tempfile.gettempdir(), f"ringtree-fr-{job}")


def dump(directory: str | None = None, reason: str = "on demand", comms=None) -> str | None:
    """Write ``fr_rank<R>.json`` (every live communicator of this process); its path."""
    comms = [c for c in (comms if comms is not None else list(COMMS))]
    if not comms:
        return None
    directory = directory or dump_dir(comms[0])
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        if os.path.dirname(os.path.abspath(directory)) == os.path.abspath(
                tempfile.gettempdir()):
            prune_dumps(keep=directory)
    world = min(comms, key=lambda c: len(c.prefix))
    wr = world.world_ranks[world.rank]
    doc = {"version": VERSION, "world_rank": wr, "pid": os.getpid(),
           "host": socket.gethostname(), "reason": reason, "time_ns": time.time_ns(),
           "comms": [status(c, entries=None) for c in comms]}
    path = os.path.join(directory, f"fr_rank{wr}.json")
    with _dump_lock:  # the watcher thread and the main thread may dump at once
        fd, tmp = tempfile.mkstemp(prefix=f".fr_rank{wr}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, path)
    return path


_IN_USE = 3600.0


def prune_dumps(keep: str | None = None, now: float | None = None) -> list[str]:
    """Retention of the default dump directories (``$TMPDIR/ringtree-fr-<job>``): keep the
    newest ``RINGTREE_FR_KEEP`` (default 10) of this user's, and none older than
    ``RINGTREE_FR_KEEP_DAYS`` (default 7) days; ``keep`` and directories touched in the
    last hour (a job may still be writing or reading them) are never removed. Runs when a job
    creates its dump directory; returns what it removed. Directories given with
    ``RINGTREE_FR_DUMP_DIR`` are the user's and never touched."""
    import glob
    import shutil

    from ringtree.settings import current

    limit = max(1, current().fr_keep)
    max_age = current().fr_keep_days * 86400
    now = time.time() if now is None else now
    mine = []
    for d in glob.glob(os.path.join(tempfile.gettempdir(), "ringtree-fr-*")):
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if os.path.isdir(d) and not os.path.islink(d) and st.st_uid == os.getuid() \
                and (keep is None or os.path.abspath(d) != os.path.abspath(keep)):
            mine.append((st.st_mtime, d))
    mine.sort(reverse=True)
    room = limit - (1 if keep is not None else 0)
    removed = []
    for i, (mtime, d) in enumerate(mine):
        if (i >= room and now - mtime > _IN_USE) or now - mtime > max_age:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _on_sigusr1(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    try:
        path = dump(reason="SIGUSR1")
        print(f"ringtree: flight recorder written to {path}", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - never kill the process from a handler
        print(f"ringtree: flight recorder dump failed: {e}", file=sys.stderr, flush=True)


def install_sigusr1() -> bool:
    """Dump on SIGUSR1, unless the program handles that signal itself (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None, _on_sigusr1):
            return False
        signal.signal(signal.SIGUSR1, _on_sigusr1)
        return True
    except (ValueError, OSError, AttributeError):
        return False
