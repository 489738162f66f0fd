"""Is one rank's Program another's moved? The Programs' half of a fold (:mod:`.symmetry`
proves the whole fold): the peers moved by a shift or a XOR of blocks, the chunks renamed
by a size-preserving bijection — a XOR mask per buffer, positionally, or by sets
(:mod:`.renaming`) — and the chunk lengths at a count that the renamings read.
"""

from __future__ import annotations

from ringtree.ir.program import Buf, Program, chunk_regions
from ringtree.sim.compile import renaming
from ringtree.sim.compile.recent import Recent


def _regions(blocks: int, count: int, chunks: int) -> list[int]:
    return [ln for _, ln in chunk_regions([count] * blocks, chunks)]


def _ref_ok(x, y, regs: dict, fwd: dict, bwd: dict, kp, kq) -> bool:
    if (x is None) != (y is None):
        return False
    if x is None:
        return True
    if x.buf != y.buf or x.count != y.count:
        return False
    rg = regs[x.buf]
    for j, k in zip(x.chunks(), y.chunks()):
        if rg[j] != rg[k]:
            return False
        a, b = kp(x.buf, j), kq(y.buf, k)
        if fwd.setdefault(a, b) != b or bwd.setdefault(b, a) != a:
            return False
    return True


def same_shape(p: Program, q: Program, dr: int, n: int, regs: dict, in_place: bool,
               xor_g: int = 0) -> bool:
    """Is Program p (rank r) Program q (rank r − dr) with peers shifted by dr and chunks
    renamed by a size-preserving bijection (so every dependency and size is the same)?
    With ``xor_g``: p's rank is q's with its block of ``xor_g`` ranks XOR dr, and so are
    the peers (:func:`~ringtree.sim.compile.compiled.image`).

    The renaming is either a XOR of the chunk index by one mask per buffer mapping each
    reference onto its counterpart as a set (out of place; a butterfly's halves swap
    places) or positional (the j-th chunk of a reference is the j-th of its counterpart,
    one bijection for the whole Program), or (out of place) any length-keeping bijection
    of the slots that maps each reference onto its counterpart as a set
    (:func:`.renaming.by_sets`): the memory dependencies (from which storage two steps
    share), the element lengths and the slices are then the same."""
    if not _peers_ok(p, q, dr, n, xor_g):
        return False
    return _renamed(p, q, regs, in_place, None if in_place else _xor_masks(p, q))


def _renamed(p: Program, q: Program, regs: dict, in_place: bool,
             masks: frozenset | None) -> bool:
    """The chunk renaming part of :func:`same_shape`, given p's XOR masks against q."""
    if masks is not None and all(_xor_keeps_lengths(regs[b], m) for b, m in masks if m):
        return True
    if _positional(p, q, regs, in_place):
        return True
    return not in_place and renaming.by_sets(p, q, regs)


def _peers_ok(p: Program, q: Program, dr: int, n: int, xor_g: int) -> bool:
    """Same channels and steps, peers moved, chunks and scratch alike."""
    if (len(p.channels) != len(q.channels) or p.chunks != q.chunks
            or p.scratch != q.scratch):
        return False
    xg = xor_g
    for cp_, cq in zip(p.channels, q.channels):
        if len(cp_) != len(cq) or [(s.reduce, len(s.recv_from), len(s.send_to))
                                   for s in cp_] != [(t.reduce, len(t.recv_from),
                                                      len(t.send_to)) for t in cq]:
            return False
        mine = [a for s in cp_ for a in s.recv_from + s.send_to]
        theirs = [b for t in cq for b in t.recv_from + t.send_to]
        moved = [((b // xg) ^ dr) * xg + b % xg for b in theirs] if xg else \
            [(b + dr) % n for b in theirs]       # image(b, dr, xg, n, xg > 0)
        if mine != moved:
            return False
    return True


def _positional(p: Program, q: Program, regs: dict, in_place: bool) -> bool:
    kp, kq = p.storage_map(in_place), q.storage_map(in_place)
    fwd: dict = {}
    bwd: dict = {}
    return all(_ref_ok(s.src, t.src, regs, fwd, bwd, kp, kq)
               and _ref_ok(s.dst, t.dst, regs, fwd, bwd, kp, kq)
               for cp_, cq in zip(p.channels, q.channels) for s, t in zip(cp_, cq))


def _xor_masks(p: Program, q: Program) -> frozenset | None:
    """The masks (buffer, m) such that chunk j ↦ j XOR m maps every reference of q onto
    p's as a set, m read off the first single-chunk reference of each buffer; None if
    there are none. Lengths are not read (:func:`_xor_keeps_lengths` does). Where every
    reference is its counterpart's (recursive doubling's whole channels), the masks are
    0 for each buffer with a single-chunk reference, which is what the checks below
    would find."""
    mine = [(s.src, s.dst) for ch in p.channels for s in ch]
    theirs = [(t.src, t.dst) for ch in q.channels for t in ch]
    if list(map(len, p.channels)) == list(map(len, q.channels)) and mine == theirs:
        return frozenset((x.buf, 0) for pr in mine for x in pr
                         if x is not None and x.count == 1)
    return _xor_masks_read(p, q)


def _xor_masks_read(p: Program, q: Program) -> frozenset | None:
    """:func:`_xor_masks` read reference by reference."""
    pairs = [(x, y) for cp_, cq in zip(p.channels, q.channels) for s, t in zip(cp_, cq)
             for x, y in ((s.src, t.src), (s.dst, t.dst))]
    mask: dict = {}
    for x, y in pairs:
        if (x is None) != (y is None) or (x is not None and (x.buf != y.buf
                                                             or x.count != y.count)):
            return None
        if x is not None and x.count == 1 and x.buf not in mask:
            mask[x.buf] = x.index ^ y.index
    nchunks = {b: p.chunks * k for b, k in zip(
        (Buf.INPUT, Buf.OUTPUT), p.collective.blocks(p.nranks))}
    nchunks[Buf.SCRATCH] = p.chunks * p.blocks(Buf.SCRATCH)
    for x, y in pairs:
        if x is None:
            continue
        m = mask.get(x.buf, 0)
        if nchunks[x.buf] % (1 << m.bit_length()):
            return None                          # XOR by m leaves the buffer
        c = x.count
        if c & (c - 1) == 0 and x.index % c == 0:
            if y.index != (x.index ^ m) & ~(c - 1):
                return None
        elif sorted(j ^ m for j in range(x.index, x.index + c)) != \
                list(range(y.index, y.index + c)):
            return None
    return frozenset(mask.items())


def _xor_keeps_lengths(rg: list[int], m: int) -> bool:
    return _LENGTHS.lookup((id(rg), m), lambda: all(rg[j] == rg[j ^ m]
                                                     for j in range(len(rg))), rg)


_LENGTHS = Recent("xor lengths", 65)

def regions(p: Program, count: int) -> dict:
    """Element length of every chunk of every buffer of ``p``'s collective."""
    ib, ob = p.collective.blocks(p.nranks)
    return {Buf.INPUT: _regions(ib, count, p.chunks),
            Buf.OUTPUT: _regions(ob, count, p.chunks),
            Buf.SCRATCH: _regions(p.blocks(Buf.SCRATCH), count, p.chunks)}


def pattern(p: Program, count: int) -> tuple:
    """Which chunks of each buffer have equal lengths at ``count`` (each chunk labelled by
    the first chunk of its length): all that :func:`same_shape` reads of the lengths, so
    two counts with one pattern fold alike."""
    return _labels(regions(p, count))


def _labels(regs: dict) -> tuple:                 # pattern() of regions()
    out = []
    for b, rg in regs.items():
        first: dict[int, int] = {}
        out.append((b, tuple(first.setdefault(ln, j) for j, ln in enumerate(rg))))
    return tuple(out)
