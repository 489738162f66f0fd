"""A :class:`~.compiled.Compiled` kept as NumPy arrays, its lists made only when read.

``Compiled`` is parallel Python lists by contract, and every engine but the compiled heap
reads them. A run built from arrays (the tree from its wiring,
:func:`~.tree_wired.compile_tree`) has them as arrays first; on 131,072 ranks making the
8.4 M steps' lists and tuples, and the engines' packing them back into arrays, was a
third of the run. :class:`Wired` keeps the arrays (``arrays``) and makes each list field
the first time it is read, from the same integers and the same shared tuples, so an
engine that reads lists sees the very Compiled it saw before, and the compiled heap
(:mod:`ringtree.sim.engines.heap_arrays`) reads the arrays and never makes the lists.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import numpy as np

from ringtree.sim.compile.compiled import Compiled

__all__ = ["Wired", "connections", "tuples"]

_I = np.int64


class Wired(Compiled):
    """A Compiled whose list fields named in ``make`` are made by ``make[name]()`` when
    first read. ``arrays`` holds the integer fields as int64 arrays of the same names
    (``step_rank``, ``step_chan``, ``step_prev``, ``step_ops``, ``msg_src``, ``msg_dst``,
    ``msg_chan``, ``msg_conn``, ``msg_sstep``, ``msg_rstep``); per step ``row`` (the index
    of its slices, dependencies and name in ``table``), ``first`` (its rank's first
    step), ``send`` and ``recv`` (offsets, message ids); per connection ``conn_ends``
    (sender, receiver, channel); ``table`` is (slices, dependencies, names) per row."""

    def __init__(self, nranks: int, arrays: dict, make: dict[str, Callable[[], list]]
                 ) -> None:
        super().__init__(nranks, world=nranks)
        for name in make:
            delattr(self, name)                  # read through __getattr__ from now on
        self.arrays = arrays
        self._make = make

    def __getattr__(self, name: str):
        make = self.__dict__.get("_make")
        if make is None or name not in make:
            raise AttributeError(name)
        value = make.pop(name)()
        setattr(self, name, value)
        return value

    @property
    def nsteps(self) -> int:
        return len(self.arrays["step_rank"])

    @property
    def nmsgs(self) -> int:
        return len(self.arrays["msg_src"])


def connections(cp: Compiled) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sender, receiver, channel) of every connection, as arrays (ranks routed
    between: ``conn_ranks``)."""
    if isinstance(cp, Wired):
        return cp.arrays["conn_ends"]
    n = len(cp.conns)
    ends = np.fromiter(chain.from_iterable(cp.conn_ranks), _I, 2 * n).reshape(n, 2)
    return ends[:, 0], ends[:, 1], np.fromiter((c for _, _, c in cp.conns), _I, n)


def tuples(off: np.ndarray, ids: np.ndarray) -> list[tuple[int, ...]]:
    """Row i of the packed rows (``ids[off[i]:off[i + 1]]``) as a tuple, one shared empty
    tuple for the empty rows."""
    total = len(off) - 1
    have = np.diff(off)
    width = int(have.max(initial=0))
    grid = np.full((total, max(width, 1)), -1, _I)
    rows = np.repeat(np.arange(total, dtype=_I), have)
    grid[rows, np.arange(len(ids), dtype=_I) - off[:-1][rows]] = ids
    empty: tuple[int, ...] = ()
    if width <= 2:                   # a binary tree's steps: one comprehension
        cols = grid[:, 0].tolist(), grid[np.arange(total), np.maximum(have - 1, 0)].tolist()
        return [empty if h == 0 else (x,) if h == 1 else (x, y)
                for h, x, y in zip(have.tolist(), *cols)]
    out: list[tuple[int, ...]] = [empty] * total
    for k in range(1, width + 1):
        at = np.flatnonzero(have == k)
        for i, v in zip(at.tolist(), zip(*(grid[at, j].tolist() for j in range(k)))):
            out[i] = v
    return out
