"""Do two schedules of a reduction give the same bits? A proof on symbols, per element.

A floating-point reduction's result depends on its association: IEEE ``+`` and ``*`` are
commutative but not associative, so ``(a+b)+c`` and ``a+(b+c)`` may differ in the last bit.
Two algorithms of one collective may be swapped for each other without changing any
result only when every output element of every rank is reduced by the same expression
tree over the same operands.

The symbolic checker (:mod:`ringtree.ir.check`) interns reduction trees with commutative
children sorted, so two slots hold the same id exactly when they hold the same tree. Here
both algorithms' Programs run on one shared table whose leaves are named by the
contributing rank only: a checked schedule of a reduction combines, for an output
element, the inputs at that element's position and nothing else, so the rank is all that
tells operands apart. Each output chunk's id is then laid over the element ranges the
planner gives the chunk for the call's blocks (:func:`ringtree.ir.program.chunk_regions`;
two algorithms may cut a block into different numbers of chunks), and the two are
compared element range by element range. Equal everywhere means the same bits for every
input, every dtype and every commutative operator; anything else (or a schedule the
symbolic run rejects) means "not proven".

Used by the online choice (:mod:`ringtree.tuning.autotune`): timing may pick between two
reductions only when this holds, so results never depend on timing.
"""

from __future__ import annotations

from functools import lru_cache

from ringtree.ir.check import CheckError, _Symbolic, _Values, with_virtual
from ringtree.ir.program import Buf, Collective, chunk_regions
from ringtree.ir.walk import ordered_deps, walk
from ringtree.schedules import Options, build_all, generate_all


class _RankValues(_Values):
    """Leaves named by their rank alone: ``in(r, j)`` for every chunk ``j`` is one leaf."""

    def leaf(self, *key: object) -> int:
        return super().leaf(key[0])


def _outputs(coll: Collective, algo: str, n: int, opts: Options, out_blocks: tuple[int, ...],
             in_place: bool, ranks: tuple[int, ...], vals: _Values, nbytes: int | None
             ) -> list[list[tuple[int, int, int | None]]] | None:
    """Per rank of ``ranks``: (start, end, tree id) of every output chunk's elements;
    None when the schedule does not run on symbols here."""
    programs = generate_all(coll, algo, n, opts) if nbytes is None else \
        build_all(coll, algo, n, nbytes, opts)
    if len(with_virtual(programs)) != n:
        return None  # a switch reduces part of it: outside what this proves
    in_place = in_place and all(p.in_place_ok for p in programs)  # else the planner copies
    ex = _Symbolic(programs, n, in_place, vals)
    try:
        stuck, queues = walk(programs, ex.run, ordered_deps(programs, in_place))
    except CheckError:
        return None
    if stuck or any(queues.values()):
        return None
    res = []
    for r in ranks:
        p = programs[r]
        regions = chunk_regions(list(out_blocks), p.chunks)
        res.append([(off, off + ln, ex.mem[r].get(ex.keys[r](Buf.OUTPUT, j)))
                    for j, (off, ln) in enumerate(regions) if ln])
    return res


def _same_runs(a: list[tuple[int, int, int | None]], b: list[tuple[int, int, int | None]]
               ) -> bool:
    """Do two partitions of one element range name the same id at every element?"""
    i = j = 0
    while i < len(a) and j < len(b):
        (a0, a1, va), (b0, b1, vb) = a[i], b[j]
        if max(a0, b0) < min(a1, b1) and va != vb:
            return False
        if a1 <= b1:
            i += 1
        if b1 <= a1:
            j += 1
    return True


@lru_cache(maxsize=256)
def same_bits(coll: Collective, first: str, second: str, n: int, opts: Options,
              out_blocks: tuple[int, ...], in_place: bool, nbytes: int | None = None) -> bool:
    """True when ``first`` and ``second`` reduce every output element of every rank that
    receives a result (the root of a reduce; every rank otherwise) by the same expression,
    for a call whose output blocks hold ``out_blocks`` elements, with the planner's
    options ``opts`` (nodes, channels, root): as given, or with ``nbytes`` the call's
    size, as each algorithm's record refines them for it (the Programs the planner
    would run, :func:`ringtree.schedules.build`). Cached per argument tuple."""
    if first == second:
        return True
    ranks = (opts.root,) if coll is Collective.REDUCE else tuple(range(n))
    vals = _RankValues()
    a = _outputs(coll, first, n, opts, out_blocks, in_place, ranks, vals, nbytes)
    b = _outputs(coll, second, n, opts, out_blocks, in_place, ranks, vals, nbytes)
    if a is None or b is None:
        return False
    return all(_same_runs(x, y) for x, y in zip(a, b))
