"""The double binary tree's Compiled built from its wiring: one Program per part, peers
as index arrays, no Program per rank.

:func:`.compiled.compile_programs` generates every rank's Program, lays its steps out in
Python lists and pairs the messages through a dict of lists per connection: on 131,072
ranks a tree all-reduce has 8.4 M steps and 4.2 M messages, and that Python is most of
the run. Yet every rank of the tree (:mod:`ringtree.schedules.tree`) plays one of a
handful of *parts*: per tree, whether it is the root and how many children it has. Two
ranks of one part have Programs that differ only in their peers (the generator shares
one ``Ref`` per chunk, so they even have one :func:`.compiled.shape`), and each peer is
one of the rank's own tree links: its parent or its first or second child in that
channel's tree. So:

- each part's Program is generated once (its first rank), pruned as
  :func:`.compiled.moving` prunes it and compiled by the executor's compiler, and every
  peer of its steps is written as a *slot* (tree t's parent, child 0 or child 1);
- the part's last rank is generated too and must have the same shape and the same
  slots (else None: the caller compiles every Program as before);
- the steps of all ranks are the parts' rows indexed by (part, step of the part), their
  links rebased by each rank's first step, and the send and receive ends are the slots
  read from the wiring's arrays, ``parent[t][ranks]``, one NumPy array per slot;
- the messages are numbered as :func:`.compiled.pair` numbers them: ends sorted by
  sender, then connection in the order of its first send (:func:`.pairing.issue_order`,
  empty steps included), ties in program order (step, then position),
  the k-th send paired with the k-th receive when both sides list the same connections
  and both ends cut the message into equal slices (else None, and the uncached compiler
  names the error).

Every field is the one :func:`.compiled.compile_programs` fills, from the same integers
and the same shared tuples (``tests/test_sim_tree_wired.py`` compares them field by field
and runs the reference engine on both). The result is a :class:`.wired.Wired`: its
fields are kept as the arrays they are built as and made into lists only when an engine
reads them; the compiled heap reads the arrays (:mod:`ringtree.sim.engines.heap_arrays`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ringtree.ir.program import Collective, Program
from ringtree.runtime.plan import compile_program
from ringtree.schedules import Options, generate
from ringtree.schedules.tree import double_tree
from ringtree.sim.compile.compiled import Compiled, Lengths, _Builder, moving, shape
from ringtree.sim.compile.pairing import connection_ranks
from ringtree.sim.compile.wired import Wired, tuples

__all__ = ["ALGOS", "FROM_STEPS", "compile_tree"]

ALGOS = ("tree", "tree_updown")
# from this many steps on (ranks × rank 0's steps) the caller takes this path: the tree
# on 16,384 ranks (1.0 M) and up; below, a sweep's structure keeps what its sizes share,
# which this path does not
FROM_STEPS = 1 << 19

_I = np.int64
# the list fields :class:`.wired.Wired` keeps as integer arrays of the same name
INTS = ("step_rank", "step_chan", "step_prev", "step_ops", "msg_src", "msg_dst", "msg_chan",
        "msg_conn", "msg_sstep", "msg_rstep")


class _Part:
    """One part's compiled rows, and the slots of its steps' peers."""

    def __init__(self, rows: tuple[list, ...], sends: list[tuple[int, int, int]],
                 recvs: list[tuple[int, int, int]]) -> None:
        self.rows = rows                      # chan, prev, deps, slices, ops, names
        self.sends, self.recvs = sends, recvs  # (step of the part, position, slot)


def _wiring(n: int, opts: Options) -> tuple[np.ndarray, np.ndarray]:
    """(peer of every slot for every rank, -1 for none; the part of every rank). With
    at most w children a rank, slots t(w + 1) + j: tree t's parent (j = 0) and child
    j − 1 (NCCL's ``split_tree`` gives a node's second rank its chain child and both
    inter-node children)."""
    trees = double_tree(n, opts)
    w = max(2, max(len(x.down) for tree in trees for x in tree))
    peers = np.full((2 * (w + 1), n), -1, _I)
    part = np.zeros(n, _I)
    for t, tree in enumerate(trees):
        peers[t * (w + 1)] = np.fromiter((x.up for x in tree), _I, n)
        nd = np.fromiter((len(x.down) for x in tree), _I, n)
        for j in range(w):
            peers[t * (w + 1) + 1 + j] = np.fromiter(
                (x.down[j] if len(x.down) > j else -1 for x in tree), _I, n)
        part = part * 2 * (w + 1) + (peers[t * (w + 1)] < 0) * (w + 1) + nd
    return peers, part


def _slots(p: Program, peers: np.ndarray, r: int) -> tuple[list, list] | None:
    """(step, position, slot) of every send and receive of ``p`` (rank ``r``); channel c
    runs on tree c // (channels / 2), its slots t·w … t·w + w − 1. None when a peer is no link of that tree."""
    half, w = len(p.channels) // 2, len(peers) // 2
    out: tuple[list, list] = ([], [])
    g = 0
    for c, steps in enumerate(p.channels):
        t = c // half if half else 0
        mine = peers[t * w:(t + 1) * w, r].tolist()
        for s in steps:
            for side, qs in zip(out, (s.send_to, s.recv_from)):
                for pos, q in enumerate(qs):
                    if q < 0 or mine.count(q) != 1:
                        return None
                    side.append((g, pos, t * w + mine.index(q)))
            g += 1
    return out


def _parts(coll: Collective, algo: str, n: int, opts: Options, part: np.ndarray,
           peers: np.ndarray, b: _Builder, count: int, itemsize: int, slice_bytes: int
           ) -> dict[int, _Part] | None:
    """Every part's rows and slots, checked on its first and last rank."""
    lengths = Lengths(n, count)
    ib, ob = coll.blocks(n)
    out: dict[int, _Part] = {}
    for k in np.unique(part).tolist():
        ranks = np.flatnonzero(part == k)
        got = []
        for r in {int(ranks[0]), int(ranks[-1])}:
            whole = generate(coll, algo, n, r, opts)
            p, _ = moving(whole, lengths.of(whole), False)
            got.append((p, shape(p, -1), _slots(p, peers, r)))
        if any(g[2] is None or g[1:] != got[0][1:] for g in got):
            return None
        p0 = got[0][0]
        rows = b.rows(compile_program(p0, [count] * ib, [count] * ob, count, itemsize,
                                      slice_bytes, False), itemsize)
        out[k] = _Part(rows, *got[0][2])
    return out


def compile_tree(coll: Collective, algo: str, n: int, opts: Options, count: int,
                 itemsize: int, slice_bytes: int) -> Wired | None:
    """``compile_programs(programs, count, itemsize, slice_bytes)`` of the tree
    all-reduce's Programs (out of place, unfolded, pruned, no shares recorded), built
    from the wiring; None where the parts' Programs do not read as slots or the messages
    do not pair (compile the Programs instead)."""
    if coll is not Collective.ALL_REDUCE or algo not in ALGOS:
        return None
    peers, part = _wiring(n, opts)
    cp = Compiled(n, world=n)
    b = _Builder(cp, 0, False)
    parts = _parts(coll, algo, n, opts, part, peers, b, count, itemsize, slice_bytes)
    if parts is None:
        return None
    keys = sorted(parts)
    where = np.zeros(max(keys) + 1, _I)
    where[keys] = np.arange(len(keys))
    pk = where[part]                                   # every rank's part, numbered
    size = np.asarray([len(parts[k].rows[0]) for k in keys], _I)
    base = np.zeros(len(keys) + 1, _I)
    np.cumsum(size, out=base[1:])
    nst = size[pk]
    off = np.zeros(n + 1, _I)
    np.cumsum(nst, out=off[1:])
    total = int(off[-1])
    srank = np.repeat(np.arange(n, dtype=_I), nst)
    first = off[:-1][srank]
    tidx = base[pk][srank] + np.arange(total, dtype=_I) - first
    table = [sum((parts[k].rows[i] for k in keys), []) for i in range(6)]
    chan, prev, deps, slices, ops, names = table
    pv = np.asarray(prev, _I)[tidx]
    full = np.asarray([bool(x) for x in slices])
    ends = [_ends(parts, keys, base, pk, off, peers, full, chan, side) for side in (0, 1)]
    ends.append(ends[0] if full.all() else      # every send, empty steps too
                _ends(parts, keys, base, pk, off, peers, np.ones_like(full), chan, 0))
    msgs = _pair(ends, slices, tidx, total)
    if msgs is None:
        return None
    arrays = dict(step_rank=srank, step_chan=np.asarray(chan, _I)[tidx],
                  step_prev=np.where(pv >= 0, pv + first, -1),
                  step_ops=np.asarray(ops, _I)[tidx], row=tidx, first=first,
                  table=(slices, deps, names), **msgs)
    return Wired(n, arrays, _lists(arrays))


def _lists(a: dict) -> dict:
    """How :class:`.wired.Wired` makes each list field from the arrays ``a``."""
    slices, deps, names = a["table"]
    ca, cd, cc = a["conn_ends"]

    def rows(table: list) -> Callable[[], list]:
        return lambda: list(map(table.__getitem__, a["row"].tolist()))

    make: dict[str, Callable[[], list]] = {k: a[k].tolist for k in INTS}
    make.update(step_slices=rows(slices), step_name=rows(names),
                step_deps=lambda: _deps(deps, a["row"].tolist(), a["first"]),
                step_send=lambda: tuples(*a["send"]), step_recv=lambda: tuples(*a["recv"]),
                conns=lambda: list(zip(ca.tolist(), cd.tolist(), cc.tolist())),
                conn_ranks=lambda: list(zip(ca.tolist(), cd.tolist())))
    return make


def _deps(deps: list[tuple], at: list[int], first: np.ndarray) -> list[tuple]:
    """Every step's memory dependencies, rebased by its rank's first step."""
    if not any(deps):
        return [()] * len(at)
    fl = first.tolist()
    return [tuple([f + d for d in deps[i]]) if deps[i] else () for i, f in zip(at, fl)]


def _ends(parts: dict[int, _Part], keys: list[int], base: np.ndarray, pk: np.ndarray,
          off: np.ndarray, peers: np.ndarray, full: np.ndarray, chan: list[int],
          side: int) -> tuple[np.ndarray, ...]:
    """(step, position, rank, peer, channel) of every send (``side`` 0) or receive end
    of the steps that move data."""
    cols: list[list[np.ndarray]] = [[], [], [], [], []]
    for i, k in enumerate(keys):
        ranks = np.flatnonzero(pk == i)
        for g, pos, slot in (parts[k].sends, parts[k].recvs)[side]:
            if not full[base[i] + g]:
                continue
            for col, x in zip(cols, (off[ranks] + g, np.full(ranks.size, pos, _I), ranks,
                                     peers[slot, ranks],
                                     np.full(ranks.size, chan[base[i] + g], _I))):
                col.append(x)
    return tuple(np.concatenate(c) if c else np.zeros(0, _I) for c in cols)


def _pair(ends: list[tuple[np.ndarray, ...]], slices: list[tuple], tidx: np.ndarray,
          total: int) -> dict | None:
    """The messages numbered as :func:`.compiled.pair` numbers them (the arrays of
    :class:`.wired.Wired`); None when a connection's sends and receives differ in number
    or a message's ends in slices."""
    gs, ps, ss, ds, cs = ends[0]
    gr, pr, rr, qr, cr = ends[1]
    gd, pd, sd, dd, cd = ends[2]                       # every send, empty steps too
    width = int(max(ps.max(initial=0), pr.max(initial=0), pd.max(initial=0))) + 1
    krs, krr = connection_ranks((sd, dd, cd), gd * width + pd, (ss, ds, cs), (qr, rr, cr))
    so = np.lexsort((gs * width + ps, krs, ss))       # sender, connection, program order
    ro = np.lexsort((gr * width + pr, krr, qr))
    a, d, c = ss[so], ds[so], cs[so]
    if so.size != ro.size or not (np.array_equal(a, qr[ro]) and np.array_equal(d, rr[ro])
                                  and np.array_equal(c, cr[ro])):
        return None
    ids: dict[tuple, int] = {}
    sid = np.asarray([ids.setdefault(x, len(ids)) for x in slices], _I)
    sstep, rstep = gs[so], gr[ro]
    if not np.array_equal(sid[tidx[sstep]], sid[tidx[rstep]]):
        return None
    nm = so.size
    new = np.ones(nm, bool)
    if nm:
        new[1:] = (a[1:] != a[:-1]) | (d[1:] != d[:-1]) | (c[1:] != c[:-1])
    heads = np.flatnonzero(new)
    return dict(msg_src=a, msg_dst=d, msg_chan=c, msg_conn=np.cumsum(new) - 1,
                msg_sstep=sstep, msg_rstep=rstep, conn_ends=(a[heads], d[heads], c[heads]),
                send=_ids(total, sstep, ps[so]), recv=_ids(total, rstep, pr[ro]))


def _ids(total: int, step: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every step's message ids in position order, packed (offsets, ids): message m is
    the end at (``step[m]``, ``pos[m]``)."""
    width = int(pos.max()) + 1 if pos.size else 0
    grid = np.full((total, max(width, 1)), -1, _I)
    grid[step, pos] = np.arange(step.size, dtype=_I)
    have = (grid >= 0).sum(axis=1)
    if not (grid[have > 0, 0] >= 0).all() or not (grid[np.arange(total), have - 1] >= 0)[
            have > 0].all():
        raise AssertionError("a step's message ids are not its first positions")
    off = np.zeros(total + 1, _I)
    np.cumsum(have, out=off[1:])
    return off, grid[grid >= 0]                 # row by row: each step's ids in order
