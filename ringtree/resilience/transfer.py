"""State transfer to newcomers: streamed from several survivors at once, every chunk
checked, a corrupt chunk fetched again from another survivor.

:func:`stream` is collective over a communicator in which ``sources`` hold identical
arrays and ``dests`` (the newcomers) hold arrays of the same shapes and dtypes. The bytes
are cut into chunks of ``chunk_bytes``; each array's chunks are dealt to the ``S``
sources in contiguous blocks, and each source sends its block to every destination as
one message, all in one group of sends and receives (so a newcomer receives from every
source in parallel, straight into its arrays, at the rate of large messages). Each source also computes a checksum
of each chunk it sends (:mod:`ringtree.resilience.checksum`: CRC-32C in hardware where
compiled, 4-5 GB/s per core on this machine where zlib's CRC-32 made 0.5-1.6 GB/s and
held the transfer below 1 GB/s; it detects every burst error up to 32 bits, which is
corruption in memory or on a link, not an adversary), and the table of checksums is
all-gathered. A destination checks every chunk
it received; the list of bad chunks is all-gathered, and each is sent again by the next
source (round ``r``: the block's source plus ``r``, mod ``S``). After ``S`` rounds a chunk still bad on every source raises
:class:`~ringtree.errors.RecoveryError` naming it. ``corrupt``: a drill (tests) that may
change a chunk's bytes after its checksum was taken, as a bad link would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ringtree.errors import RecoveryError
from ringtree.resilience.checksum import NAMES, chunk_sum, same_algorithm

CHUNK_BYTES = 4 << 20


def _chunks(arrays: Sequence[np.ndarray], chunk_bytes: int, nsrc: int
            ) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[int, int, int]]]:
    """(byte views of the arrays, chunk views, (array, first byte, first source) per
    chunk); each array's chunks are dealt to the sources in ``nsrc`` contiguous blocks."""
    raws, chunks, where = [], [], []
    for k, a in enumerate(arrays):
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError("stream: every array must be C-contiguous and writeable")
        raw = a.reshape(-1).view(np.uint8)
        raws.append(raw)
        starts = range(0, raw.size, chunk_bytes)
        for j, lo in enumerate(starts):
            chunks.append(raw[lo:lo + chunk_bytes])
            where.append((k, lo, j * nsrc // len(starts)))
    return raws, chunks, where


def _runs(todo: dict[int, list[int]], where, src_of) -> list[tuple[int, list[int], list[int]]]:
    """Chunks to send, merged into runs of adjacent chunks of one array with one source
    and the same destinations: (source, destinations, chunk ids) — one message each."""
    runs: list[tuple[int, list[int], list[int]]] = []
    for i in sorted(todo):
        src, who = src_of(i), todo[i]
        last = runs[-1] if runs else None
        if last is not None and last[0] == src and last[1] == who and last[2][-1] == i - 1 \
                and where[i - 1][0] == where[i][0]:
            last[2].append(i)
        else:
            runs.append((src, who, [i]))
    return runs


def _round(comm, raws, chunks, where, todo, src_of, corrupt) -> tuple[np.ndarray, np.ndarray]:
    """Send every chunk of ``todo`` to its destinations from ``src_of(i)``, adjacent
    chunks as one message; returns every rank's table of the checksums it sent (-1: not
    sent by it) and this rank's checksums of what it received."""
    crc = np.full(len(chunks), -1, np.int64)
    sent: list[int] = []
    with comm.group():
        for src, who, ids in _runs(todo, where, src_of):
            k, lo = where[ids[0]][0], where[ids[0]][1]
            span = raws[k][lo:lo + sum(chunks[i].size for i in ids)]
            if comm.rank == src:
                sent += ids
                if corrupt is not None:
                    span = np.concatenate([corrupt(i, chunks[i]) for i in ids])
                for d in who:
                    comm.send(span, d, tag=ids[0])
            elif comm.rank in who:
                comm.recv(span, src, tag=ids[0])
    got = np.full(len(chunks), -1, np.int64)
    for i in sent:  # after the sends: a source checksums while the newcomer checks
        crc[i] = chunk_sum(chunks[i])
    for i in todo:
        if comm.rank in todo[i]:
            got[i] = chunk_sum(chunks[i])
    return comm.all_gather(crc), got


def _damaged(me: int, todo, got, table, src_of) -> tuple[list[int], str | None]:
    """Chunks received here whose checksum differs from their source's, and what is
    wrong if a source checksums with another algorithm (a mixed install)."""
    bad = []
    for i in todo:
        if got[i] < 0:
            continue
        theirs = int(table[src_of(i), i])
        if not same_algorithm(int(got[i]), theirs):
            return bad, (f"source rank {src_of(i)} checksums with "
                         f"{NAMES.get(theirs >> 32, '?')}, rank {me} with "
                         f"{NAMES[int(got[i]) >> 32]} (build ringtree's compiled part the "
                         f"same way on every host)")
        if got[i] != theirs:
            bad.append(i)
    return bad, None


def stream(comm, arrays: Sequence[np.ndarray], sources: Sequence[int], dests: Sequence[int],
           *, chunk_bytes: int = CHUNK_BYTES,
           corrupt: Callable[[int, np.ndarray], np.ndarray] | None = None) -> dict:
    """Copy ``arrays`` from ``sources`` to ``dests`` (see the module docstring); returns
    ``{"chunks", "bytes", "refetched"}`` (refetched: chunks sent again)."""
    sources, dests = sorted(set(sources)), sorted(set(dests))
    if not sources or set(sources) & set(dests):
        raise ValueError(f"stream: sources {sources} must be non-empty and apart from "
                         f"dests {dests}")
    raws, chunks, where = _chunks(arrays, max(1, int(chunk_bytes)), len(sources))
    todo = {i: list(dests) for i in range(len(chunks))} if dests else {}
    refetched = 0
    for rnd in range(len(sources)):
        def src_of(i: int, rnd=rnd) -> int:
            return sources[(where[i][2] + rnd) % len(sources)]

        table, got = _round(comm, raws, chunks, where, todo, src_of,
                            corrupt if rnd == 0 else None)
        bad, wrong = _damaged(comm.rank, todo, got, table, src_of)
        every = comm.all_gather_object((bad, wrong))
        for _, w in every:  # every rank raises the same error
            if w is not None:
                raise RecoveryError(f"rank {comm.rank}: state transfer: {w}")
        todo = {}
        for d, (lst, _) in enumerate(every):
            for i in lst:
                todo.setdefault(i, []).append(d)
        if not todo:
            return {"chunks": len(chunks), "bytes": sum(c.nbytes for c in chunks),
                    "refetched": refetched}
        refetched += sum(len(v) for v in todo.values())
    raise RecoveryError(f"rank {comm.rank}: state transfer: chunks {sorted(todo)} arrived "
                        f"corrupt from every one of sources {sources}")
