"""State transfer to newcomers: streamed from several survivors at once, every chunk
checked, a corrupt chunk fetched again from another survivor.

:func:`stream` is collective over a communicator in which ``sources`` hold identical
arrays and ``dests`` (the newcomers) hold arrays of the same shapes and dtypes. The bytes
are cut into chunks of ``chunk_bytes``; chunk ``i`` goes from source ``i mod S`` to every
destination, all chunks in one group of sends and receives (so a newcomer receives from
every source in parallel, straight into its arrays). Each source also computes a CRC-32
of each chunk it sends (zlib's, ~1.6 GB/s on this machine's cores under load: it detects
every burst error up to 32 bits, which is corruption in memory or on a link, not an
adversary), and the table of checksums is all-gathered. A destination checks every chunk
it received; the list of bad chunks is all-gathered, and each is sent again by the next
source (``i + round mod S``). After ``S`` rounds a chunk still bad on every source raises
:class:`~ringtree.errors.RecoveryError` naming it. ``corrupt``: a drill (tests) that may
change a chunk's bytes after its checksum was taken, as a bad link would.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from ringtree.errors import RecoveryError

CHUNK_BYTES = 4 << 20


def _chunks(arrays: Sequence[np.ndarray], chunk_bytes: int) -> list[np.ndarray]:
    out = []
    for a in arrays:
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError("stream: every array must be C-contiguous and writeable")
        raw = a.reshape(-1).view(np.uint8)
        out += [raw[i:i + chunk_bytes] for i in range(0, raw.size, chunk_bytes)]
    return out


def _round(comm, chunks, todo: dict[int, list[int]], src_of: Callable[[int], int],
           dests: Sequence[int], corrupt) -> np.ndarray:
    """Send chunk ``i`` to each destination in ``todo[i]`` from ``src_of(i)``; returns
    every rank's checksum table (-1 where it sent nothing)."""
    crc = np.full(len(chunks), -1, np.int64)
    with comm.group():
        for i, who in todo.items():
            src = src_of(i)
            if comm.rank == src:
                crc[i] = zlib.crc32(chunks[i])
                payload = chunks[i] if corrupt is None else corrupt(i, chunks[i])
                for d in who:
                    comm.send(payload, d, tag=i)
            elif comm.rank in who:
                comm.recv(chunks[i], src, tag=i)
    return comm.all_gather(crc)


def stream(comm, arrays: Sequence[np.ndarray], sources: Sequence[int], dests: Sequence[int],
           *, chunk_bytes: int = CHUNK_BYTES,
           corrupt: Callable[[int, np.ndarray], np.ndarray] | None = None) -> dict:
    """Copy ``arrays`` from ``sources`` to ``dests`` (see the module docstring); returns
    ``{"chunks", "bytes", "refetched"}`` (refetched: chunks sent again)."""
    sources, dests = sorted(set(sources)), sorted(set(dests))
    if not sources or set(sources) & set(dests):
        raise ValueError(f"stream: sources {sources} must be non-empty and apart from "
                         f"dests {dests}")
    chunks = _chunks(arrays, max(1, int(chunk_bytes)))
    todo = {i: list(dests) for i in range(len(chunks))} if dests else {}
    refetched = 0
    for rnd in range(len(sources)):
        def src_of(i: int, rnd=rnd) -> int:
            return sources[(i + rnd) % len(sources)]

        table = _round(comm, chunks, todo, src_of, dests, corrupt if rnd == 0 else None)
        bad = [i for i in todo if comm.rank in todo[i] and
               zlib.crc32(chunks[i]) != table[src_of(i), i]]
        every = comm.all_gather_object(bad)
        todo = {}
        for d, lst in enumerate(every):
            for i in lst:
                todo.setdefault(i, []).append(d)
        if not todo:
            return {"chunks": len(chunks), "bytes": sum(c.nbytes for c in chunks),
                    "refetched": refetched}
        refetched += sum(len(v) for v in todo.values())
    raise RecoveryError(f"rank {comm.rank}: state transfer: chunks {sorted(todo)} arrived "
                        f"corrupt from every one of sources {sources}")
