"""A shared template Program compiled for the batched engine (:mod:`.batched`): per step
and simulated rank, the slices (the executor's ``split_even`` of the step's region), the
reduction passes, the memory dependencies (``Program.memory_deps`` via the executor's
compiler, the same for every rank of a proven template), which send feeds which receive,
and the template's dependency levels."""

from __future__ import annotations

import copy

import numpy as np

from ringtree.ir.program import Program
from ringtree.runtime.plan import compile_program
from ringtree.sim.compile.compiled import passes
from ringtree.sim.compile.recent import Recent
from ringtree.sim.compile.symbolic import ALIASED, Sym, _space, offset_of
from ringtree.sim.fold.moved import regions


class Unordered(Exception):
    """A link would serve chunks out of arrival order, or the template's messages do not
    pair up: use the event engine. ``copy``: which copy of a :func:`stacked` run broke
    the order (None: all of them, the template's structure)."""

    def __init__(self, why: str, copy: int | None = None) -> None:
        super().__init__(why)
        self.copy = copy


class Template:
    """A template Program compiled for ranks 0..g−1 of an n-rank run (g = n: all)."""

    def __init__(self, t: Program, p0: Program, g: int, count: int, itemsize: int,
                 slice_bytes: int, in_place: bool) -> None:
        self.n = t.nranks
        self.g = g
        self.gc, self.copies = g, 1              # ranks per copy, copies (:func:`stacked`)
        self._keep = _fixed(t, p0, count, itemsize, slice_bytes, in_place)
        deps, ops = self._keep[3], self._keep[4]
        regs = {b: np.asarray(v, np.int64) for b, v in regions(t, count).items()}
        ranks = np.arange(g)
        elems = max(1, slice_bytes // max(1, itemsize))
        self.steps = [(c, j, s) for c, ch in enumerate(t.channels) for j, s in enumerate(ch)]
        self.nchan = len(t.channels)
        self.maxj = max((len(ch) for ch in t.channels), default=0) + 1
        self.prev: list[int] = []
        self.deps: list[tuple[int, ...]] = []
        self.ops: list[int] = []
        self.nsl: list[np.ndarray] = []
        self.sl: list[np.ndarray] = []          # (g, K) slice bytes, 0-padded
        cut: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}    # per lengths: slices
        for gid, (_, j, s) in enumerate(self.steps):
            self.prev.append(gid - 1 if j else -1)
            self.deps.append(deps[gid])
            self.ops.append(ops[gid])
            length = _length(s.dst if s.dst is not None else s.src, regs, ranks)
            got = cut.get(length.tobytes())
            if got is None:
                got = cut[length.tobytes()] = self._slices(length, elems, itemsize)
            self.nsl.append(got[0])
            self.sl.append(got[1])
        self._pair(t)
        self.order: list[list[int]] = []
        # the (channel, offset) connections every rank declares: the unaware model's
        # link shares (set to the unpruned template's when channels were emptied)
        self.share_offs = declared_offsets(t)

    def _slices(self, length: np.ndarray, elems: int, itemsize: int
                ) -> tuple[np.ndarray, np.ndarray]:
        """Slices per rank of a step of these lengths, and their bytes (0-padded)."""
        nsl = -(-length // elems)
        k = int(nsl.max()) if nsl.size else 0
        base, extra = np.divmod(length, np.maximum(nsl, 1))
        idx = np.arange(k)
        sl = (base[:, None] + (idx[None, :] < extra[:, None])) * (idx[None, :] < nsl[:, None])
        return self._intern(nsl), self._intern((sl * itemsize).astype(np.float64))

    def _intern(self, a: np.ndarray) -> np.ndarray:
        """One array for every step with the same contents (a ring's steps all share)."""
        pool = self.__dict__.setdefault("_pool", {})
        return pool.setdefault((a.dtype.str, a.shape, a.tobytes()), a)

    def _pair(self, t: Program) -> None:
        """The k-th send of every (channel, offset) meets the k-th receive (IR rule)."""
        n = self.n
        sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
        recvs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for gid, (c, _, s) in enumerate(self.steps):
            for pos, q in enumerate(s.send_to):
                sends.setdefault((c, offset_of(q, n)), []).append((gid, pos))
            for pos, q in enumerate(s.recv_from):
                recvs.setdefault((c, -offset_of(q, n) % n), []).append((gid, pos))
        # a sender's connections (channel, offset) in the order of their first sends:
        # the message numbering's (:func:`.pairing.issue_order`), the same at every rank
        self.conn_rank = {k: i for i, k in enumerate(sorted(sends, key=sends.__getitem__))}
        self.recv_of: dict[tuple[int, int], tuple[int, int, int]] = {}  # (rstep,pos)->(sstep,c,a)
        self.send_of: dict[tuple[int, int], tuple[int, int, int]] = {}  # (sstep,pos)->(rstep,rpos,a)
        alike: dict[tuple[int, int, int, int, int], bool] = {}  # interned arrays, offset
        for key in set(sends) | set(recvs):
            ss, rr = sends.get(key, []), recvs.get(key, [])
            if len(ss) != len(rr):
                raise Unordered(f"channel {key[0]}: {len(ss)} sends but {len(rr)} receives")
            c, a = key
            src_cls = (np.arange(self.g) - a) % n % self.g
            for (s1, p1), (s2, p2) in zip(ss, rr):
                k = (id(self.nsl[s1]), id(self.nsl[s2]), id(self.sl[s1]), id(self.sl[s2]), a)
                ok = alike.get(k)
                if ok is None:
                    ok = alike[k] = np.array_equal(self.nsl[s1][src_cls], self.nsl[s2]) \
                        and np.array_equal(self.sl[s1][src_cls], self.sl[s2])
                if not ok:
                    raise Unordered("message sizes differ between sender and receiver")
                self.recv_of[(s2, p2)] = (s1, c, a)
                self.send_of[(s1, p1)] = (s2, p2, a)

    def levels(self) -> list[list[int]]:
        """Template steps grouped by depth in the dependency graph (Kahn); the same for
        every size of one template, so kept with its memory dependencies."""
        keep = self._keep
        if keep[5] is None:
            keep[5] = self._levels()
        return keep[5]

    def _levels(self) -> list[list[int]]:
        ns = len(self.steps)
        preds: list[set[int]] = [set() for _ in range(ns)]
        for s in range(ns):
            if self.prev[s] >= 0:
                preds[s].add(self.prev[s])
            preds[s].update(self.deps[s])
        for (s2, _), (s1, _, _) in self.recv_of.items():
            preds[s2].add(s1)
        depth = [0] * ns
        order = sorted(range(ns), key=lambda s: (self.steps[s][1], self.steps[s][0]))
        left = {s: set(p) for s, p in enumerate(preds)}
        succ: list[list[int]] = [[] for _ in range(ns)]
        for s, p in enumerate(preds):
            for q in p:
                succ[q].append(s)
        frontier = [s for s in order if not left[s]]
        out: list[list[int]] = []
        seen = 0
        while frontier:
            out.append(frontier)
            seen += len(frontier)
            nxt = []
            for s in frontier:
                for d in succ[s]:
                    left[d].discard(s)
                    if not left[d]:
                        depth[d] = len(out)
                        nxt.append(d)
            frontier = sorted(nxt)
        if seen != ns:
            raise Unordered("a step waits on itself through another rank (pipelined chain)")
        return out


def structure(tp: Template) -> tuple:
    """What of a Template does not depend on its count: the steps (by identity), their
    order, dependencies, reduction passes and message pairing. Two Templates with the
    same structure differ only in their slices (:func:`stacked`)."""
    return (tp.n, tp.g, tp.nchan, tuple(id(s) for _, _, s in tp.steps), tuple(tp.prev),
            tuple(tp.deps), tuple(tp.ops), tuple(sorted(tp.send_of.items())),
            tuple(map(tuple, tp.order)), tuple(tp.share_offs))


def stacked(tps: list[Template]) -> Template:
    """Several runs of one template structure (a sweep's sizes) as one Template of
    disjoint *copies*: copy b's ranks are b·g … b·g + g − 1, its slices those of
    ``tps[b]`` (padded with empty slices to the widest), and :mod:`.batched` gives each
    copy its own network. No arithmetic mixes two copies, so each copy's times are those
    of its own run, bit for bit; a level costs its Python once for all of them."""
    first = tps[0]
    key = structure(first)
    if any(structure(tp) != key for tp in tps[1:]):
        raise ValueError("stacked: the templates differ in structure")
    out = copy.copy(first)
    out.gc, out.copies, out.g = first.g, len(tps), first.g * len(tps)
    out.__dict__.pop("_pool", None)
    out.nsl, out.sl = [], []
    done: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}   # steps interned alike share
    for s in range(len(first.steps)):
        k = tuple(id(tp.sl[s]) for tp in tps) + tuple(id(tp.nsl[s]) for tp in tps)
        got = done.get(k)
        if got is None:
            w = max(tp.sl[s].shape[1] for tp in tps)
            got = done[k] = (np.concatenate([tp.nsl[s] for tp in tps]), np.concatenate(
                [np.pad(tp.sl[s], ((0, 0), (0, w - tp.sl[s].shape[1]))) for tp in tps]))
        out.nsl.append(got[0])
        out.sl.append(got[1])
    return out


# per (template, Program of rank 0, in place): what does not depend on the count — every
# step's memory dependencies and reduction passes (the executor's compiler, at the first
# count seen) and the dependency levels; objects held, so their ids stay theirs
_FIXED = Recent("template structure", 8)


def _fixed(t: Program, p0: Program, count: int, itemsize: int, slice_bytes: int,
           in_place: bool) -> list:
    def make() -> list:
        ib, ob = t.collective.blocks(t.nranks)
        flat = [cs for ch in compile_program(p0, [count] * ib, [count] * ob, count, itemsize,
                                             slice_bytes, in_place) for cs in ch]
        return [t, p0, in_place, [cs.deps for cs in flat], [passes(cs) for cs in flat], None]

    return _FIXED.lookup((id(t), id(p0), in_place), make, t, p0)


def declared_offsets(t: Program) -> list[tuple[int, int]]:
    """(channel, peer offset) of every connection the template sends on."""
    n = t.nranks
    return sorted({(c, offset_of(q, n)) for c, ch in enumerate(t.channels) for s in ch
                   for q in s.send_to})


def _families_of(ch: tuple) -> set[tuple | None]:
    """What chunks a channel's references name on the ranks, as hashable keys: (buf, m,
    M, b) for a chunk expression, (buf, None, index, count) for a fixed reference; None
    among them when a symbolic reference spans several chunks (unbounded)."""
    fams: set[tuple | None] = set()
    add = fams.add
    for s in ch:
        for ref in (s.src, s.dst):
            if ref is None:
                continue
            x = ref.index
            if type(x) is not Sym:
                add((ref.buf, None, x, ref.count))
            elif ref.count != 1:
                return {None}
            else:
                add((ref.buf, x.m, x.mod, x.b))
    return fams


def _chunks_of(fam: tuple, n: int) -> np.ndarray:
    """Every chunk index a family names on some rank (a superset; repeats possible)."""
    _, m, mod, b = fam
    if m is None:
        return np.arange(mod, mod + b, dtype=np.int64)
    return np.arange(mod or n, dtype=np.int64) * m + b


def moving(t: Program, p0: Program, count: int, in_place: bool) -> tuple[Program, Program]:
    """``t`` and ``p0`` with the channels that move no data on any rank emptied, when
    they share no storage with the channels kept (:func:`ringtree.sim.compile.compiled.moving`
    for a template: the same exact argument, over the chunks every rank names, each
    channel's as one boolean array per storage)."""
    if in_place and t.collective not in ALIASED:
        return t, p0
    n = t.nranks
    regs = {b: np.asarray(v, np.int64) for b, v in regions(t, count).items()}
    names: list[dict] = []                       # per channel: storage -> chunks named
    for ch in t.channels:
        fams = _families_of(ch)
        if None in fams:
            return t, p0
        got: dict = {}
        for fam in fams:
            idx = _chunks_of(fam, n)
            sp = _space(fam[0], t.collective, in_place)
            if idx.size and (idx.min() < 0 or idx.max() >= min(len(regs[fam[0]]),
                                                               len(regs[sp]))):
                return t, p0
            if sp not in got:
                got[sp] = np.zeros(len(regs[sp]), bool)
            got[sp][idx] = True
        names.append(got)
    keep = [any(bool((m & (regs[sp] != 0)).any()) for sp, m in got.items()) for got in names]
    if all(keep) or not any(keep):
        return t, p0
    for sp, rg in regs.items():                  # a zero chunk kept, named by a dropped one
        kept_zero = np.zeros(len(rg), bool)
        dropped = np.zeros(len(rg), bool)
        for got, k in zip(names, keep):
            if sp in got:
                if k:
                    kept_zero |= got[sp] & (rg == 0)
                else:
                    dropped |= got[sp]
        if (kept_zero & dropped).any():
            return t, p0
    return _emptied(t, keep), _emptied(p0, keep)


def _emptied(p: Program, keep: list[bool]) -> Program:
    chans = tuple(ch if k else () for ch, k in zip(p.channels, keep))
    return Program(p.collective, p.algo, p.nranks, p.rank, p.chunks, chans, p.root,
                   p.scratch, p.in_place_ok, p.meta)


def _length(ref, regs: dict, ranks: np.ndarray) -> np.ndarray:
    rg = regs[ref.buf]
    if isinstance(ref.index, Sym):
        x = ref.index
        idx = x.m * ((ranks + x.a) % x.mod) + x.b if x.mod else x.m * ranks + x.b
        return rg[idx]
    return np.full(ranks.size, int(rg[ref.index:ref.index + ref.count].sum()), np.int64)
