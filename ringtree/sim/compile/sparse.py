"""Small messages on many ranks: a template's steps that move data, and nothing else.

A ring all-reduce of 8 B on n ranks has 2(n − 1) steps per rank and channel, of which
two move an element: the Programs hold 4n² steps and the batched engine
(:mod:`..engines.batched`) evaluates every one of them, level by level, for every rank
(O(n²): 16,384 ranks did not finish in 200 s). Yet a step of zero bytes sends and
receives nothing and is done when it starts (:mod:`..engines.reference`, rule 3), so
what such a step contributes is only a maximum:

- ``start(e) = max(start(previous step of its channel), done(d) for d in deps(e))`` and
  ``done(e) = start(e)`` for an empty step e;
- when every memory dependency of the template stays within its channel (checked; else
  this path declines), a dependency d of an empty step is earlier in the same channel,
  so an empty d has ``done(d) = start(d) ≤ start(previous step)``: only the *moving*
  dependencies count, and an empty step's start is the running maximum of the last
  moving step's start and the ``done`` of the moving steps it depends on.

So a moving step s of rank r waits for the previous *moving* step of its channel (issue
order) and for every moving step that s or any empty step between the two depends on;
empty steps after the last moving one end no later than the rank's moving steps. The
Programs with the empty steps contracted that way (:func:`compile_sparse`) give every
moving step's start and end, every rank's finish and the run's time, messages, bytes
and chunks of the full Programs bit for bit: the engines see the same messages with the
same ids (empty steps carry none), the same slices and the same maxima
(``tests/test_sim_sparse.py`` compares them with the reference engine on the full
Programs). Which ranks a template step moves data on is read off its chunk expression
``m·((r + a) mod M) + b`` by inverting it at the chunks that hold data, never by
evaluating all n ranks, so the cost is that of the moving steps.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from ringtree.ir.program import Program, Ref
from ringtree.sim.compile.compiled import Compiled, pair
from ringtree.sim.compile.symbolic import Sym, offset_of
from ringtree.sim.compile.template import _fixed, declared_offsets
from ringtree.sim.fold.moved import regions

__all__ = ["moving_ranks", "compile_sparse", "MAX_STEPS"]

# at most this many moving (step, rank) pairs (about 1 KiB of lists each once compiled)
MAX_STEPS = 1 << 22


def moving_ranks(ref, regs: dict, n: int, nonzero: dict | None = None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The ranks on which a template step whose data is ``ref`` moves data, ascending,
    and its element length there (what :func:`.template._length` gives for every rank,
    read at the chunks that hold data only); None when the expression reaches outside
    its buffer. ``nonzero``: the chunks of every buffer that hold data, kept between
    calls."""
    rg = regs[ref.buf]
    x = ref.index
    if not isinstance(x, Sym):
        ln = int(rg[x:x + ref.count].sum())
        r = np.arange(n) if ln else np.zeros(0, np.int64)
        return r, np.full(r.size, ln, np.int64)
    mod = x.mod
    lo, hi = (x.b, x.m * ((mod or n) - 1) + x.b)
    if min(lo, hi) < 0 or max(lo, hi) >= len(rg):
        return None
    nz = (nonzero if nonzero is not None else {}).get(ref.buf)
    if nz is None:
        nz = np.nonzero(rg)[0]
        if nonzero is not None:
            nonzero[ref.buf] = nz
    k, rem = np.divmod(nz - x.b, x.m) if x.m else (np.zeros(0, np.int64),) * 2
    k = k[(rem == 0) & (k >= 0) & (k < (mod or n))]
    if mod:                                      # (r + a) mod M = k: r ≡ k − a (mod M)
        base = (k - x.a) % mod
        r = (base[:, None] + mod * np.arange(-(-n // mod))[None, :]).ravel()
    else:
        r = k
    r = np.unique(r[(r >= 0) & (r < n)])
    idx = x.m * ((r + x.a) % mod) + x.b if mod else x.m * r + x.b
    return r, rg[idx]


def _moving_steps(steps: list, regs: dict, n: int, limit: int) -> tuple | None:
    """:func:`moving_ranks` of every template step: ranks, step ids and lengths, as lists
    of arrays (None: an expression outside its buffer, or more than ``limit``). Steps
    whose chunk expressions differ only in the shift a (a ring's: ``(r − j) mod n``) are
    inverted once: the ranks of shift a are those of shift 0 moved by −a (mod n), the
    lengths the same."""
    ranks: list = []
    gids: list = []
    lens: list = []
    total = 0
    nonzero: dict = {}
    shifted: dict[tuple, list[tuple[int, int]]] = {}
    for gid, (_, s) in enumerate(steps):
        ref = s.dst if s.dst is not None else s.src
        if ref is None:
            return None
        x = ref.index
        if isinstance(x, Sym) and x.mod and n % x.mod == 0:
            shifted.setdefault((ref.buf, x.m, x.mod, x.b), []).append((gid, x.a))
            continue
        got = moving_ranks(ref, regs, n, nonzero)
        if got is None:
            return None
        total += got[0].size
        ranks.append(got[0])
        gids.append(np.full(got[0].size, gid, np.int64))
        lens.append(got[1])
    for (buf, m, mod, b), members in shifted.items():
        got = moving_ranks(Ref(buf, Sym(m, 0, mod, b)), regs, n, nonzero)
        if got is None:
            return None
        r0, ln0 = got
        total += r0.size * len(members)
        if total > limit:
            return None
        g, a = (np.array(v, np.int64) for v in zip(*members))
        ranks.append(((r0[None, :] - a[:, None]) % n).ravel())
        gids.append(np.repeat(g, r0.size))
        lens.append(np.tile(ln0, len(members)))
    return None if total > limit else (ranks, gids, lens)


def _slices(length: int, elems: int, itemsize: int, cache: dict) -> tuple[int, ...]:
    """The executor's ``split_even`` of ``length`` elements in bytes (as
    :meth:`.template.Template._slices`)."""
    got = cache.get(length)
    if got is None:
        nsl = -(-length // elems)
        base, extra = divmod(length, nsl)
        got = cache[length] = tuple((base + (i < extra)) * itemsize for i in range(nsl))
    return got


def compile_sparse(t: Program, p0: Program, count: int, itemsize: int, slice_bytes: int,
                   in_place: bool, *, unpruned: Program | None = None,
                   limit: int = MAX_STEPS, shares: bool = False) -> Compiled | None:
    """The moving steps of every rank of template ``t`` (``p0``: its rank 0, generated)
    as a :class:`Compiled` run, empty steps contracted (module docstring); None when
    this path does not apply: a memory dependency across channels, a chunk expression
    outside its buffer, more than ``limit`` moving steps, or messages that do not pair.
    ``shares``: record every connection declared (of ``unpruned``, the template before
    channels were emptied), for the unaware model's link shares."""
    n = t.nranks
    regs = {b: np.asarray(v, np.int64) for b, v in regions(t, count).items()}
    fixed = _fixed(t, p0, count, itemsize, slice_bytes, in_place)
    deps, ops = fixed[3], fixed[4]
    steps = [(c, s) for c, ch in enumerate(t.channels) for s in ch]
    names = [s.name for ch in p0.channels for s in ch]
    if any(steps[d][0] != steps[g][0] for g, ds in enumerate(deps) for d in ds):
        return None
    got = _moving_steps(steps, regs, n, limit)
    if got is None:
        return None
    ranks, gids, lens = got
    rk, gd, ln = (np.concatenate(a) if a else np.zeros(0, np.int64)
                  for a in (ranks, gids, lens))
    order = np.lexsort((gd, rk))                 # rank-major, then the template's order
    rk, gd, ln = rk[order].tolist(), gd[order].tolist(), ln[order].tolist()
    cp = Compiled(n, world=n)
    try:
        _fill(cp, t, steps, names, deps, ops, rk, gd, ln,
              max(1, slice_bytes // max(1, itemsize)), itemsize)
    except ValueError:                           # sends and receives do not pair
        return None
    if shares:
        tu = unpruned or t
        cp.declared = {(r, (r + a) % n, c) for c, a in declared_offsets(tu) for r in range(n)}
    return cp


def _fill(cp: Compiled, t: Program, steps: list, names: list, deps: list, ops: list,
          rk: list, gd: list, ln: list, elems: int, itemsize: int) -> None:
    """Append the moving steps (rank-major, template order) and pair their messages."""
    n = t.nranks
    dependents: list[list[int]] = [[] for _ in steps]
    for g, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(g)
    cut: dict = {}
    sends: dict = {}
    recvs: dict = {}
    send_ids: list = []
    recv_ids: list = []
    i, total = 0, len(rk)
    while i < total:
        r, j = rk[i], i
        while j < total and rk[j] == r:
            j += 1
        _rank(cp, r, n, steps, names, deps, dependents, ops, gd[i:j], ln[i:j], elems,
              itemsize, cut, sends, recvs, send_ids, recv_ids)
        i = j
    first: dict[tuple[int, int], tuple[int, int]] = {}  # (channel, offset): first send
    for g, (c, s) in enumerate(steps):
        for pos, q in enumerate(s.send_to):
            first.setdefault((c, offset_of(q, n)), (g, pos))
    pair(cp, sends, recvs, send_ids, recv_ids, cp.step_slices,
         lambda k: first.get((k[2], (k[1] - k[0]) % n)))


def _rank(cp: Compiled, r: int, n: int, steps, names, deps, dependents, ops, gd, ln,
          elems, itemsize, cut, sends, recvs, send_ids, recv_ids) -> None:
    """One rank's moving steps: issue order to the previous moving step of the channel,
    memory dependencies contracted onto the moving steps that wait (module docstring)."""
    base = cp.nsteps
    where = {g: base + k for k, g in enumerate(gd)}
    by_chan: dict[int, list[int]] = {}
    for g in gd:
        by_chan.setdefault(steps[g][0], []).append(g)
    extra: dict[int, set[int]] = {}
    for g in gd:                                 # g's dependents: the next moving step
        chan = by_chan[steps[g][0]]
        for e in dependents[g]:
            k = bisect_left(chan, e)
            if k < len(chan):
                extra.setdefault(chan[k], set()).add(where[g])
    prev: dict[int, int] = {}
    for g, length in zip(gd, ln):
        c, s = steps[g]
        gid = where[g]
        cp.step_rank.append(r)
        cp.step_chan.append(c)
        cp.step_prev.append(prev.get(c, -1))
        prev[c] = gid
        cp.step_deps.append(tuple(sorted(extra.get(g, ()))))
        cp.step_slices.append(_slices(length, elems, itemsize, cut))
        cp.step_ops.append(ops[g])
        cp.step_name.append(names[g])
        for pos, q in enumerate(s.send_to):
            sends.setdefault((r, (r + offset_of(q, n)) % n, c), []).append((gid, pos))
        for pos, q in enumerate(s.recv_from):
            recvs.setdefault(((r + offset_of(q, n)) % n, r, c), []).append((gid, pos))
        send_ids.append([0] * len(s.send_to))
        recv_ids.append([0] * len(s.recv_from))
