"""What a simulation may cost before it is refused, estimated before anything is built.

Runs that no folding or template can shorten cost the event engine about a microsecond
per step and per slice sent, and compiling them holds every step. A one-shot ``direct``
all-reduce on 1,024 ranks has 16.8 M steps at any size and carries 1.1 G slices at 1 GiB:
hours, where a tree on 131,072 ranks is 1.3 M steps and slices (about 30 s). So before
the event engine's Programs are generated, rank 0's Program is compiled alone (channels
that move no data left out, as the run would) and its steps plus slices sent, times the
ranks, is compared with a limit; over it, :class:`TooLarge` says what the run would be
and how to allow it. The estimate is rank 0's, so for schedules whose ranks differ
(trees, CollNet) it is approximate; it is never used for an answer.
"""

from __future__ import annotations

from ringtree.ir.program import Program
from ringtree.sim.compile.compiled import Lengths, moving

__all__ = ["MAX_WORK", "TooLarge", "work", "check"]

# steps plus slices sent, over every rank: about a minute of the event engine here
MAX_WORK = 1 << 25


class TooLarge(ValueError):
    """The run is over the simulator's work limit (``max_work``)."""


def work(p: Program, count: int, itemsize: int, slice_bytes: int, in_place: bool) -> int:
    """Steps plus slices sent of one Program at ``count`` elements per block: what
    :func:`ringtree.runtime.plan.compile_program` would make of it, counted without
    building it (a step's length is the prefix-sum difference over the chunks it names,
    its slices ``ceil(length / slice elements)``)."""
    pre = Lengths(p.nranks, count).of(p)
    pruned, _ = moving(p, pre, in_place)
    se = max(1, slice_bytes // max(1, itemsize))
    total = 0
    for ch in pruned.channels:
        for s in ch:
            length = 0
            for ref in (s.src, s.dst):          # the compiler's length: dst's, else src's
                if ref is not None:
                    a = pre[ref.buf]
                    if ref.index + ref.count >= len(a):
                        raise ValueError(f"{p.algo}: {ref} outside the buffer")
                    length = a[ref.index + ref.count] - a[ref.index]
            total += 1 + -(-length // se) * len(s.send_to)
    return total


def check(p: Program, ranks: int, count: int, itemsize: int, slice_bytes: int,
          in_place: bool, limit: int, why: str) -> None:
    """Raise :class:`TooLarge` when ``p``'s work times ``ranks`` is over ``limit`` (0: no
    limit); ``why`` says why that many ranks are simulated."""
    if not limit:
        return
    per = work(p, count, itemsize, slice_bytes, in_place)
    total = per * ranks
    if total > limit:
        raise TooLarge(f"about {total:.2g} steps and slices to simulate ({per:,} on rank "
                       f"{p.rank} x {ranks:,} ranks, {why}), over the limit of "
                       f"{limit:.2g}; raise it with --max-work")
