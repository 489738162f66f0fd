"""Compiling a Program for one call: chunk references become element regions, each step's
data is cut into slices, and every step learns which earlier steps it must wait for.

Also the records a call carries through the executor (:class:`Call`, :class:`Desc`); the
message header that fingerprints a call is :mod:`ringtree.ir.wire`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from ringtree.ir.program import Buf, Program, Step, chunk_regions, split_even
from ringtree.ir.wire import PROTO_NAMES, PROTO_SIMPLE, WireHeader, algo_code
from ringtree.ops import Reducer

DEFAULT_SLICE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Region:
    buf: int      # Buf value
    off: int      # element offset
    length: int   # elements


@dataclass(slots=True)
class CStep:
    """A compiled step: where its data lives and what it must wait for."""

    channel: int
    step: Step
    src: Region | None
    dst: Region | None
    length: int
    slices: tuple[tuple[int, int], ...]
    deps: tuple[int, ...]
    gid: int = 0
    skip_copy: bool = False


class Desc(NamedTuple):
    """What a call is, for headers (mismatch detection) and error messages: the same
    record whichever protocol runs the call (``proto``)."""

    name: str
    count: int
    dtype: str
    dtype_code: int
    op: str
    op_code: int
    root: int
    seq: int
    algo: str
    coll_code: int
    proto: int = PROTO_SIMPLE  # ringtree.ir.wire.PROTO_SIMPLE or PROTO_LL

    def header(self, nbytes: int = 0) -> WireHeader:
        return WireHeader(nbytes, self.count, self.seq, algo_code(self.algo), self.coll_code,
                          self.dtype_code, self.op_code, self.proto, self.root)

    @property
    def protocol(self) -> str:
        return PROTO_NAMES[self.proto]

    def prefix(self) -> bytes:
        """The call's part of every message header (:meth:`WireHeader.call_part`)."""
        return self.header().call_part()

    def __str__(self) -> str:
        root = f", root={self.root}" if self.root >= 0 else ""
        return (f"{self.name}(count={self.count}, {self.dtype}, {self.op}{root}, "
                f"algo={self.algo}{', proto=LL' if self.proto else ''}) seq {self.seq}")


class DescAt:
    """A prepared call's :class:`Desc` at one sequence number: what a call that reuses a
    prepared op (LL's) hands the flight recorder and the profiler, made with two stores
    (building a Desc per call cost the 1-rank all-reduce a tenth of its time). Every
    field but ``seq`` is the template's."""

    __slots__ = ("template", "seq")

    def __init__(self, template: Desc, seq: int):
        self.template, self.seq = template, seq

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy / pickle probes: not the template's
            raise AttributeError(name)
        return getattr(self.template, name)

    def desc(self) -> Desc:
        return self.template._replace(seq=self.seq)

    def header(self, nbytes: int = 0) -> WireHeader:
        return self.desc().header(nbytes)

    def __str__(self) -> str:
        return str(self.desc())


@dataclass
class Call:
    """One collective (or p2p operation) ready to run."""

    steps: list[list[CStep]]
    bufs: list[np.ndarray | None]      # typed views: input, output, scratch
    reducer: Reducer | None
    desc: Desc
    channel_base: int = 0
    post: Callable[[], None] | None = None
    prefix: bytes = field(init=False)
    fr: Any = field(default=None, repr=False)  # its flight-recorder entry (prof.flight.Entry)
    steps_done: list[bool] = field(default_factory=list, repr=False)
    plan: Any = field(default=None, repr=False)  # the Plan whose buffers it borrowed

    def __post_init__(self) -> None:
        self.prefix = self.desc.prefix()


@lru_cache(maxsize=4096)
def _split(length: int, parts: int) -> tuple[tuple[int, int], ...]:
    """The slices of a step: ``split_even`` of its ``length`` into ``parts``."""
    return tuple(split_even(length, parts, k) for k in range(parts))


def compile_program(p: Program, in_blocks: list[int], out_blocks: list[int], count: int,
                    itemsize: int, slice_bytes: int, in_place: bool) -> list[list[CStep]]:
    """Resolve chunk references to element regions, slices and dependencies."""
    layout = {
        Buf.INPUT: chunk_regions(in_blocks, p.chunks),
        Buf.OUTPUT: chunk_regions(out_blocks, p.chunks),
        Buf.SCRATCH: chunk_regions([count] * p.blocks(Buf.SCRATCH), p.chunks),
    }
    key = p.storage_map(in_place)
    slice_elems = max(1, slice_bytes // max(1, itemsize))

    def region(ref) -> Region:
        regs = layout[ref.buf]
        if ref.index + ref.count > len(regs):
            raise ValueError(f"{p.algo}: {ref} outside the buffer")
        first, last = regs[ref.index], regs[ref.index + ref.count - 1]
        return Region(int(ref.buf), first[0], last[0] + last[1] - first[0])

    all_deps = p.memory_deps(in_place)
    out: list[list[CStep]] = []
    gid = 0
    for c, chan in enumerate(p.channels):
        csteps = []
        for s in chan:
            src = region(s.src) if s.src is not None else None
            dst = region(s.dst) if s.dst is not None else None
            length = dst.length if dst is not None else src.length if src is not None else 0
            nsl = -(-length // slice_elems) if length else 0
            slices = _split(length, nsl)
            # a plain copy onto its own storage (in place) moves nothing
            skip = (s.src is not None and s.dst is not None and not s.recv_from
                    and not s.reduce
                    and [key(s.src.buf, j) for j in s.src.chunks()]
                    == [key(s.dst.buf, j) for j in s.dst.chunks()])
            csteps.append(CStep(c, s, src, dst, length, slices, all_deps[gid], gid, skip))
            gid += 1
        out.append(csteps)
    return out
