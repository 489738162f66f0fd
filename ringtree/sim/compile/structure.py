"""What a sweep compiles once: the part of :func:`.compiled.compile_programs` that does not
depend on the byte count.

A sweep (``ringtree sim -b 8 -e 1G``) simulates one set of Programs at many sizes. Their
steps, memory dependencies (:meth:`ringtree.ir.program.Program.memory_deps`), copy
elision, names, connections and message pairing are the same at every size; only the
element length of each step — hence its slices — changes, and with it which channels
move data (:func:`.compiled.moving`) and which steps are empty (an empty step sends and
receives nothing, so the pairing of messages depends on it too).

:class:`Structure` keeps, per pruning pattern (the channels each rank leaves out), the
concatenated steps with the chunk range that sets each step's length, and per pattern of
empty steps the paired messages. A size then costs one vectorised difference of chunk
prefix sums, one slice table and the pruning check; everything keyed by a pattern is
built the first time the pattern occurs, with the executor's own compiler
(:func:`ringtree.runtime.plan.compile_program`). The result is the uncached
:func:`.compiled.compile_programs`'s, field by field (``tests/test_sim_structure.py``);
whatever the cached path cannot reproduce (a schedule whose messages do not pair) is
compiled by the uncached path, which raises its own error.

Compiled runs built from one pairing share its ``memo`` (:func:`.compiled.connection_routes`
keeps the routes there), so the engines' per-connection set-up is paid once per topology.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ringtree.ir.program import Program, split_even
from ringtree.runtime.plan import compile_program
from ringtree.sim.compile import pairing
from ringtree.sim.compile.compiled import (
    Compiled,
    Lengths,
    compile_programs,
    moving,
    passes,
    rebased,
    shape,
)

__all__ = ["Structure", "Sweep"]

# a step's kind, one tuple per kind (what its name stands for)
_KINDS: dict[tuple, tuple] = {}

# a sweep keeps the structure of runs of at most this many steps (what it holds is about
# the size of one compiled run; bigger runs compile per size, as without a sweep)
STRUCTURE_STEPS = 1_000_000
# runs of at most this many steps lay out every channel once (:class:`Structure`)
FULL_STEPS = 1 << 18


@dataclass
class _Layout:
    """The steps of every rank for one pruning pattern, numbered as the compiler does."""

    step_rank: list[int] = field(default_factory=list)
    step_chan: list[int] = field(default_factory=list)
    step_prev: list[int] = field(default_factory=list)
    step_deps: list[tuple[int, ...]] = field(default_factory=list)
    step_ops: list[int] = field(default_factory=list)
    step_name: list[str] = field(default_factory=list)
    send_to: list[tuple[int, ...]] = field(default_factory=list)
    recv_from: list[tuple[int, ...]] = field(default_factory=list)
    step_own: list[str] = field(default_factory=list)    # the step's own name
    step_kind: list[tuple] = field(default_factory=list)  # what its name stands for
    # (step, lo, hi) of every src and dst reference: what :meth:`Structure._drops` reads
    refs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    lo: list[int] = field(default_factory=list)     # prefix-sum index of the first chunk
    hi: list[int] = field(default_factory=list)     # ... and of the one after the last
    pairings: dict[bytes, _Pairing] = field(default_factory=dict)
    arrays: tuple[np.ndarray, np.ndarray] | None = None
    ends: pairing.Ends | None = None    # every send and receive end (:mod:`.pairing`)


@dataclass
class _Pairing:
    """Messages of one pattern of empty steps (the i-th send of a connection with its
    i-th receive), and what the engines derive from them (``memo``)."""

    cp: Compiled                         # every field but the slices; its memo is shared
    sstep: np.ndarray
    rstep: np.ndarray


class Structure:
    """The count-independent compilation of ``programs`` (real ranks, then virtual
    ranks), for :meth:`compile` at any count. Arguments as for
    :func:`.compiled.compile_programs`."""

    def __init__(self, programs: Sequence[Program], in_place: bool = False, fold: int = 0,
                 prune: bool = True, shares: bool = True, xor: bool = False,
                 full_steps: int = FULL_STEPS) -> None:
        self.programs = list(programs)
        self.in_place, self.fold, self.prune, self.shares = in_place, fold, prune, shares
        self.xor = xor
        self.n = self.programs[0].nranks
        # up to this many steps, every channel is laid out first and each pruning pattern
        # read off that layout (:func:`restrict`); beyond, only the channels a size
        # keeps are compiled (a 131,072-rank tree at 8 B keeps 2 of its 16)
        self.full_first = sum(p.steps for p in self.programs) <= full_steps
        for rank, p in enumerate(self.programs):
            if p.rank != rank:
                raise ValueError(f"program {rank} is for rank {p.rank}")
        self.declared = {(rank, q, c) for rank, p in enumerate(self.programs)
                         for c, ch in enumerate(p.channels) for s in ch for q in s.send_to
                         } if shares else set()
        self.layouts: dict[tuple, _Layout] = {}
        self.slice_tables: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
        keys: list[tuple] = []
        for p in self.programs:
            k = (p.collective, p.chunks, p.scratch)
            if k not in keys:
                keys.append(k)
        self.layout_keys = keys                 # prefix sums are laid out in this order

    def compile(self, count: int, itemsize: int, slice_bytes: int) -> Compiled:
        """``compile_programs(programs, count, itemsize, slice_bytes, ...)``."""
        lengths = Lengths(self.n, count)
        pre, base = self._prefix(lengths)
        full = ((),) * len(self.programs)
        if self.prune and full not in self.layouts and self.full_first and not self.in_place:
            self.layouts[full] = self._layout(self.programs, base, count, itemsize,
                                              slice_bytes)
        emptied: list[Program] | None = None
        if not self.prune:
            drops = list(full)
        elif full in self.layouts and not self.in_place:
            drops = self._drops(self.layouts[full], pre)
        else:
            got = [moving(p, lengths.of(p), self.in_place) for p in self.programs]
            emptied, drops = [q for q, _ in got], [tuple(d) for _, d in got]
        key = tuple(drops)
        lay = self.layouts.get(key)
        if lay is None:
            if key != full and (self.full_first or full in self.layouts):
                # the channels kept, read off every channel's
                if full not in self.layouts:
                    self.layouts[full] = self._layout(self.programs, base, count,
                                                      itemsize, slice_bytes)
                lay = restrict(self.layouts[full], drops)
            if lay is None:
                progs = emptied or [moving(p, lengths.of(p), self.in_place)[0] if d else p
                                    for p, d in zip(self.programs, drops)]
                lay = self._layout(progs, base, count, itemsize, slice_bytes)
            self.layouts[key] = lay
        assert lay.arrays is not None
        ln = pre[lay.arrays[1]] - pre[lay.arrays[0]]
        mask = ln > 0
        pr = lay.pairings.get(mask.tobytes())
        if pr is None:
            pr = self._pairing(lay, mask)
            if pr is None:                      # the uncached compiler names the error
                return compile_programs(self.programs, count, itemsize, slice_bytes,
                                        self.in_place, self.fold, self.prune, self.shares,
                                        self.xor)
            lay.pairings[mask.tobytes()] = pr
        if not np.array_equal(ln[pr.sstep], ln[pr.rstep]):
            return compile_programs(self.programs, count, itemsize, slice_bytes,
                                    self.in_place, self.fold, self.prune, self.shares,
                                        self.xor)
        return replace(pr.cp, step_slices=self._slices(ln, itemsize, slice_bytes))

    def _prefix(self, lengths: Lengths) -> tuple[np.ndarray, dict]:
        """Every layout's chunk prefix sums in one array, and where each buffer starts."""
        parts, base, at = [np.zeros(1, np.int64)], {}, 1
        for coll, chunks, scratch in self.layout_keys:
            p = next(q for q in self.programs
                     if (q.collective, q.chunks, q.scratch) == (coll, chunks, scratch))
            for b, a in lengths.of(p).items():
                base[(coll, chunks, scratch, b)] = at
                parts.append(np.asarray(a, np.int64))
                at += len(a)
        return np.concatenate(parts), base

    def _drops(self, full: _Layout, pre: np.ndarray) -> list[tuple[int, ...]]:
        """The channels :func:`.compiled.moving` empties in every Program (not in place:
        a storage slot is its chunk), from the full layout's references at once: a
        channel moves data when one of its references names a chunk with data; the
        channels that do not are emptied unless every channel is, or the channels kept
        name a chunk of no data that they name too."""
        assert full.refs is not None
        step, lo, hi = full.refs
        rank = np.asarray(full.step_rank, np.int64)[step]
        width = max(len(p.channels) for p in self.programs)
        group = rank * width + np.asarray(full.step_chan, np.int64)[step]
        moves = np.zeros(len(self.programs) * width, bool)
        moves[group[pre[hi] != pre[lo]]] = True
        moves = moves.reshape(len(self.programs), width)
        out: list[tuple[int, ...]] = []
        need = []
        for r, p in enumerate(self.programs):
            keep = moves[r, :len(p.channels)]
            if keep.all() or not keep.any():
                out.append(())
                continue
            out.append(tuple(np.flatnonzero(~keep).tolist()))
            need.append(r)
        if not need:
            return out
        # per rank that would empty some: the chunks its kept / emptied channels name
        row = np.full(len(self.programs), -1, np.int64)
        row[need] = np.arange(len(need))
        mine = row[rank] >= 0
        r_, lo_, hi_, g_ = row[rank[mine]], lo[mine], hi[mine], group[mine]
        kept = moves.reshape(-1)[g_]
        zero = np.append(pre[1:] == pre[:-1], False)
        named = []
        for sel in (kept, ~kept):
            d = np.zeros((len(need), pre.size + 1), np.int64)
            np.add.at(d, (r_[sel], lo_[sel]), 1)
            np.add.at(d, (r_[sel], hi_[sel]), -1)
            named.append(np.cumsum(d[:, :-1], axis=1) > 0)
        clash = (named[0] & named[1] & zero).any(axis=1)
        for k in np.flatnonzero(clash).tolist():
            out[need[k]] = ()
        return out

    def _slices(self, ln: np.ndarray, itemsize: int, slice_bytes: int) -> list:
        """Bytes of every slice of every step (``compile_program``'s ``_split``)."""
        table = self.slice_tables.setdefault((itemsize, slice_bytes), {})
        se = max(1, slice_bytes // max(1, itemsize))
        lengths, which = np.unique(ln, return_inverse=True)
        rows = []
        for x in lengths.tolist():
            sl = table.get(x)
            if sl is None:
                parts = -(-x // se)
                sl = table[x] = tuple(split_even(x, parts, k)[1] * itemsize
                                      for k in range(parts))
            rows.append(sl)
        return [rows[k] for k in which.reshape(-1).tolist()]

    def _layout(self, progs: list[Program], base: dict, count: int, itemsize: int,
                slice_bytes: int) -> _Layout:
        """Every step of ``progs`` numbered as the compiler does. What the compiler gives a
        step other than its peers (dependencies, passes, name, chunk range) is a function
        of the Program's *shape*: its collective, chunks, scratch, channel lengths and each
        step's references (by identity: ``progs`` holds them alive), receive count, whether
        it sends and whether it reduces (and, in place, of the rank). A shape is compiled
        once (:meth:`_shape`, with the first rank's Program) and laid out for every rank
        of that shape with its own peers: a tree's 16,384 ranks have a handful."""
        lay = _Layout()
        shapes: dict[tuple, tuple] = {}       # ``progs`` keeps their references alive
        refs: list[tuple[int, int, int]] = []
        for rank, p in enumerate(progs):
            steps = [s for ch in p.channels for s in ch]
            sig = shape(p, rank if self.in_place else -1)
            got = shapes.get(sig)
            if got is None:
                got = shapes[sig] = self._shape(rank, p, base, count, itemsize, slice_bytes)
            chan, prev, deps, ops, own, kind, lo, hi, srefs = got
            first = len(lay.step_rank)
            lay.step_rank += [rank] * len(steps)
            lay.step_chan += chan
            links = rebased(first, prev, deps)
            lay.step_prev += links[0]
            lay.step_deps += links[1]
            lay.step_ops += ops
            lay.step_name += own
            lay.step_own += own
            lay.step_kind += kind
            lay.send_to += [s.send_to for s in steps]
            lay.recv_from += [s.recv_from for s in steps]
            lay.lo += lo
            lay.hi += hi
            refs += [(first + g, a, z) for g, a, z in srefs]
        lay.arrays = (np.asarray(lay.lo, np.intp), np.asarray(lay.hi, np.intp))
        lay.refs = tuple(np.asarray(x, np.intp) for x in zip(*refs)) if refs else \
            (np.zeros(0, np.intp),) * 3
        return lay

    def _shape(self, rank: int, p: Program, base: dict, count: int, itemsize: int,
               slice_bytes: int) -> tuple:
        """One Program compiled (:func:`~ringtree.runtime.plan.compile_program`), as the
        lists :meth:`_layout` lays out, numbered from 0: per step its channel, previous
        step, dependencies, passes, name, kind and chunk range, and its references."""
        ib, ob = p.collective.blocks(self.n)
        try:
            compiled = compile_program(p, [count] * ib, [count] * ob, count, itemsize,
                                       slice_bytes, self.in_place)
        except ValueError as e:
            raise ValueError(f"rank {rank}: {e}") from None
        lk = (p.collective, p.chunks, p.scratch)
        out: tuple[list, ...] = tuple([] for _ in range(8))
        chan, prev, deps, ops, own, kind, lo, hi = out
        refs: list[tuple[int, int, int]] = []
        for c, csteps in enumerate(compiled):
            last = -1
            for cs in csteps:
                s = cs.step
                chan.append(c)
                prev.append(last)
                deps.append(tuple(cs.deps))
                ops.append(passes(cs))
                nk = (s.src is not None, s.dst is not None, bool(s.recv_from),
                      bool(s.send_to), s.reduce)
                nk = _KINDS.get(nk) or _KINDS.setdefault(nk, nk)
                own.append(s.name)
                kind.append(nk)
                for x in (s.src, s.dst):
                    if x is not None:
                        at = base[(*lk, x.buf)] + x.index
                        refs.append((cs.gid, at, at + x.count))
                ref = s.dst if s.dst is not None else s.src
                at = 0 if ref is None else base[(*lk, ref.buf)] + ref.index
                lo.append(at)
                hi.append(at if ref is None else at + ref.count)
                last = cs.gid
        return (*out, refs)

    def _pairing(self, lay: _Layout, mask: np.ndarray) -> _Pairing | None:
        fold = self.fold
        if lay.ends is None:
            lay.ends = pairing.Ends(lay.step_rank, lay.step_chan, lay.send_to,
                                    lay.recv_from, fold, self.n, self.xor)
        cp = Compiled(len(self.programs) if fold else self.n, step_rank=lay.step_rank,
                      step_chan=lay.step_chan, step_prev=lay.step_prev,
                      step_deps=lay.step_deps, step_ops=lay.step_ops,
                      step_name=lay.step_name, fold=fold, world=self.n,
                      declared=self.declared, xor=self.xor)
        if not pairing.pair(cp, lay.ends, mask):
            return None
        return _Pairing(cp, np.asarray(cp.msg_sstep, np.intp),
                        np.asarray(cp.msg_rstep, np.intp))



def restrict(full: _Layout, drops: Sequence[tuple[int, ...]]) -> _Layout | None:
    """The layout of the Programs with channels ``drops[rank]`` emptied, read off the
    layout of all their channels: the steps kept, renumbered in order, with their names
    chosen again in the new order. Memory dependencies are per storage slot
    (:meth:`ringtree.ir.program.Program.memory_deps`): when no step kept depends on a step
    dropped, no dropped step touched a slot before a kept step touched it again, so the
    kept steps' histories, hence dependencies, are those of the emptied Programs. Else
    None (compile the emptied Programs)."""
    rank = np.asarray(full.step_rank, np.int64)
    chan = np.asarray(full.step_chan, np.int64)
    width = int(chan.max()) + 1 if chan.size else 1
    gone = np.zeros((len(drops), width), bool)
    for r, d in enumerate(drops):
        gone[r, list(d)] = True
    keep = ~gone[rank, chan]
    new = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep).tolist()
    deps = full.step_deps
    if any(not keep[d] for s in kept for d in deps[s]):
        return None
    renum = new.tolist()
    lay = _Layout()
    lay.step_rank = [full.step_rank[s] for s in kept]
    lay.step_chan = [full.step_chan[s] for s in kept]
    lay.step_prev = [renum[p] if p >= 0 else -1 for p in (full.step_prev[s] for s in kept)]
    lay.step_deps = [tuple(renum[d] for d in deps[s]) if deps[s] else () for s in kept]
    for name in ("step_ops", "send_to", "recv_from", "step_own", "step_kind", "lo", "hi"):
        src = getattr(full, name)
        setattr(lay, name, [src[s] for s in kept])
    names: dict[tuple, str] = {}
    lay.step_name = [names.get(k) or names.setdefault(k, own)
                     for k, own in zip(lay.step_kind, lay.step_own)]
    lay.arrays = (np.asarray(lay.lo, np.intp), np.asarray(lay.hi, np.intp))
    return lay


class Sweep:
    """Structures kept across the calls of one sweep: pass the same object to every
    :func:`ringtree.sim.simulate` of the sweep (``sweep=``); drop it after."""

    def __init__(self, max_steps: int = STRUCTURE_STEPS) -> None:
        self.max_steps = max_steps
        self.structures: dict[tuple, Structure] = {}

    def compile(self, key: tuple, programs: Sequence[Program], count: int, itemsize: int,
                slice_bytes: int, in_place: bool, fold: int, prune: bool,
                shares: bool, xor: bool = False) -> Compiled:
        """``compile_programs`` of ``programs`` (identified by ``key``: what generated
        them), from the structure kept for them when the run is small enough."""
        k = (key, in_place, fold, prune, shares, xor)
        st = self.structures.get(k)
        if st is None:
            if len(programs) * programs[0].steps > self.max_steps:
                return compile_programs(programs, count, itemsize, slice_bytes, in_place,
                                        fold, prune, shares, xor)
            st = self.structures[k] = Structure(programs, in_place, fold, prune, shares, xor)
        return st.compile(count, itemsize, slice_bytes)
