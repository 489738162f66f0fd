"""A run's Programs made one at a time when read (:class:`Made`), so that compiling them
one after another never holds every rank's Program at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from ringtree.ir.program import Program


class Made(Sequence[Program]):
    """Programs indexed by rank (then virtual rank), each made by :meth:`make` when it
    is read; subclasses give :meth:`__len__` and :meth:`make`."""

    def __len__(self) -> int:
        raise NotImplementedError

    def make(self, i: int) -> Program:
        """The Program of index ``i`` (0 ≤ i < len)."""
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> Program: ...

    @overload
    def __getitem__(self, i: slice) -> list[Program]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.make(i)
