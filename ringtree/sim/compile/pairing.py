"""Messages paired as arrays: :func:`.compiled.pair` for a sweep's patterns of empty steps.

:func:`.compiled.pair` numbers the messages of a run: every connection (sender, receiver,
channel), in :func:`issue_order` (by sender, then by the program order of the sender's
first send on it), pairs its i-th send (steps in program order, then position in
``send_to``) with its i-th receive. It builds a dict of lists per connection in Python,
and a sweep pays it again for every new pattern of empty steps (about 0.1 s a pattern
for 64 ranks of ``direct2``; nine patterns at 8 B–2 KiB). Here the layout's send and
receive ends are laid out once as arrays (step, then position: program order), every
end is given its connection's rank once (:func:`connection_ranks`), and a pattern is
one selection and one sort per side: by (sender, connection rank), ties in program
order, the k-th send is then the k-th message, and it pairs with the k-th receive
exactly when both sides list the same connections (the connections' counts agree, which
:func:`.compiled.pair` checks one by one). Every field is built from the same integers
in the same order, so the Compiled is the one :func:`.compiled.pair` fills
(``tests/test_sim_structure.py`` compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain

import numpy as np

__all__ = ["Ends", "connection_ranks", "issue_order", "pair"]


def issue_order(conns: Iterable[tuple[int, int, int]], first: Callable[[tuple], object]
                ) -> list[tuple[int, int, int]]:
    """Connections (sender, receiver, channel) in message-numbering order: by sender,
    then by ``first(conn)``, the program order of the sender's first send on it (its
    Program's (step, position), empty steps included; None: never sent, last).

    Engines serve a link's simultaneous arrivals by message id, so this is the tie
    rule: *a link serves simultaneous arrivals in the order their senders issued them*
    (one sender's connections in the order it first sends on them, each connection's
    messages in its order, senders by rank). A renaming of ranks that maps Programs onto
    Programs (the shift and XOR folds of :mod:`ringtree.sim.fold`) keeps this order,
    where numbering by receiver did not (a XOR of blocks reorders a rank's receivers)."""
    keyed = [(c[0], f is None, f if f is not None else c, c)
             for c in conns for f in (first(c),)]
    keyed.sort()
    return [k[3] for k in keyed]


class Ends:
    """Every send and receive end of a layout's steps: (step, key) in program order,
    the key being the connection (sender, receiver, channel) the end belongs to; a
    folded run's receive from q is keyed by q's representative
    (:func:`.compiled.folded_sender`)."""

    def __init__(self, step_rank: list[int], step_chan: list[int],
                 send_to: list[tuple[int, ...]], recv_from: list[tuple[int, ...]],
                 fold: int, n: int, xor: bool) -> None:
        rank = np.asarray(step_rank, np.int64)
        chan = np.asarray(step_chan, np.int64)
        self.nsteps = len(step_rank)
        self.send, self.send_off = self._side(rank, chan, send_to)
        (gid, r, q, c), self.recv_off = self._side(rank, chan, recv_from)
        if fold:                        # folded_sender(q, r), element by element
            b = q // fold
            a = q % fold
            if xor:
                d = ((r // fold) ^ b) * fold + r % fold
            else:
                d = (r + ((-b) % (n // fold)) * fold) % n
            self.recv = (gid, a, d, c)
        else:
            self.recv = (gid, q, r, c)  # (sender, receiver, channel)
        self.send_rank, self.recv_rank = connection_ranks(
            self.send[1:], np.arange(self.send[0].size, dtype=np.int64), self.send[1:],
            self.recv[1:])

    @staticmethod
    def _side(rank, chan, peers):
        lens = np.fromiter(map(len, peers), np.int64, len(peers))
        q = np.fromiter(chain.from_iterable(peers), np.int64, int(lens.sum()))
        gid = np.repeat(np.arange(len(peers), dtype=np.int64), lens)
        off = np.zeros(len(peers) + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        return (gid, rank[gid], q, chan[gid]), off

    def __repr__(self) -> str:
        return f"Ends({self.nsteps} steps)"


def connection_ranks(decl: tuple, order: np.ndarray, *sides: tuple) -> list[np.ndarray]:
    """Every end's connection rank, for each of ``sides`` ((sender, receiver, channel)
    arrays): the program order (``order``) of the connection's first send among the
    declared send ends ``decl`` (empty steps included; :func:`issue_order`), or past
    every one for a connection never sent on (ordered by (sender, receiver, channel)).
    Sorting ends by (sender, rank) groups them by connection in issue order."""
    every = (decl, *sides)
    top = max([int(x.max()) for s in every for x in s[:2] if x.size] + [0]) + 1
    nc = max([int(s[2].max()) for s in every if s[2].size] + [0]) + 1
    dkey = (decl[0] * top + decl[1]) * nc + decl[2]
    o = np.lexsort((order, dkey))
    ks = dkey[o]
    head = np.ones(ks.size, bool)
    head[1:] = ks[1:] != ks[:-1]
    keys, first = ks[head], order[o][head]
    past = int(order.max()) + 1 if order.size else 0
    out = []
    for a, b, c in sides:
        key = (a * top + b) * nc + c
        at = np.minimum(np.searchsorted(keys, key), max(keys.size - 1, 0))
        found = keys[at] == key if keys.size else np.zeros(key.size, bool)
        out.append(np.where(found, first[at] if keys.size else 0, past + key))
    return out


def _order(side, rank: np.ndarray, mask: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ends of the steps in ``mask``, sorted by sender, then connection rank
    (:func:`connection_ranks`), ties in program order."""
    gid, a, b, c = side
    e = np.flatnonzero(mask[gid])
    o = e[np.lexsort((e, rank[e], a[e]))]
    return o, a[o], b[o], c[o]


def pair(cp, ends: Ends, mask: np.ndarray) -> bool:
    """Fill ``cp``'s connections, messages and every step's message ids as
    :func:`.compiled.pair` does for the steps in ``mask``; False (``cp`` untouched) when
    some connection has more sends than receives or fewer."""
    so, sa, sb, sc = _order(ends.send, ends.send_rank, mask)
    ro, ra, rb, rc = _order(ends.recv, ends.recv_rank, mask)
    if so.size != ro.size or not (np.array_equal(sa, ra) and np.array_equal(sb, rb)
                                  and np.array_equal(sc, rc)):
        return False
    nm = so.size
    new = np.ones(nm, bool)
    if nm:
        new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1]) | (sc[1:] != sc[:-1])
    heads = np.flatnonzero(new)
    ca, cb, cc = sa[heads].tolist(), sb[heads].tolist(), sc[heads].tolist()
    cp.conns = list(zip(ca, cb, cc))
    cp.conn_ranks = list(zip(ca, cb))
    cp.msg_src, cp.msg_dst, cp.msg_chan = sa.tolist(), sb.tolist(), sc.tolist()
    cp.msg_conn = (np.cumsum(new) - 1).tolist()
    cp.msg_sstep = ends.send[0][so].tolist()
    cp.msg_rstep = ends.recv[0][ro].tolist()
    cp.step_send = _ids(ends.send_off, so, nm)
    cp.step_recv = _ids(ends.recv_off, ro, nm)
    return True


def _ids(off: np.ndarray, order: np.ndarray, nm: int) -> list[tuple[int, ...]]:
    """Every step's message ids in position order (the empty tuple for none)."""
    m_of = np.full(int(off[-1]), -1, np.int64)
    m_of[order] = np.arange(nm, dtype=np.int64)
    ml = m_of.tolist()
    empty: tuple[int, ...] = ()
    bounds = off.tolist()
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out.append(tuple(ml[a:b]) if a != b and ml[a] >= 0 else empty)
    return out
