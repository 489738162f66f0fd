"""Shared Programs for butterflies: one symbolic Program whose expressions are XORs of
the rank's bits, and the XOR fold proved on it for every rank at once.

:mod:`.symbolic` runs a generator on an affine rank (``(r + a) mod n``), which is what
rings compute. Butterflies compute ``v ^ 2^k`` and ``v & ~(2^k − 1)``: :class:`XSym` is
the rank-dependent integer ``(r & M) ^ c`` (the rank's bits in M, flipped by c), closed
under XOR, AND and OR with integers and XOR with another XSym, and under + and − where no
carry can occur; a comparison or truth value is answered only where it is the same for
every rank 0 ≤ r < n (n a power of two, so r takes every value of its bits), and any
other use of the rank raises :class:`~.symbolic.NotSymmetric`. A generator that finishes
on it (a *XOR template*) gives every rank's Program by evaluating its expressions.

:func:`xor_masks` then proves, from the template alone, what :mod:`..fold.symmetry`'s
scan proves rank by rank for a XOR fold of blocks of g ranks: for every generator d
(one bit of the block index, in ranks ``g·2^k``) and every rank r, rank r XOR d's
Program is rank r's with every peer q moved to q XOR d (a peer ``(r & M) ^ c`` does
exactly that when M holds every bit of d) and every chunk j of buffer b renamed to
j XOR m_b, one mask per buffer: a reference ``(r & M) ^ c`` of 2^e chunks aligned for
every r moves to ``idx ^ (d & M)``, which is its chunks XOR m_b exactly when m_b's bits
from e up are d & M. The steps, counts and reductions are the template's at every rank.
Renamings compose, so the generators' masks prove the whole group's; the chunk lengths
each mask must keep are checked per count (:func:`.fold.moved._xor_keeps_lengths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from ringtree.ir.program import Buf, Collective, Program, parse_collective
from ringtree.schedules import Options, generate, generator
from ringtree.sim.compile.compiled import Lengths, _moves
from ringtree.sim.compile.ranks import Made
from ringtree.sim.compile.recent import Recent
from ringtree.sim.compile.symbolic import KEEP, NotSymmetric, instantiate, reads


def _refuse(*_a, **_k):
    raise NotSymmetric("rank used outside XOR arithmetic")


class XSym:
    """The rank-dependent integer ``(r & M) ^ c`` for ranks 0 ≤ r < n, n a power of two
    and M ⊆ n − 1 (so the bits of M take every combination of values)."""

    __slots__ = ("m", "c")

    def __init__(self, m: int, c: int = 0) -> None:
        self.m, self.c = m, c

    def at(self, r: int) -> int:
        return (r & self.m) ^ self.c

    def at_all(self, r: np.ndarray) -> np.ndarray:
        return (r & self.m) ^ self.c

    @staticmethod
    def make(m: int, c: int):
        return XSym(m, c) if m else c

    @property
    def low(self) -> int:
        return self.c & ~self.m

    @property
    def high(self) -> int:
        return self.c | self.m

    def __xor__(self, k):
        if type(k) is int:
            return XSym.make(self.m, self.c ^ k)
        if type(k) is XSym:
            return XSym.make(self.m ^ k.m, self.c ^ k.c)
        raise NotSymmetric("rank XOR a non-integer")

    __rxor__ = __xor__

    def __and__(self, k):
        if type(k) is not int:
            raise NotSymmetric("rank AND a non-integer")
        return XSym.make(self.m & k, self.c & k)

    __rand__ = __and__

    def __or__(self, k):
        if type(k) is not int or k < 0:
            raise NotSymmetric("rank OR a non-integer")
        return XSym.make(self.m & ~k, self.c | k)

    __ror__ = __or__

    def __add__(self, k):
        bits = k.high if type(k) is XSym else k
        if type(bits) is not int or bits < 0 or bits & self.high:
            raise NotSymmetric("rank added where a carry may occur")
        return self ^ k                           # no common bit: + is XOR

    __radd__ = __add__

    def __sub__(self, k):
        if type(k) is not int or k < 0 or k & ~self.low:
            raise NotSymmetric("rank minus bits it may not have")
        return self ^ k                           # every bit of k set: − is XOR

    def __lt__(self, k):
        return self._cmp(k, self.high < k, self.low >= k)

    def __le__(self, k):
        return self._cmp(k, self.high <= k, self.low > k)

    def __gt__(self, k):
        return self._cmp(k, self.low > k, self.high <= k)

    def __ge__(self, k):
        return self._cmp(k, self.low >= k, self.high < k)

    @staticmethod
    def _cmp(k, always: bool, never: bool) -> bool:
        if type(k) is not int or not (always or never):
            raise NotSymmetric("a comparison of the rank that depends on it")
        return always

    def __bool__(self) -> bool:
        if self.low:
            return True                           # a bit set at every rank
        raise NotSymmetric("rank used as a truth value")

    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __pow__ = _refuse
    __mul__ = __rmul__ = __mod__ = __rmod__ = __lshift__ = __rshift__ = __neg__ = _refuse
    __rsub__ = __invert__ = __eq__ = __ne__ = __index__ = __int__ = _refuse

    def __float__(self) -> float:
        raise NotSymmetric("rank used as a float")

    def __hash__(self) -> int:
        raise NotSymmetric("rank used as a key")

    def __repr__(self) -> str:
        return f"XSym((r&{self.m:#x})^{self.c:#x})"


_TEMPLATES = Recent("xor templates", KEEP)


def xor_template(coll: Collective | str, algo: str, nranks: int, opts: Options
                 ) -> Program | None:
    """The XOR template of ``algo`` on ``nranks`` (a power of two, at least 4), or None
    where the generator uses the rank otherwise (or brings virtual ranks)."""
    key = (parse_collective(coll), algo.lower(), nranks, opts)
    return _TEMPLATES.lookup(key, lambda: _template(*key))


def _template(coll: Collective, algo: str, nranks: int, opts: Options) -> Program | None:
    gen = generator(coll, algo)
    if gen is None or nranks < 4 or nranks & (nranks - 1):
        return None
    try:
        p = gen(nranks, cast(int, XSym(nranks - 1)), opts)
    except Exception:        # any use of the rank a XOR template cannot express
        return None
    if p.meta.get("virtual_programs") or type(p.rank) is not XSym:
        return None
    return p


def proved(t: Program, programs) -> bool:
    """The template reads the generated Programs of ranks 0 and n − 1 (a generator that
    looked at its rank's type would not)."""
    n = t.nranks
    return reads(t, programs[0]) and reads(t, programs[n - 1])


def _buffer_chunks(t: Program) -> dict[Buf, int]:
    ib, ob = t.collective.blocks(t.nranks)
    return {Buf.INPUT: ib * t.chunks, Buf.OUTPUT: ob * t.chunks,
            Buf.SCRATCH: t.chunks * t.blocks(Buf.SCRATCH)}


def xor_masks(t: Program, g: int, in_place: bool) -> list[dict[Buf, int]] | None:
    """Per generator of the XOR fold of blocks of g ranks (block bit k: ranks XOR
    ``g << k``), the chunk mask of each buffer under which every rank's Program is its
    image's (module docstring), or None where the template does not prove it (in place,
    a peer that does not move with its rank, a reference not aligned at every rank)."""
    n = t.nranks
    if in_place or g & (g - 1) or n % g or n // g < 4:
        return None
    block_bits = (n - 1) & ~(g - 1)
    refs = []
    for ch in t.channels:
        for s in ch:
            for q in s.recv_from + s.send_to:
                if type(q) is not XSym or q.m & block_bits != block_bits:
                    return None
            refs += [x for x in (s.src, s.dst) if x is not None]
    size = _buffer_chunks(t)
    forms = {}
    for x in refs:
        m, c = (x.index.m, x.index.c) if type(x.index) is XSym else (0, x.index)
        if (c | m) + x.count > size[x.buf]:
            return None
        forms[(x.buf, m, c, x.count)] = None
    out = []
    for k in range((n // g).bit_length() - 1):
        got = _masks(forms, g << k, size)
        if got is None:
            return None
        out.append(got)
    return out


def _masks(forms: dict, d: int, size: dict[Buf, int]) -> dict[Buf, int] | None:
    """One generator's mask per buffer (bits from each reference's alignment up: d & M;
    below: those of the buffer's smallest such reference), checked on every form."""
    mask: dict[Buf, tuple[int, int]] = {}
    for b, m, _, k in forms:
        if d & m and (mask.get(b, (1 << 62, 0))[0] > k):
            mask[b] = (k, d & m)
    got = {b: dm for b, (_, dm) in mask.items()}
    for b, m, c, k in forms:
        mb, dm = got.get(b, 0), d & m
        if k & (k - 1) == 0 and (m | c) & (k - 1) == 0:    # aligned at every rank
            if mb & ~(k - 1) != dm:
                return None
        elif mb or dm:                            # a run XOR a mask is not a run
            return None
    for b, mb in got.items():
        if size[b] % (1 << mb.bit_length()):
            return None                           # XOR by the mask leaves the buffer
    return got


def connections(t: Program) -> np.ndarray:
    """(rank, peer, channel) of every send of every rank, as rows of an array (a row
    may repeat)."""
    n = t.nranks
    r = np.arange(n, dtype=np.int64)
    parts = []
    for c, ch in enumerate(t.channels):
        for q in {(q.m, q.c) if type(q) is XSym else (0, q)
                  for s in ch for q in s.send_to}:
            parts.append(np.stack([r, (r & q[0]) ^ q[1], np.full(n, c)], axis=1))
    return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)


# from this many steps (ranks × rank 0's) on, an unfolded run reads its Programs with the
# channels that move no data at any rank left empty (:class:`Emptied`)
EMPTIED_FROM_STEPS = 1 << 19


def _spans(ch) -> list[tuple[Buf, int, int]]:
    """(buffer, first, end) of chunks covering every chunk the channel's steps may name
    at some rank: ``(r & M) ^ c`` lies between c & ~M and c | M."""
    out = []
    for s in ch:
        for x in (s.src, s.dst):
            if x is not None:
                m, c = (x.index.m, x.index.c) if type(x.index) is XSym else (0, x.index)
                out.append((x.buf, c & ~m, (c | m) + x.count))
    return out


def empty_channels(t: Program, pre: dict[Buf, list[int]]) -> frozenset[int]:
    """The template's channels whose steps name chunks of no data at every rank (``pre``:
    the chunk lengths' prefix sums), when no other channel may name those chunks (so
    emptying them leaves every other channel's memory dependencies) and some channel
    is left; else none."""
    spans = [_spans(ch) for ch in t.channels]
    drop = {c for c, sp in enumerate(spans) if sp and all(
        0 <= lo and hi < len(pre[b]) and pre[b][hi] == pre[b][lo] for b, lo, hi in sp)}
    if len(drop) == sum(1 for sp in spans if sp):
        return frozenset()                       # nothing moves: ``moving`` keeps all
    for c in drop:
        for k, sp in enumerate(spans):
            if k not in drop and any(b == b2 and lo < hi2 and lo2 < hi for b, lo, hi in
                                     spans[c] for b2, lo2, hi2 in sp):
                return frozenset()
    return frozenset(drop)


class Emptied(Made):
    """Every rank's Program read off the XOR template with the channels
    :func:`empty_channels` finds left empty — what :func:`.compiled.moving` makes of
    the generated Program, which empties those channels too (they move nothing and
    share no chunk with the others) — or, at a rank where no channel left moves data
    (``moving`` then keeps every channel), the generated Program. Out of place, for
    the congestion-aware model (the unaware one reads the empty channels' connections)."""

    def __init__(self, t: Program, opts: Options, empty: frozenset[int],
                 pre: dict[Buf, list[int]]) -> None:
        self.t, self.opts, self.empty, self.pre = t, opts, empty, pre

    @staticmethod
    def of(coll: Collective, algo: str, n: int, opts: Options, count: int,
           programs: Sequence[Program]) -> Emptied | None:
        """The run's Programs so, where the template proves channels empty; else None."""
        t = xor_template(coll, algo, n, opts)
        if t is None or not proved(t, programs):
            return None
        pre = Lengths(n, count).of(t)
        empty = empty_channels(t, pre)
        return Emptied(t, opts, empty, pre) if empty else None

    def __len__(self) -> int:
        return self.t.nranks

    def make(self, i: int) -> Program:
        t = self.t
        p = instantiate(t, i, self.empty)
        if any(_moves(ch, self.pre) for ch in p.channels):
            return p
        return generate(t.collective, t.algo, t.nranks, i, self.opts)
