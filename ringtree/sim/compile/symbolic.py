"""Shared Programs: one symbolic Program that stands for every rank, when it exists.

A schedule generator is a pure function ``gen(nranks, rank, opts)``. Called with a
symbolic rank :class:`Sym` instead of an integer, it either finishes — then no branch,
loop bound, index or hash depended on the rank, and the result (a *template*) gives the
Program of every rank r by evaluating its expressions at r — or raises
:class:`NotSymmetric` at the first use of the rank that is not affine arithmetic.
Expressions have the form ``m·((r + a) mod M) + b``, which is what ring-like schedules
compute (``(r + 1) % n``, ``base + (r − j) % n``).

:func:`shift_ok` then proves, from the template alone, that rank r + g's Program is rank
r's with every peer shifted by g and chunks renamed by a size-preserving bijection — for
all r at once, in time proportional to one Program, which is what lets the simulator
fold 100,000 ranks onto a few without generating them. :func:`channel_classes` finds the
template's channels that are the same up to such a renaming.
"""

from __future__ import annotations

from typing import cast

from ringtree.ir.program import Buf, Collective, Program, Ref, Step, parse_collective
from ringtree.schedules import Options, generator
from ringtree.sim.compile.recent import Recent


class NotSymmetric(Exception):
    """The generator used the rank in a way a template cannot express."""


def _refuse(*_a, **_k):
    raise NotSymmetric("rank used outside affine arithmetic")


class Sym:
    """The rank-dependent integer ``m·((r + a) mod M) + b`` (``m·r + b`` when M = 0)."""

    __slots__ = ("m", "a", "mod", "b")

    def __init__(self, m: int = 1, a: int = 0, mod: int = 0, b: int = 0) -> None:
        self.m, self.a, self.mod, self.b = m, a, mod, b

    def at(self, r: int) -> int:
        return self.m * ((r + self.a) % self.mod) + self.b if self.mod else self.m * r + self.b

    def key(self) -> tuple[int, int, int, int]:
        return (self.m, self.a, self.mod, self.b)

    def __add__(self, k):
        if type(k) is not int:
            raise NotSymmetric("rank added to a non-integer")
        return Sym(self.m, self.a, self.mod, self.b + k)

    __radd__ = __add__

    def __sub__(self, k):
        if type(k) is not int:
            raise NotSymmetric("rank minus a non-integer")
        return Sym(self.m, self.a, self.mod, self.b - k)

    def __rsub__(self, k):
        return (-self) + k

    def __neg__(self):
        return Sym(-self.m, self.a, self.mod, -self.b)

    def __mul__(self, k):
        if type(k) is not int:
            raise NotSymmetric("rank times a non-integer")
        return Sym(self.m * k, self.a, self.mod, self.b * k)

    __rmul__ = __mul__

    def __mod__(self, k):
        if type(k) is not int or k <= 0:
            raise NotSymmetric("rank modulo a non-integer")
        if not self.mod and self.m == 1:
            return Sym(1, self.b, k, 0)
        if self.mod == k and self.m == 1 and self.b == 0:
            return self
        raise NotSymmetric("rank expression not of the form (r + a) mod n")

    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __pow__ = _refuse
    __and__ = __or__ = __xor__ = __lshift__ = __rshift__ = __rmod__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse
    __index__ = __int__ = _refuse

    def __bool__(self) -> bool:
        raise NotSymmetric("rank used as a truth value")

    def __float__(self) -> float:
        raise NotSymmetric("rank used as a float")

    def __hash__(self) -> int:
        raise NotSymmetric("rank used as a key")

    def __repr__(self) -> str:
        return f"Sym({self.m}*((r+{self.a})%{self.mod})+{self.b})"


# the templates of the last few runs: a sweep over sizes reads one template per size
KEEP = 8
_TEMPLATES = Recent("templates", KEEP)
_READS = Recent("template reads", KEEP)


def template(coll: Collective | str, algo: str, nranks: int, opts: Options) -> Program | None:
    """The symbolic Program of ``algo``, or None if the generator depends on the rank in
    any other way than affine arithmetic (or brings virtual ranks). Generators are pure,
    so the last few answers are kept."""
    key = (parse_collective(coll), algo.lower(), nranks, opts)
    return _TEMPLATES.lookup(key, lambda: _template(*key))


def reads(t: Program, p: Program) -> bool:
    """Is template ``t`` at ``p.rank`` the generated Program ``p`` (same channels)? Kept
    per pair of objects (both held, so their ids stay theirs)."""
    return _READS.lookup((id(t), id(p)), lambda: _reads(t, p), t, p)


def _reads(t: Program, p: Program) -> bool:
    """``instantiate(t, p.rank).channels == p.channels`` (the same comparison, field by
    field) without building rank r's Steps: each peer tuple of the template is evaluated
    once per object, each chunk expression where it is compared."""
    r = p.rank
    if len(t.channels) != len(p.channels):
        return False
    peer: dict[int, int] = {}                    # id of a peer expression (held by t)
    for tch, pch in zip(t.channels, p.channels):
        if len(tch) != len(pch):
            return False
        for ts, ps in zip(tch, pch):
            if ts.reduce != ps.reduce or not _ref_reads(ts.src, ps.src, r) \
                    or not _ref_reads(ts.dst, ps.dst, r):
                return False
            for tq, pq in ((ts.recv_from, ps.recv_from), (ts.send_to, ps.send_to)):
                if len(tq) != len(pq):
                    return False
                for q, v in zip(tq, pq):
                    got = peer.get(id(q))
                    if got is None:
                        got = peer[id(q)] = _val(q, r)
                    if got != v:
                        return False
    return True


def _ref_reads(tr: Ref | None, pr: Ref | None, r: int) -> bool:
    """Is template reference ``tr`` at rank r the reference ``pr`` (``Ref.__eq__``)?"""
    if tr is None or pr is None:
        return tr is pr
    x = tr.index
    return tr.buf == pr.buf and tr.count == pr.count and \
        _val(x, r) == pr.index


def _template(coll: Collective, algo: str, nranks: int, opts: Options) -> Program | None:
    gen = generator(coll, algo)
    if gen is None or nranks < 2:
        return None
    try:
        p = gen(nranks, cast(int, Sym()), opts)    # duck-typed: the generator's rank
    except Exception:        # any use of the rank a template cannot express
        return None
    if p.meta.get("virtual_programs") or not isinstance(p.rank, Sym):
        return None
    return p


def _val(x, r: int) -> int:
    """x at rank r: a :class:`Sym`, an XSym (:mod:`.xor_symbolic`), or a constant."""
    at = getattr(x, "at", None)
    return x if at is None else at(r)


def _ref_at(ref: Ref | None, r: int) -> Ref | None:
    return None if ref is None else Ref(ref.buf, _val(ref.index, r), ref.count)


def instantiate(t: Program, r: int, empty: frozenset[int] = frozenset()) -> Program:
    """The concrete Program of rank r from template ``t`` (the channels ``empty``
    left empty)."""
    chans = tuple(() if c in empty else
                  tuple(Step(_ref_at(s.src, r), _ref_at(s.dst, r),
                             tuple(_val(q, r) for q in s.recv_from),
                             tuple(_val(q, r) for q in s.send_to), s.reduce)
                        for s in ch) for c, ch in enumerate(t.channels))
    return Program(t.collective, t.algo, t.nranks, r, t.chunks, chans, _val(t.root, r),
                   t.scratch, t.in_place_ok, dict(t.meta))


# ---- proofs on the template ------------------------------------------------------------

ALIASED = (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.REDUCE,
           Collective.ALL_TO_ALL)


def _space(buf: Buf, coll: Collective, in_place: bool) -> Buf:
    """The storage a buffer lives in (in place, the output of these is the input)."""
    return Buf.INPUT if in_place and buf is Buf.OUTPUT and coll in ALIASED else buf


def peer_offset(q, n: int) -> int | None:
    """a if the peer expression is (r + a) mod n (or r itself), else None."""
    if not isinstance(q, Sym):
        return None
    if q.m == 1 and q.b == 0 and (q.mod == n or (q.mod == 0 and q.a == 0)):
        return q.a % n
    return None


def offset_of(q, n: int) -> int:
    """:func:`peer_offset` of a peer already proven to be (r + a) mod n."""
    a = peer_offset(q, n)
    if a is None:
        raise NotSymmetric(f"peer {q!r} is not (r + a) mod {n}")
    return a


def _families(t: Program, regs: dict, in_place: bool):
    """Index families per storage: {(space, m, M, b)} and concrete indices, or None."""
    n = t.nranks
    if in_place and t.collective not in ALIASED:
        return None
    fams: dict[tuple, set[int]] = {}
    fixed: dict[Buf, set[int]] = {}
    for ch in t.channels:
        for s in ch:
            if any(peer_offset(q, n) is None for q in s.recv_from + s.send_to):
                return None
            for ref in (s.src, s.dst):
                if ref is None:
                    continue
                sp = _space(ref.buf, t.collective, in_place)
                if not isinstance(ref.index, Sym):
                    if ref.index + ref.count > len(regs[ref.buf]):
                        return None
                    fixed.setdefault(sp, set()).update(ref.chunks())
                    continue
                x = ref.index
                if not x.mod or n % x.mod or not x.m or ref.count != 1:
                    return None
                k = (sp, ref.buf, x.m, x.mod, x.b)
                if k not in fams:
                    idx = {x.m * i + x.b for i in range(x.mod)}
                    if min(idx) < 0 or max(idx) >= len(regs[ref.buf]):
                        return None
                    fams[k] = idx
    return fams, fixed


def _disjoint(fams: dict, fixed: dict) -> bool:
    seen: dict[Buf, dict[int, tuple]] = {}
    for k, idx in fams.items():
        sp, fam = k[0], (k[2], k[3], k[4])
        owner = seen.setdefault(sp, {})
        for i in idx:
            if i in fixed.get(sp, ()) or owner.setdefault(i, fam) != fam:
                return False
    return True


def shift_periods(t: Program, gs: list[int], regs: dict, in_place: bool) -> list[int]:
    """The shifts g in ``gs`` under which every rank's Program is rank (r − g)'s with peers
    shifted by g and chunks renamed by a size-preserving bijection, and a channel's peers
    stay distinct modulo g (a folded connection must be one peer)."""
    n = t.nranks
    got = _families(t, regs, in_place)
    if got is None or not _disjoint(*got):
        return []
    peers = [{offset_of(q, n) for s in ch for q in s.recv_from + s.send_to}
             for ch in t.channels]
    out = []
    for g in gs:
        if n % g or any(len({a % g for a in ps}) != len(ps) for ps in peers):
            continue
        if all(all(regs[buf][m * i + b] == regs[buf][m * ((i + g) % mod) + b]
                   for i in range(mod)) for (_, buf, m, mod, b) in got[0]):
            out.append(g)
    return out


def shift_ok(t: Program, g: int, regs: dict, in_place: bool) -> bool:
    """:func:`shift_periods` for one shift."""
    return shift_periods(t, [g], regs, in_place) == [g]


def offsets(t: Program) -> list[set[int]]:
    """Per channel, the offsets a of the peers (r + a) mod n the channel sends to."""
    n = t.nranks
    return [{offset_of(q, n) for s in ch for q in s.send_to} for ch in t.channels]
