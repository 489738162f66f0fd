"""The schedule IR: one description of an algorithm, read by the executor, the checker,
the simulator and the visualizer.

A collective over ``nranks`` ranks is, for each rank, a :class:`Program`: one or more
*channels*, each an ordered tuple of :class:`Step` s. Steps move *chunks*:

* every buffer (``INPUT``, ``OUTPUT``, ``SCRATCH``) is a sequence of *blocks* (1 block for
  an all-reduce buffer, ``nranks`` blocks for an all-gather output, ...), and every block
  is cut into ``Program.chunks`` chunks. Chunk ``j`` of a buffer is sub-chunk ``j % chunks``
  of block ``j // chunks``; a :class:`Ref` names a run of consecutive chunks.
* a step is NCCL's primitive vocabulary decomposed into four verbs, applied in order:
  take ``src`` (if any), receive from each of ``recv_from`` (reducing into the value when
  ``reduce`` is set, otherwise replacing it), store the value in ``dst`` (if any), send the
  value to each of ``send_to``. ``Step.name`` gives NCCL's name for the combination:
  ``send``, ``recv``, ``recvReduceSend``, ``recvReduceCopySend``, ``recvCopySend`` ...

Matching rule (the whole of it): messages between one (sender, receiver, channel) triple
match in program order, like the FIFO of a NCCL connection. No tags.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache

from ringtree.ir.collectives import (  # noqa: F401 - re-exported: the IR speaks of them
    COLLECTIVE_ALIASES,
    Collective,
    parse_collective,
)


class Buf(IntEnum):
    """The three buffers a Program can name."""

    INPUT = 0
    OUTPUT = 1
    SCRATCH = 2

    @property
    def letter(self) -> str:
        return "ios"[self.value]


@dataclass(frozen=True, slots=True)
class Ref:
    """``count`` consecutive chunks of ``buf`` starting at chunk ``index``."""

    buf: Buf
    index: int
    count: int = 1

    def __str__(self) -> str:
        span = f"{self.index}" if self.count == 1 else f"{self.index}:{self.index + self.count}"
        return f"{self.buf.letter}[{span}]"

    def chunks(self) -> range:
        return range(self.index, self.index + self.count)


def inp(index: int, count: int = 1) -> Ref:
    return Ref(Buf.INPUT, index, count)


def out(index: int, count: int = 1) -> Ref:
    return Ref(Buf.OUTPUT, index, count)


def scr(index: int, count: int = 1) -> Ref:
    return Ref(Buf.SCRATCH, index, count)


@dataclass(frozen=True, slots=True)
class Step:
    """One primitive: ``value = src; value (⊕|=) recv(p) for p in recv_from; dst = value;
    send(value) to each of send_to``."""

    src: Ref | None = None
    dst: Ref | None = None
    recv_from: tuple[int, ...] = ()
    send_to: tuple[int, ...] = ()
    reduce: bool = False

    def __post_init__(self) -> None:
        if self.src is None and not self.recv_from:
            raise ValueError("step has no source of data (needs src or recv_from)")
        if self.src is not None and self.recv_from and not self.reduce:
            raise ValueError("a step that receives without reducing cannot also read src")
        if len(self.recv_from) > 1 and not self.reduce:
            raise ValueError("receiving from several peers requires reduce=True")
        if self.reduce and self.src is None and len(self.recv_from) < 2:
            raise ValueError("a reducing step needs src or several receives")
        if self.dst is None and not self.send_to:
            raise ValueError("step neither stores nor sends its value")
        if self.src is None and self.dst is None:
            raise ValueError("step names no chunk (needs src or dst)")
        if self.src is not None and self.dst is not None and self.src.count != self.dst.count:
            raise ValueError(f"src {self.src} and dst {self.dst} differ in length")

    @property
    def ref(self) -> Ref:
        """The region this step moves (dst if it stores, else src)."""
        ref = self.dst if self.dst is not None else self.src
        assert ref is not None, "a step moves something"
        return ref

    @property
    def name(self) -> str:
        """NCCL's primitive name for this combination of verbs (``recvReduceCopySend`` ...)."""
        if not self.recv_from:
            base = "reduce" if self.reduce else ("copy" if self.dst is not None else "")
            return (base + "Send" if base else "send") if self.send_to else base
        name = "recv" + ("Reduce" if self.reduce else "")
        if self.dst is not None and (self.send_to or self.reduce):
            name += "Copy"
        return name + ("Send" if self.send_to else "")

    def __str__(self) -> str:
        bits = [self.name]
        if self.recv_from:
            bits.append("from " + ",".join(map(str, self.recv_from)))
        if self.send_to:
            bits.append("to " + ",".join(map(str, self.send_to)))
        if self.src is not None:
            bits.append(f"src={self.src}")
        if self.dst is not None:
            bits.append(f"dst={self.dst}")
        return " ".join(bits)


# Constructors named after NCCL's primitives (src/device/prims_*.h). ``ref`` is both the
# local operand and the destination where the primitive stores.


def send(peer: int, ref: Ref) -> Step:
    return Step(src=ref, send_to=(peer,))


def recv(peer: int, ref: Ref) -> Step:
    return Step(dst=ref, recv_from=(peer,))


def copy(src: Ref, dst: Ref) -> Step:
    return Step(src=src, dst=dst)


def reduce(src: Ref, dst: Ref) -> Step:
    """dst = dst ⊕ src (local)."""
    return Step(src=src, dst=dst, reduce=True)


def recv_reduce_copy(peer: int, src: Ref, dst: Ref | None = None) -> Step:
    """dst = src ⊕ recv(peer)."""
    return Step(src=src, dst=dst if dst is not None else src, recv_from=(peer,), reduce=True)


def recv_reduce_send(prev: int, nxt: int, src: Ref) -> Step:
    """send(src ⊕ recv(prev)) to nxt without storing."""
    return Step(src=src, recv_from=(prev,), send_to=(nxt,), reduce=True)


def recv_reduce_copy_send(prev: int, nxt: int, src: Ref, dst: Ref | None = None) -> Step:
    """dst = src ⊕ recv(prev); send dst to nxt."""
    return Step(src=src, dst=dst if dst is not None else src, recv_from=(prev,), send_to=(nxt,),
                reduce=True)


def recv_copy_send(prev: int, nxt: int, dst: Ref) -> Step:
    """dst = recv(prev); send dst to nxt."""
    return Step(dst=dst, recv_from=(prev,), send_to=(nxt,))


class Conflicts:
    """The executor's memory rule, one access at a time: :meth:`touch` says which earlier
    accesses the ``i``-th must wait for (read after write, write after read or write).
    Read by :meth:`Program.memory_deps` and by the MSCCL exporter's dependencies."""

    __slots__ = ("writer", "readers")

    def __init__(self) -> None:
        self.writer: dict = {}
        self.readers: dict = {}

    def touch(self, i: int, reads: set, writes: set) -> set[int]:
        writer, readers = self.writer, self.readers
        need = {writer[k] for k in reads | writes if k in writer}
        for k in writes:
            need |= readers.get(k, set())
        for k in reads:
            readers.setdefault(k, set()).add(i)
        for k in writes:
            writer[k], readers[k] = i, set()
        return need


@dataclass(frozen=True)
class Program:
    """One rank's part of a collective.

    ``chunks`` is the number of chunks each ``count``-element block is cut into;
    ``scratch`` the number of chunks of scratch space (laid out like blocks of ``count``
    elements cut the same way). ``algo`` names the generator that produced it.
    """

    collective: Collective
    algo: str
    nranks: int
    rank: int
    chunks: int
    channels: tuple[tuple[Step, ...], ...]
    root: int = 0
    scratch: int = 0
    in_place_ok: bool = True
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def blocks(self, buf: Buf) -> int:
        ib, ob = self.collective.blocks(self.nranks)
        if buf is Buf.INPUT:
            return ib
        if buf is Buf.OUTPUT:
            return ob
        return -(-self.scratch // self.chunks) if self.chunks else 0

    def buffer_chunks(self, buf: Buf) -> int:
        if buf is Buf.SCRATCH:
            return self.scratch
        return self.blocks(buf) * self.chunks

    @property
    def steps(self) -> int:
        return sum(len(c) for c in self.channels)

    def storage_map(self, in_place: bool):
        """Map a (buf, chunk) slot to the slot that stores it.

        In place, the API aliases input and output the way torch and NCCL do: the same
        array for all-reduce, broadcast, reduce and all-to-all; the input is this rank's
        block of the output for all-gather; the output is this rank's block of the input
        for reduce-scatter.
        """
        spec, c, r = self.collective.spec, self.chunks, self.rank

        def key(buf: Buf, j: int) -> tuple[Buf, int]:
            if not in_place or buf is not Buf.OUTPUT:
                return (buf, j)
            k = spec.output_alias(r, c, j)
            return (buf, j) if k is None else (Buf.INPUT, k)

        return key

    def storage_runs(self, in_place: bool):
        """:meth:`storage_map` of a whole :class:`Ref`: the runs ``(buf, lo, hi)`` of
        storage slots its chunks occupy, in chunk order."""
        spec, c, r = self.collective.spec, self.chunks, self.rank

        def runs(ref: Ref) -> list[tuple[Buf, int, int]]:
            lo, hi = ref.index, ref.index + ref.count
            if not in_place or ref.buf is not Buf.OUTPUT:
                return [(ref.buf, lo, hi)] if lo < hi else []
            return [(Buf.OUTPUT, a, b) if k is None else (Buf.INPUT, k, k + b - a)
                    for k, a, b in spec.output_alias_runs(r, c, lo, hi) if a < b]

        return runs

    def memory_deps(self, in_place: bool) -> list[tuple[int, ...]]:
        """For every step, numbered channel by channel, the earlier steps it must wait
        for because they touch the same storage (read-after-write, write-after-read,
        write-after-write). A local reduce also reads its destination. This is the
        executor's dependency rule; the compiler, the tuner's stats and the tests read it
        from here.

        Two equal ways (tests compare them on every schedule): slot by slot, the
        cheapest when steps name a chunk or two; by runs of slots with one history
        (:class:`_Runs`) when references are long, so a step costs the runs it touches,
        not its chunks (a halving step of 1,024 ranks names hundreds).

        The answer depends on the steps' references and reduce flags alone (and, in place,
        on the collective and rank), so it is kept by the identities of those references
        (:data:`_DEPS`, which holds them, so an identity cannot pass to another object):
        the ranks of a tree, whose generator shares its Refs, compute it once per shape."""
        steps = [s for ch in self.channels for s in ch]
        key = (in_place, self.collective, self.nranks, self.chunks,
               self.rank if in_place else -1,
               tuple((id(s.src), id(s.dst), s.reduce and not s.recv_from) for s in steps))
        got = _DEPS.get(key)
        if got is not None:
            return list(got[0])
        refs = [x for s in steps for x in (s.src, s.dst) if x is not None]
        if sum(x.count for x in refs) > RUNS_FROM_CHUNKS_PER_REF * max(1, len(refs)):
            deps = self.deps_by_runs(in_place)
        else:
            deps = self.deps_by_slots(in_place)
        if len(_DEPS) >= 1024:
            _DEPS.clear()
        _DEPS[key] = (deps, refs)
        return list(deps)

    def deps_by_slots(self, in_place: bool) -> list[tuple[int, ...]]:
        """:meth:`memory_deps`, one storage slot at a time."""
        key = self.storage_map(in_place)
        touch = Conflicts().touch
        deps: list[tuple[int, ...]] = []
        for ch in self.channels:
            for s in ch:
                rk = {key(s.src.buf, j) for j in s.src.chunks()} if s.src is not None else set()
                wk = {key(s.dst.buf, j) for j in s.dst.chunks()} if s.dst is not None else set()
                if s.reduce and not s.recv_from:
                    rk |= wk
                deps.append(tuple(sorted(touch(len(deps), rk, wk))))
        return deps

    def deps_by_runs(self, in_place: bool) -> list[tuple[int, ...]]:
        """:meth:`memory_deps`, runs of storage slots at a time."""
        runs = self.storage_runs(in_place)
        store: dict[Buf, _Runs] = {}
        deps: list[tuple[int, ...]] = []
        for ch in self.channels:
            for s in ch:
                gid = len(deps)
                rd = runs(s.src) if s.src is not None else []
                wr = runs(s.dst) if s.dst is not None else []
                if s.reduce and not s.recv_from:
                    rd = rd + wr
                for b, lo, hi in rd + wr:      # every cut first: cuts move indices
                    st = store.get(b) or store.setdefault(b, _Runs())
                    st.cut(lo)
                    st.cut(hi)
                spans = [(store[b], *store[b].span(lo, hi)) for b, lo, hi in rd + wr]
                nr = len(rd)
                d: set[int] = set()
                for st, a, z in spans:
                    d.update(w for w in st.writer[a:z] if w >= 0)
                for st, a, z in spans[nr:]:
                    for x in st.readers[a:z]:
                        d |= x
                for st, a, z in spans[:nr]:
                    for x in st.readers[a:z]:
                        x.add(gid)
                for b, lo, hi in wr:           # one run again: written by gid only
                    store[b].written(lo, hi, gid)
                deps.append(tuple(sorted(d)))
        return deps

    def peers(self) -> set[int]:
        ps: set[int] = set()
        for ch in self.channels:
            for s in ch:
                ps.update(s.recv_from)
                ps.update(s.send_to)
        return ps


# memory_deps goes by runs when references name more chunks than this on average
RUNS_FROM_CHUNKS_PER_REF = 8
# Program.memory_deps by the identities of the references, with the references kept
_DEPS: dict[tuple, tuple[list[tuple[int, ...]], list[Ref]]] = {}


class _Runs:
    """The slots of one buffer as runs ``[starts[i], starts[i+1])`` of one history: the
    last step that wrote them (−1: none) and the steps that read them since."""

    __slots__ = ("starts", "writer", "readers")

    def __init__(self) -> None:
        self.starts: list[int] = [-(1 << 62)]
        self.writer: list[int] = [-1]
        self.readers: list[set[int]] = [set()]

    def cut(self, pos: int) -> None:
        """Start a run at ``pos`` (a copy of the history of the run it splits)."""
        i = bisect_right(self.starts, pos) - 1
        if self.starts[i] != pos:
            self.starts.insert(i + 1, pos)
            self.writer.insert(i + 1, self.writer[i])
            self.readers.insert(i + 1, set(self.readers[i]))

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """The indices of the runs covering [lo, hi) (both cut before)."""
        return bisect_left(self.starts, lo), bisect_left(self.starts, hi)

    def written(self, lo: int, hi: int, gid: int) -> None:
        """[lo, hi) (cut before) was just written by step ``gid``: one run of it."""
        a, z = self.span(lo, hi)
        del self.starts[a + 1:z]
        self.writer[a:z] = [gid]
        self.readers[a:z] = [set()]


def split_even(total: int, parts: int, index: int) -> tuple[int, int]:
    """(offset, length) of part ``index`` when ``total`` items are cut into ``parts`` nearly
    equal pieces, the larger ones first (as MPI and NCCL do for uneven counts)."""
    base, extra = divmod(total, parts)
    off = index * base + min(index, extra)
    return off, base + (1 if index < extra else 0)


def chunk_regions(block_sizes: list[int], chunks: int) -> list[tuple[int, int]]:
    """(offset, length) of every chunk: block b's sub-chunk s is chunk b*chunks + s.
    Equal blocks (every collective but uneven ones) share one cached list: read it, do
    not modify it."""
    if block_sizes and block_sizes.count(block_sizes[0]) == len(block_sizes):
        return _even_regions(block_sizes[0], len(block_sizes), chunks)
    return _regions(block_sizes, chunks)


@lru_cache(maxsize=64)
def _even_regions(size: int, blocks: int, chunks: int) -> list[tuple[int, int]]:
    return _regions([size] * blocks, chunks)


def _regions(block_sizes: list[int], chunks: int) -> list[tuple[int, int]]:
    regions = []
    base = 0
    for size in block_sizes:
        for s in range(chunks):
            off, ln = split_even(size, chunks, s)
            regions.append((base + off, ln))
        base += size
    return regions
