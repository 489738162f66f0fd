"""Messages paired as arrays: :func:`.compiled.pair` for a sweep's patterns of empty steps.

:func:`.compiled.pair` numbers the messages of a run: every connection (sender, receiver,
channel), in sorted order, pairs its i-th send (steps in program order, then position in
``send_to``) with its i-th receive. It builds a dict of lists per connection in Python,
and a sweep pays it again for every new pattern of empty steps (about 0.1 s a pattern
for 64 ranks of ``direct2``; nine patterns at 8 B–2 KiB). Here the layout's send and
receive ends are laid out once as arrays (step, then position: program order), and a
pattern is one selection and one stable sort by connection per side: sorted by
(sender, receiver, channel), ties in program order, the k-th send is then the k-th
message, and it pairs with the k-th receive exactly when both sides list the same
connections (the connections' counts agree, which :func:`.compiled.pair` checks one by
one). Every field is built from the same integers in the same order, so the Compiled is
the one :func:`.compiled.pair` fills (``tests/test_sim_structure.py`` compares them).
"""

from __future__ import annotations

from itertools import chain

import numpy as np

__all__ = ["Ends", "pair"]


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


def _order(side, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ends of the steps in ``mask``, sorted by connection, ties in program order."""
    gid, a, b, c = side
    e = np.flatnonzero(mask[gid])
    o = e[np.lexsort((e, c[e], b[e], a[e]))]
    return o, a[o], b[o], c[o]


def pair(cp, ends: Ends, mask: np.ndarray) -> bool:
    """Fill ``cp``'s connections, messages and every step's message ids as
    :func:`.compiled.pair` does for the steps in ``mask``; False (``cp`` untouched) when
    some connection has more sends than receives or fewer."""
    so, sa, sb, sc = _order(ends.send, mask)
    ro, ra, rb, rc = _order(ends.recv, mask)
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
