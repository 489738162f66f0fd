"""Renaming a Program's chunks by sets: when is Program p Program q with its storage slots
relabelled, so that a simulator sees the same run?

What the simulator reads of a Program's chunks is which storage slots each step reads and
writes (the memory dependencies, ``Program.memory_deps``, are computed from those sets
alone) and how many elements each step moves (its slices, ``split_even`` of the total).
So p is q renamed if some bijection σ of the slots, keeping every slot's element length,
maps the slots of each reference of q onto the slots of the corresponding reference of p
*as a set*. Positional renaming (the j-th chunk onto the j-th) and XOR masks
(:mod:`.symmetry`) are special cases; this one also rotates a run of chunks inside a
reference that names them all at once, as a hierarchical all-reduce's chain steps name a
channel's chunks while its leaders' ring walks them one by one from a shifted start.

Such a σ exists exactly when the *atoms* agree: label every slot with the references
that contain it (its signature); σ must map the slots of q with a signature onto the
slots of p with the same signature, which it can, keeping lengths, exactly when for every
signature the two multisets of lengths are equal (the partition of the slots by
signature is the coarsest one every reference is a union of).
"""

from __future__ import annotations

from collections import Counter
from itertools import accumulate

from ringtree.ir.program import Program
from ringtree.sim.compile.recent import Recent


def atoms(p: Program, regs: dict) -> Counter:
    """(signature, element length) of every slot p names (out of place: a slot is a
    buffer's chunk), counted."""
    return Counter((sig, regs[b][j]) for sig, b, j in _signatures(p))


def _signatures(p: Program) -> list[tuple[tuple[int, ...], object, int]]:
    """(signature, buffer, chunk) of every slot p names: the numbers of the references
    (channel by channel, step by step, source then destination) that contain it. The
    same at every count, so kept for the last few Programs (a sweep asks at every
    chunk-length pattern)."""
    return _SIGS.lookup(id(p), lambda: _signatures_of(p), p)


def _signatures_of(p: Program) -> list[tuple[tuple[int, ...], object, int]]:
    sig: dict[tuple, list[int]] = {}
    k = 0
    for ch in p.channels:
        for s in ch:
            for x in (s.src, s.dst):
                k += 1
                if x is None:
                    continue
                b = x.buf
                for j in x.chunks():
                    sig.setdefault((b, j), []).append(k)
    return [(tuple(v), b, j) for (b, j), v in sig.items()]


# the signatures of the last Programs read, each held so that its id stays its own
KEEP = 512
_SIGS = Recent("signatures", KEEP)


def by_sets(p: Program, q: Program, regs: dict) -> bool:
    """Is p (out of place) q with its slots renamed by a length-keeping bijection that
    maps each reference onto its counterpart as a set? The steps' shapes (peers,
    channels, reductions) are checked elsewhere (:func:`.fold.moved.same_shape`); here
    every pair of references must name one buffer and as many chunks, and the atoms
    must agree."""
    pre = {b: _prefix(rg) for b, rg in regs.items()}
    for cp_, cq in zip(p.channels, q.channels):
        for s, t in zip(cp_, cq):
            for x, y in ((s.src, t.src), (s.dst, t.dst)):
                if (x is None) != (y is None):
                    return False
                if x is None:
                    continue
                if x.buf != y.buf or x.count != y.count:
                    return False
                ps = pre[x.buf]                  # as many elements (cheap, and necessary)
                if ps[x.index + x.count] - ps[x.index] != ps[y.index + y.count] - ps[y.index]:
                    return False
    return atoms(p, regs) == atoms(q, regs)


def _prefix(rg: list[int]) -> list[int]:
    return _PREFIX.lookup(id(rg), lambda: list(accumulate(rg, initial=0)), rg)


_PREFIX = Recent("region prefixes", 65)
