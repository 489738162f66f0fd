"""Shared-memory segments in ``/dev/shm``, owned by ringtree (not by ``multiprocessing``).

Why not ``multiprocessing.shared_memory``: its resource tracker unlinks every segment a
process attached to when that process exits, and cannot be told not to before Python 3.13
(bpo-38119). We create plain files in ``/dev/shm`` and map them ourselves.

Life cycle of a segment, chosen so that nothing is left behind even after ``kill -9``:

1. *create*: write ``<name>.tmp<pid>``, size it, initialise it, then ``link`` it to
   ``<name>``. ``link`` fails if the name exists, so when two processes race to create the
   same segment exactly one wins and the other maps the winner's file.
2. *attach*: every other party opens ``<name>`` and maps it.
3. *unlink early*: once every party has it mapped, the name is removed. The memory lives
   on until the last mapping goes away — which the kernel does for us when a process dies.

Between 1 and 3 a crash can leave a name behind. Every name therefore carries the pids of
the processes it belongs to (``-p<pid>``) and the pid namespace they live in
(``-n<inode>``); :func:`clean_stale` (run when a transport starts) unlinks names whose
pids are all gone.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "ringtree-"
_PID = re.compile(r"(?:-p|\.tmp)(\d+)")
_NS = re.compile(r"-n([0-9a-f]+)")


def pid_namespace() -> str:
    """Hex inode of this process's pid namespace (pids mean nothing outside it)."""
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        return "0"


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is dead.

    A zombie (killed, not yet reaped) counts as dead. Comparing start times tells a live
    peer from an unrelated process that got its pid later.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    if not fields or fields[0] in (b"Z", b"X", b"x"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int, started: int | None = None) -> bool:
    """True if ``pid`` runs (and, if ``started`` is given, is still the same process)."""
    st = start_time(pid)
    return st is not None and (started is None or st == started)


def gone(p: PeerInfo, me: PeerInfo) -> bool:
    """``p`` runs in ``me``'s pid namespace and its process is gone (a pid in another
    namespace cannot be looked at: never gone)."""
    return p.ns == me.ns and not alive(p.pid, p.start)


@dataclass(frozen=True)
class PeerInfo:
    """A process of the job: its rank, pid, start time (see :func:`start_time`) and pid
    namespace."""

    rank: int
    pid: int
    start: int | None
    ns: str


_FENCE = threading.Lock()


def fence() -> None:
    """A full memory barrier: an uncontended lock acquire/release is a locked
    read-modify-write (``lock cmpxchg`` on x86-64), which orders a store before a later
    load — what the sleep/wake handshake needs (Dekker)."""
    _FENCE.acquire()
    _FENCE.release()


def path_of(name: str) -> str:
    return os.path.join(SHM_DIR, name)


class Segment:
    """A ``/dev/shm`` file mapped read-write; ``array`` is a plain uint8 ndarray over it."""

    def __init__(self, name: str, fd: int, size: int, created: bool):
        self.name = name
        self.size = size
        self.created = created
        try:  # pages are allocated on first touch: a ring used for small messages only
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)  # costs a few pages
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.mm, dtype=np.uint8)
        self.linked = created

    @classmethod
    def create_or_attach(cls, name: str, size: int, init=None) -> Segment:
        """Map ``name``, creating it (``init(array)`` before anyone can see it) if absent."""
        seg = cls.attach(name)
        if seg is not None:
            return seg
        tmp = path_of(f"{name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            seg = cls(name, fd, size, True)
            if init is not None:
                init(seg.array)
            try:
                os.link(tmp, path_of(name))
            except FileExistsError:
                seg = None  # lost the race: use the winner's
        finally:
            _unlink(tmp)
        if seg is None:
            seg = cls.attach(name)
            if seg is None:
                raise FileNotFoundError(errno.ENOENT, "shared-memory segment vanished",
                                        path_of(name))
        return seg

    @classmethod
    def attach(cls, name: str) -> Segment | None:
        """Map an existing ``name``; None if it does not exist (yet)."""
        try:
            fd = os.open(path_of(name), os.O_RDWR)
        except FileNotFoundError:
            return None
        size = os.fstat(fd).st_size
        return cls(name, fd, size, False)

    def unlink(self) -> None:
        """Remove the name (mappings stay valid)."""
        _unlink(path_of(self.name))
        self.linked = False

    def words(self, offset: int = 0, nbytes: int | None = None) -> memoryview:
        """An int64 view (``memoryview`` indexing is the fastest scalar access from Python)."""
        end = self.size if nbytes is None else offset + nbytes
        return memoryview(self.mm)[offset:end].cast("q")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def clean_stale(prefix: str = PREFIX) -> list[str]:
    """Unlink ringtree names in ``/dev/shm`` whose processes are all dead (same pid
    namespace only). Returns the names removed."""
    ns = pid_namespace()
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        m = _NS.search(name)
        if m is None or m.group(1) != ns:
            continue
        pids = [int(p) for p in _PID.findall(name)]
        if pids and not any(alive(p) for p in pids):
            try:
                os.unlink(path_of(name))
                removed.append(name)
            except OSError:
                pass
    return removed


# ---- names --------------------------------------------------------------------------


def rank_name(tag: str, kind: str, rank: int, pid: int, ns: str) -> str:
    """A per-rank object of communicator ``tag`` (``kind``: "db" doorbell words, "bell"
    doorbell pipe)."""
    return f"{PREFIX}{tag}-{kind}{rank}-p{pid}-n{ns}"


def ring_name(tag: str, src: int, dst: int, channel: int, src_pid: int, dst_pid: int,
              ns: str) -> str:
    """The ring carrying ``src`` → ``dst`` messages on ``channel``."""
    return f"{PREFIX}{tag}-{src}to{dst}c{channel}-p{src_pid}-p{dst_pid}-n{ns}"


_RING = re.compile(r"\d+to\d+c\d+-p\d+-p(\d+)-n[0-9a-f]+(?:(\.tmp)(\d+))?$")


def remove_names(tag: str, pid: int) -> None:
    """Unlink the names of communicator ``tag`` that nobody needs once ``pid`` leaves: our
    doorbell, our half-made files, and rings *to* us that we never opened. Rings *from*
    us stay: a peer may still read what we sent (it unlinks them when it maps them, or at
    its own close). Names whose processes are all dead go too."""
    mine = f"{PREFIX}{tag}-"
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if not name.startswith(mine):
            continue
        m = _RING.match(name, len(mine))
        if m is not None and m.group(2):   # a half-made ring: only if we were making it
            gone = int(m.group(3)) == pid
        elif m is not None:                 # a ring: if it leads to us
            gone = int(m.group(1)) == pid
        else:
            gone = f"-p{pid}-" in name
        if gone:
            try:
                os.unlink(path_of(name))
            except OSError:
                pass
    clean_stale(mine)


_RING = re.compile(r"\d+to\d+c\d+-p\d+-p(\d+)-n[0-9a-f]+(?:(\.tmp)(\d+))?$")



class Fifo:
    """A named pipe used as a doorbell: the owner sleeps in ``poll`` on it, peers write a
    byte to wake it. The owner keeps it open read-write so it never sees EOF and peers can
    open it without blocking."""

    def __init__(self, name: str):
        self.name = name
        path = path_of(name)
        os.mkfifo(path, 0o600)
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self.linked = True

    def drain(self) -> None:
        try:
            while len(os.read(self.fd, 4096)) == 4096:
                pass
        except OSError:  # empty (EAGAIN), or closed meanwhile by another thread
            pass

    def unlink(self) -> None:
        if self.linked:
            _unlink(path_of(self.name))
            self.linked = False

    def close(self) -> None:
        self.unlink()
        fd, self.fd = self.fd, -1
        try:
            os.close(fd)
        except OSError:
            pass


def open_bell(name: str) -> int:
    """Open a peer's doorbell for writing (nonblocking)."""
    return os.open(path_of(name), os.O_WRONLY | os.O_NONBLOCK)


def close_fds(fds: Iterable[int]) -> None:
    """Close every descriptor (peers' doorbells), ignoring ones already gone."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def ring_bell(fd: int) -> None:
    try:
        os.write(fd, b"\x01")
    except (BlockingIOError, InterruptedError, BrokenPipeError):
        pass  # full pipe: the owner is awake anyway; gone: liveness checks report it
    except OSError:
        pass


# ---- leaving: why we closed, and SIGTERM ---------------------------------------------


def write_reason(array, words, len_word: int, at: int, limit: int, text: str) -> None:
    """Write ``text`` (UTF-8, at most ``limit`` bytes) at byte ``at``, then its length in
    word ``len_word`` — before the closed flag, so a peer that sees us closed reads it."""
    raw = text.encode("utf-8", "replace")[:limit]
    try:
        array[at:at + len(raw)] = np.frombuffer(raw, np.uint8)
        words[len_word] = len(raw)
    except (ValueError, TypeError):
        pass


def read_reason(array, words, len_word: int, at: int, limit: int) -> str | None:
    n = words[len_word]
    if not 0 < n <= limit:
        return None
    return bytes(array[at:at + n]).decode("utf-8", "replace")


def install_sigterm(live) -> None:
    """On SIGTERM (``ringtree run`` stopping a failed job, a batch system's kill), unlink
    the names of every transport in ``live`` as a normal exit does, then die of the signal
    as before. Only if the program does not handle SIGTERM itself (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigterm(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        for t in list(live):
            try:
                if os.getpid() == t.me.pid:
                    remove_names(t.tag, t.me.pid)
            except Exception:  # noqa: BLE001 - never fail in a handler
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        pass
