"""Registered buffers: a per-rank arena of shared memory the peers can read where it lies.

NCCL's user buffer registration (``ncclMemAlloc`` + ``ncclCommRegister``; nccl-tests'
``-R``) lets a collective read a peer's buffer in place instead of staging it through the
protocol's own buffers. On one host the same is POSIX shared memory: every rank carves
its arrays from files in ``/dev/shm`` that it creates *for itself* (allocation is local,
not collective: no rank waits for another), and a peer maps a chunk *lazily*, by name,
the first time a collective hands it an address inside it.

- *chunks*: ``ringtree-<tag>-arena<rank>c<chunk>-p<pid>-n<ns>``, at least
  :data:`CHUNK` bytes, grown one chunk at a time; each allocation is page-aligned
  (first fit in a free list, neighbours merged on free).
- *life*: an array's memory returns to the free list when the last NumPy view (or
  torch tensor made by ``torch.from_numpy``) of it is gone; the names are unlinked when
  the communicator closes (the mappings, and the arrays, stay valid), or, after a
  ``kill -9``, by :func:`~ringtree.transports.shm_segment.clean_stale` on the next start
  (the names carry the owner's pid).
- *where*: :meth:`Arena.locate` maps an array to ``(chunk, offset)`` when the calling
  rank's own arena holds it; :meth:`Arena.peer` gives a view of a peer's ``(chunk,
  offset)``. Arrays of another rank's mapping count as not registered.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np

from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_segment as seg

CHUNK = 64 << 20        # bytes of a chunk at least (pages are touched only when used)
ALIGN = 4096            # every allocation starts on a page
OFF_BITS = 40           # a location word: chunk << OFF_BITS | offset


def chunk_name(tag: str, rank: int, chunk: int, pid: int, ns: str) -> str:
    return f"{seg.PREFIX}{tag}-arena{rank}c{chunk}-p{pid}-n{ns}"


class _Block:
    """The owner of one allocation: NumPy arrays over it keep it (and its chunk's
    mapping) alive; when it goes, its bytes return to the arena."""

    __slots__ = ("__array_interface__", "mm", "__weakref__")


def _map(path: str, size: int | None, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        else:
            size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)


class Arena:
    """One rank's registered memory (``tag``: the communicator's LL segment tag)."""

    def __init__(self, tag: str, rank: int, pid: int, ns: str):
        self.tag, self.rank, self.pid, self.ns = tag, rank, pid, ns
        self.chunks: list[tuple[mmap.mmap, int, int]] = []   # (mapping, address, size)
        self.free: list[list[int]] = []                       # [chunk, offset, size]
        self.returned: list[tuple[int, int, int]] = []        # freed, not yet merged
        self.names: list[str] = []
        self.peers: dict[tuple[int, int], np.ndarray] = {}    # (rank, chunk) -> bytes
        self.bases: dict[tuple[int, int], tuple[int, int]] = {}  # -> (address, size)
        self.lock = threading.Lock()
        self.closed = False

    # ---- allocation ----------------------------------------------------------------

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` in this rank's arena."""
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if nbytes < 0:
            raise ValueError(f"negative shape {shape}")
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self.lock:
            if self.closed:
                raise ValueError("the communicator's registered memory is closed")
            c, off = self._take(size)
            mm, addr, _ = self.chunks[c]
        block = _Block()
        block.mm = mm
        block.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                     "data": (addr + off, False)}
        weakref.finalize(block, self._give, c, off, size)
        return np.asarray(block).view(dt).reshape(shape)  # (dtypes NumPy cannot spell)

    def _take(self, size: int) -> tuple[int, int]:
        self._merge()
        for f in self.free:
            if f[2] >= size:
                c, off = f[0], f[1]
                f[1] += size
                f[2] -= size
                if not f[2]:
                    self.free.remove(f)
                return c, off
        c = len(self.chunks)
        total = max(CHUNK, -(-size // (2 << 20)) * (2 << 20))
        name = chunk_name(self.tag, self.rank, c, self.pid, self.ns)
        mm = _map(seg.path_of(name), total, True)
        self.names.append(name)
        self.chunks.append((mm, np.frombuffer(mm, np.uint8).ctypes.data, total))
        if total > size:
            self.free.append([c, size, total - size])
        return c, 0

    def _give(self, c: int, off: int, size: int) -> None:
        """An allocation's finalizer: it may run inside :meth:`empty` (a garbage
        collection there), so it only queues the bytes unless the lock is free."""
        self.returned.append((c, off, size))  # one atomic append
        if self.lock.acquire(blocking=False):
            try:
                self._merge()
            finally:
                self.lock.release()

    def _merge(self) -> None:
        """Move the returned allocations into the free list, neighbours merged (the
        lock held)."""
        if not self.returned:
            return
        free = self.free
        while self.returned:
            free.append(list(self.returned.pop()))
        free.sort()
        merged: list[list[int]] = []
        for f in free:
            if merged and merged[-1][0] == f[0] and merged[-1][1] + merged[-1][2] == f[1]:
                merged[-1][2] += f[2]
            else:
                merged.append(f)
        self.free = merged

    # ---- where an array lies -------------------------------------------------------

    def locate(self, x: np.ndarray, a: int | None = None) -> int:
        """The location word (chunk << 40 | offset) of ``x``'s first byte (at address
        ``a``, if known) when this rank's arena holds all of ``x``; -1 otherwise."""
        a = cma.address(x) if a is None else a
        for c, (_, base, size) in enumerate(self.chunks):
            if base <= a and a + x.nbytes <= base + size:
                return c << OFF_BITS | (a - base)
        return -1

    def peer(self, rank: int, pid: int, ns: str, word: int, dtype: np.dtype,
             count: int) -> np.ndarray:
        """``count`` × ``dtype`` of rank ``rank``'s arena at location ``word`` (mapped
        the first time; FileNotFoundError when the peer's chunk is gone)."""
        c, off = word >> OFF_BITS, word & ((1 << OFF_BITS) - 1)
        m = self.peers.get((rank, c))
        if m is None:
            mm = _map(seg.path_of(chunk_name(self.tag, rank, c, pid, ns)), None, False)
            m = self.peers[(rank, c)] = np.frombuffer(mm, np.uint8)
            self.bases[(rank, c)] = m.ctypes.data, m.size
        return np.ndarray((count,), dtype, buffer=m, offset=off)

    def peer_address(self, rank: int, pid: int, ns: str, word: int, nbytes: int) -> int:
        """The address of ``nbytes`` of rank ``rank``'s arena at location ``word``, mapped
        (and checked to lie in the chunk) as :meth:`peer` does; the mapping stays."""
        c, off = word >> OFF_BITS, word & ((1 << OFF_BITS) - 1)
        got = self.bases.get((rank, c))
        if got is None or off + nbytes > got[1]:
            self.peer(rank, pid, ns, word, np.dtype(np.uint8), nbytes)
            got = self.bases[(rank, c)]
        return got[0] + off

    def close(self) -> None:
        """Unlink this rank's names (arrays and peers' mappings stay valid)."""
        with self.lock:
            self.closed = True
            for name in self.names:
                try:
                    os.unlink(seg.path_of(name))
                except FileNotFoundError:
                    pass
            self.names = []
