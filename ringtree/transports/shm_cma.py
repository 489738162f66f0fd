"""Cross-memory attach: read a peer's memory in place (``process_vm_readv(2)``).

This is how a rank reads a co-located peer's *user buffer* directly — NCCL's "direct"
(P2P read) primitive on a CPU, and what Open MPI's ``smsc/cma`` does for large messages:
one copy from the sender's array into the receiver's, instead of sender → shared slot →
receiver. The kernel pins the pages on both sides, so it can only pay off for large
messages; small ones stay in the shared-memory slots.

Measured on the 2-core development VM (all-reduce of 16 / 64 MiB, medians): with 2 ranks
direct reads were 1.3–1.4× *slower* than slots — a 1 MiB ``process_vm_readv`` moves
6–14 GB/s against 30–60 GB/s for a warm ``memcpy``, and with a core per rank the sender's
copy-in runs in parallel with the receiver's work anyway. With 4 ranks on the 2 cores
they were 1.45–1.5× *faster*: when the cores are oversubscribed, total CPU time is what
counts, and one copy beats two. Hence the transport's default: direct reads for
messages ≥ 1 MiB only when the host's ranks outnumber its cores
(``RINGTREE_SHM_DIRECT_MIN`` overrides).

The LL segment's single-copy all-gather and reduce-scatter
(:mod:`ringtree.runtime.protocols.ll_direct`) read with it too, through the compiled
``_cma`` (the same system call with the GIL released, several spans a call, and a
buffer's address without NumPy's ``__array_interface__``), or ctypes without a compiler;
the all-gather copies its own block with :func:`stream` (non-temporal stores) and shares
its large copies through :func:`claim` (pieces drawn from a counter in shared memory,
read from a peer or written into it with ``process_vm_writev``, :func:`write_spans`).

It needs ptrace permission over the peer (same user; Yama ``ptrace_scope`` ≤ 1 with
``PR_SET_PTRACER``; not blocked by seccomp). :func:`allow_readers` opts this process in and
the transport probes every peer once, falling back to slots where a read is refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

import numpy as np

from ringtree import kernels

# None when built without a C compiler (or from other sources, ringtree.kernels): the
# same system call through ctypes
_cma = kernels.load("ringtree.transports._cma")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        for call in (lib.process_vm_readv, lib.process_vm_writev):
            call.restype = ctypes.c_ssize_t
            call.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                             ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
        _libc = lib
    return _libc


def supported() -> bool:
    if not os.path.exists("/proc/self/ns/pid"):
        return False
    try:
        return hasattr(_lib(), "process_vm_readv")
    except OSError:
        return False


def allow_readers() -> None:
    """Let any process of ours read this one (Yama ``PR_SET_PTRACER_ANY``; no-op without
    Yama)."""
    try:
        _lib().prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def address(a: np.ndarray) -> int:
    """The address of contiguous ``a``'s first element."""
    if _cma is not None:
        return _cma.address(a)
    return a.__array_interface__["data"][0]


def compiled() -> bool:
    """Whether reads go through the compiled ``_cma`` (else ctypes: the same call, slower)."""
    return _cma is not None


def stream(dst: np.ndarray, src: np.ndarray, *, python: bool = False) -> None:
    """Copy contiguous ``src`` into contiguous ``dst`` (as many bytes) with non-temporal
    stores where ``_cma`` is compiled (x86-64), else as NumPy copies (the same bytes).
    For a copy no one reads again soon and larger than the caches: a cached store reads
    each destination line first (for ownership), a streamed one does not."""
    fast = getattr(_cma, "stream", None)  # None: no compiler, or a build from before it
    if fast is not None and not python:
        fast(dst, src)
    else:
        dst[...] = src


# bytes of a bounced read's scratch (read_spans): a quarter of this machine's 512 KiB
# L2 per core, so the kernel's copy and the streamed one stay in it. 2 ranks, an
# all-gather's peer block read bounced ÷ straight into the output, alternated in one
# job: 4 MiB 0.98-0.99, 16 MiB 0.86-0.88, 32 MiB 0.88-0.90 (128 KiB and 512 KiB
# scratches no better)
BOUNCE = 256 << 10


def bounce_buffer() -> np.ndarray | None:
    """A scratch for bounced reads, or None where reads cannot bounce (no ``_cma``)."""
    return np.empty(BOUNCE, np.uint8) if _cma is not None else None


def last_level_cache(default: int, base: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Bytes of this machine's last-level cache as Linux reports it (cpu0's highest cache
    level in sysfs, under ``base``), or ``default`` where it does not."""
    best = (0, default)
    try:
        for name in (n for n in os.listdir(base) if n.startswith("index")):
            with open(f"{base}/{name}/level") as f, open(f"{base}/{name}/size") as g:
                level, size = int(f.read()), g.read().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            best = max(best, (level, int(size.rstrip("KMG")) * scale))
    except (OSError, ValueError):
        return default
    return best[1]


def read_into(pid: int, into: np.ndarray, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` at ``remote`` in process ``pid`` into the contiguous ``into``.
    Raises OSError (ESRCH: the process is gone; EPERM: not allowed; EFAULT: bad address)."""
    read_spans(pid, [(address(into), remote, nbytes)])


def read_spans(pid: int, spans: list[tuple[int, int, int]], *, python: bool = False,
               scratch: np.ndarray | None = None) -> None:
    """Read every ``(local address, remote address, bytes)`` of ``spans`` from process
    ``pid`` (batched into few system calls); OSError as :func:`read_into`. ``python``:
    through ctypes even where ``_cma`` is compiled (its tests compare the two).
    ``scratch`` (a buffer of :data:`BOUNCE` bytes, :func:`bounce_buffer`): *bounced*, each
    span read into it a piece at a time and streamed on into place, for destinations
    larger than the caches (the same bytes; a plain read without ``_cma``)."""
    _move(pid, spans, python, False, scratch)


def write_spans(pid: int, spans: list[tuple[int, int, int]], *, python: bool = False
                ) -> None:
    """:func:`read_spans` the other way (``process_vm_writev(2)``): every ``(local address,
    remote address, bytes)`` of ``spans`` from this process into process ``pid``."""
    _move(pid, spans, python, True)


def _move(pid: int, spans: list[tuple[int, int, int]], python: bool, write: bool,
          scratch: np.ndarray | None = None) -> None:
    if _cma is not None and not python:
        e = _cma.write(pid, spans) if write else _cma.read(pid, spans, scratch)
        if e:
            raise OSError(e, os.strerror(e))
        return
    lib = _lib()
    call = lib.process_vm_writev if write else lib.process_vm_readv
    for local, remote, nbytes in spans:
        done = 0
        while done < nbytes:
            lv = _Iovec(local + done, nbytes - done)
            rv = _Iovec(remote + done, nbytes - done)
            n = call(pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
            if n < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                raise OSError(e, os.strerror(e))
            if n == 0:
                raise OSError(errno.EFAULT, "process_vm_readv/writev moved nothing")
            done += n


# the kernel's copy across offsets in a cache line, measured once per process
# (offsets_matter): bytes of a read, reads of each kind, and the ratio that counts
OFFSET_PROBE, OFFSET_READS, OFFSET_SLOW = 2 << 20, 5, 1.3
_offsets: list[bool] = []


def offsets_matter() -> bool:
    """Does the kernel's copy slow down where source and destination differ in their
    offset within a cache line? Measured once per process, on first ask: 2 MiB read
    from this process into itself (``process_vm_readv`` on its own pid, the path a
    peer's read takes), at the source's offset and 32 bytes from it, five of each
    alternated; True where the medians differ by :data:`OFFSET_SLOW` or more. On an AMD
    EPYC Zen 3 host the kernel's ``rep movsb`` took 2.4-2.7x as long across offsets (an
    8 MiB all-gather block); on an Intel Xeon host 2 MiB took 229 µs at the same offset
    and 260-263 at 16 and 48 bytes from it, 8 MiB 781 against 772-775 (docs/design-notes.md,
    "Straight reads and the offset in a cache line"). A failed read answers True (the
    bounce, which is right on either kind of host)."""
    if not _offsets:
        _offsets.append(_measure_offsets())
    return _offsets[0]


def _measure_offsets() -> bool:
    import statistics
    import time

    src = np.ones(OFFSET_PROBE + 128, np.uint8)
    dst = np.empty(OFFSET_PROBE + 128, np.uint8)
    at, to, pid = address(src), address(dst), os.getpid()
    at, to = at + (-at % 64), to + (-to % 64)
    times: tuple[list[float], list[float]] = ([], [])
    try:
        for _ in range(OFFSET_READS):
            for apart, kind in ((0, times[0]), (32, times[1])):
                t = time.perf_counter()
                read_spans(pid, [(to + apart, at, OFFSET_PROBE)])
                kind.append(time.perf_counter() - t)
    except OSError:
        return True
    return statistics.median(times[1]) >= OFFSET_SLOW * statistics.median(times[0])


def can_claim() -> bool:
    """Whether :func:`claim` is there (it needs the compiled ``_cma``'s atomic add)."""
    return getattr(_cma, "claim", None) is not None


def claim(pid: int, words, index: int, local: int, remote: int, nbytes: int,
          piece: int, write: bool, scratch: np.ndarray | None = None) -> int:
    """Copy the ``piece``-byte pieces of ``nbytes`` between ``local`` here and ``remote`` in
    ``pid`` (``write``: into ``pid``) that this process draws from the shared counter
    ``words[index]`` (a writable buffer of 64-bit words; an atomic fetch-and-add a piece,
    until it passes the last): processes racing on one counter copy each piece exactly
    once between them, the faster taking more (work sharing through a shared counter, as
    OpenMP's dynamic schedule). Returns the pieces copied; OSError as :func:`read_into`
    (the pieces after the failed one are left to the others, or to no one). A read
    with ``scratch`` is bounced as :func:`read_spans`'s."""
    e, done = _cma.claim(pid, words, index, local, remote, nbytes, piece, write, scratch)
    if e:
        raise OSError(e, os.strerror(e))
    return done


def probe(pid: int, remote: int, expect: bytes) -> bool:
    """True if we may read ``pid`` (it holds ``expect`` at ``remote``)."""
    buf = np.zeros(len(expect), np.uint8)
    try:
        read_into(pid, buf, remote, len(expect))
    except OSError:
        return False
    return buf.tobytes() == expect
