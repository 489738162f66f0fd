"""LL for Programs of several rounds: MSCCL-IR files written for the LL protocol.

:mod:`ringtree.runtime.protocols.ll` runs one-round Programs: one publication through the
shared segment per call. An MSCCL-IR all-reduce for LL (``proto="LL"``: ``ap2ll``,
``r48ll``, ``ar_tree_12_LL`` ...) reduces a chunk, then sends the result on: two or more
dependent rounds. Here such a Program runs as a sequence of publications, the bulk
synchronous form of the same data flow (Valiant's BSP; NCCL's LL likewise turns every
hop into a flag-guarded store the receiver polls for, ``prims_ll.h``):

- :func:`rounds` takes every rank's Program and gives each step a round, the longest
  path to it in the graph whose edges are the Program's memory dependencies (weight 0:
  the same round, run in program order) and its messages (weight 1: a value sent in
  round ``t`` is read in round ``t + 1`` or later). Messages match as everywhere in the
  IR: in order per (sender, receiver, channel).
- Round ``t`` on a rank: run its steps of round ``t`` in program order, reading what
  they receive from the senders' areas of publication ``t - 1`` (or from a private copy
  taken then, when a step reads it later) and writing what they send into this rank's
  area of publication ``t`` (one slot per sending step, read by every peer it sends
  to); then publish (:meth:`LL.sync`). The last round sends nothing, so a call is
  ``rounds - 1`` publications, the same number on every rank.
- Two parities suffice as for one round: a rank writes publication ``t + 1``'s parity
  (that of ``t - 1``) only after every rank posted ``t``, i.e. finished reading ``t - 1``.

Each step does exactly what the Program says, in its order (``value = src; value ⊕=
recv(p) for p in recv_from; dst = value; send``), with the call's :class:`Reducer`, so an
LL run gives the bits the checker proved and a Simple run gives. Chunks are one size
(the call's count divides into the Program's chunks, as MSCCL's executors require), and
the op refuses what it cannot run: a cyclic wait, unmatched messages, a round's writes
larger than a cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Buf, Program, Ref
from ringtree.ir.wire import PROTO_LL, WireHeader, algo_code
from ringtree.ops import ReduceOp, Reducer
from ringtree.runtime.plan import Desc
from ringtree.transports.shm_ll import LL


@dataclass
class Rounds:
    """Every rank's steps by round, and where each message lives (in chunks)."""

    count: int                            # rounds; count - 1 publications
    order: list[list[list[int]]]          # order[r][t]: rank r's steps of round t
    slot: list[dict[int, tuple[int, int]]]  # slot[r][i]: (round, offset) of step i's send
    area: list[list[int]]                 # area[r][t]: chunks rank r writes in round t
    inbox: list[dict[int, list[tuple[int, int]]]]  # inbox[r][i]: (peer, sending step)
    stash: list[list[list[tuple[int, int, int]]]]  # stash[r][t]: (peer, step, offset)
    stash_chunks: list[int]


def _flat(p: Program) -> list:
    return [(c, s) for c, ch in enumerate(p.channels) for s in ch]


def _messages(programs: list[Program]) -> list[dict[int, list[tuple[int, int]]]]:
    """inbox[r][i]: (peer, the peer's sending step) of every receive of rank r's step i,
    in its ``recv_from`` order."""
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for r, p in enumerate(programs):
        for i, (c, s) in enumerate(_flat(p)):
            if len(set(s.recv_from)) != len(s.recv_from):
                raise ValueError(f"LL: rank {r} step {i} receives twice from one peer")
            for q in s.send_to:
                sends.setdefault((r, q, c), []).append(i)
            for q in s.recv_from:
                recvs.setdefault((q, r, c), []).append(i)
    inbox: list[dict[int, list[tuple[int, int]]]] = [{} for _ in programs]
    for key in set(sends) | set(recvs):
        sl, rl = sends.get(key, []), recvs.get(key, [])
        if len(sl) != len(rl):
            q, r, c = key
            raise ValueError(f"LL: rank {q} sends {len(sl)} message(s) to rank {r} on "
                             f"channel {c}, which receives {len(rl)}")
        for i_s, i_r in zip(sl, rl):
            inbox[key[1]].setdefault(i_r, []).append((key[0], i_s))
    for r, p in enumerate(programs):
        steps = _flat(p)
        for i, got in inbox[r].items():
            order = steps[i][1].recv_from
            got.sort(key=lambda m: order.index(m[0]))
    return inbox


def _longest(programs: list[Program], in_place: bool, inbox) -> dict[tuple[int, int], int]:
    """Each step's round: the longest path to it (memory dependencies weigh 0, messages
    1); ValueError on a cycle."""
    succ: dict[tuple[int, int], list[tuple[tuple[int, int], int]]] = {}
    indeg: dict[tuple[int, int], int] = {}
    for r, p in enumerate(programs):
        for i, ds in enumerate(p.memory_deps(in_place)):
            indeg[(r, i)] = len(ds) + len(inbox[r].get(i, ()))
            for d in ds:
                succ.setdefault((r, d), []).append(((r, i), 0))
        for i, got in inbox[r].items():
            for q, i_s in got:
                succ.setdefault((q, i_s), []).append(((r, i), 1))
    rnd = dict.fromkeys(indeg, 0)
    ready = [v for v, k in indeg.items() if k == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for w, weight in succ.get(v, ()):
            rnd[w] = max(rnd[w], rnd[v] + weight)
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if done != len(indeg):
        r, i = next(v for v, k in indeg.items() if k)
        raise ValueError(f"LL: the steps wait in a cycle (rank {r} step {i} among them)")
    return rnd


def rounds(programs: list[Program], in_place: bool) -> Rounds:
    """Each step's round (the module docstring), where each message is written, and
    what is kept aside; ValueError if the Programs wait in a cycle or their messages do
    not match."""
    n = len(programs)
    inbox = _messages(programs)
    rnd = _longest(programs, in_place, inbox)
    count = max(rnd.values(), default=0) + 1
    order: list[list[list[int]]] = [[[] for _ in range(count)] for _ in range(n)]
    slot: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
    area = [[0] * count for _ in range(n)]
    stash: list[list[list[tuple[int, int, int]]]] = [[[] for _ in range(count)]
                                                     for _ in range(n)]
    stash_chunks = [0] * n
    for r, p in enumerate(programs):
        steps = _flat(p)
        for i, (_, s) in enumerate(steps):
            t = rnd[(r, i)]
            order[r][t].append(i)
            if s.send_to:
                slot[r][i] = (t, area[r][t])
                area[r][t] += s.ref.count
            for q, i_s in inbox[r].get(i, ()):
                t_send = rnd[(q, i_s)]
                if t > t_send + 1:   # read later than it arrives: kept aside then
                    stash[r][t_send + 1].append((q, i_s, stash_chunks[r]))
                    stash_chunks[r] += s.ref.count
    return Rounds(count, order, slot, area, inbox, stash, stash_chunks)


_ROUNDS: dict[tuple, Rounds] = {}


def rounds_of(programs: list[Program], in_place: bool) -> Rounds:
    """:func:`rounds`, once per (algorithm, collective, ranks, root, mode)."""
    p = programs[0]
    key = (p.algo, p.collective, p.nranks, p.root, p.chunks, in_place)
    got = _ROUNDS.get(key)
    if got is None:
        got = _ROUNDS[key] = rounds(programs, in_place)
    return got


def fits(programs: list[Program], in_place: bool, count: int, itemsize: int,
         cell_bytes: int) -> str | None:
    """Why LL cannot run this call of the Programs (None: it can)."""
    p = programs[0]
    if count % p.chunks:
        return f"{count} elements per block do not cut into {p.chunks} equal chunks"
    try:
        rs = rounds_of(programs, in_place)
    except ValueError as e:
        return str(e)
    most = max((c for a in rs.area for c in a), default=0) * (count // p.chunks) * itemsize
    if most > cell_bytes:
        return f"a round writes {most} bytes, more than a cell ({cell_bytes})"
    return None


class RoundsOp:
    """One prepared call shape of a several-round Program on LL; ``run(x, out, reducer,
    timeout)`` runs it (the interface of :class:`~ringtree.runtime.protocols.ll.LLOp`)."""

    def __init__(self, ll: LL, programs: list[Program], dt: DType, count: int, op_code: int,
                 root: int, in_place: bool):
        prog = programs[ll.rank]
        why = fits(programs, in_place, count, dt.storage.itemsize, ll.cell_bytes)
        if why is not None:
            raise ValueError(f"LL cannot run {prog.algo}: {why}")
        rs = rounds_of(programs, in_place)
        coll, me = prog.collective, ll.rank
        self.ll, self.coll, self.count, self.root, self.dtype = ll, coll, count, root, dt
        self.name, self.rs = coll.value, rs
        opname = list(ReduceOp)[op_code].value if coll.reduces else "-"
        self.desc = Desc(coll.value, count, dt.value, dt.code, opname, op_code, root, 0,
                         prog.algo, coll.code, PROTO_LL)
        self.head = WireHeader(0, count, 0, algo_code(prog.algo), coll.code, dt.code,
                               op_code, PROTO_LL, root).call_words()
        self.S = S = count // prog.chunks
        self.steps = _flat(prog)
        self._lens = [[stp.ref.count * S for _, stp in _flat(p)] for p in programs]
        self.runs = prog.storage_runs(in_place)
        st = dt.storage
        # areas[q][t][parity]: rank q's writes of round t, as this rank sees them
        self.areas = [[tuple(ll.view(q, par, st, rs.area[q][t] * S) if rs.area[q][t] else
                             None for par in (0, 1)) for t in range(rs.count)]
                      for q in range(ll.n)]
        self.keep = np.empty(rs.stash_chunks[me] * S, st)
        self.kept = {(q, i_s): self.keep[o * S:] for per in rs.stash[me] for q, i_s, o in per}
        longest = max((s.ref.count for _, s in self.steps), default=0)
        self.tmp = np.empty(longest * S, st)
        self.scratch = np.zeros(prog.scratch * S, st)

    def describe(self) -> str:
        root = f", root={self.root}" if self.root >= 0 else ""
        return f"{self.name}(count={self.count}, {self.dtype.value}{root}, proto=LL)"

    def _view(self, bufs, ref: Ref) -> np.ndarray:
        S = self.S
        parts = [bufs[b][lo * S:hi * S] for b, lo, hi in self.runs(ref)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _store(self, bufs, ref: Ref, value: np.ndarray) -> None:
        S, at = self.S, 0
        for b, lo, hi in self.runs(ref):
            m = (hi - lo) * S
            bufs[b][lo * S:hi * S] = value[at:at + m]
            at += m

    def _message(self, q: int, i_s: int, parity: int) -> np.ndarray:
        """The value rank ``q``'s step ``i_s`` sent: in its area of the last
        publication, or kept aside when it came earlier."""
        n = self._lens[q][i_s]
        kept = self.kept.get((q, i_s))
        if kept is not None:
            return kept[:n]
        t, off = self.rs.slot[q][i_s]
        return self.areas[q][t][parity][off * self.S:off * self.S + n]

    def run(self, x, out, red: Reducer | None, timeout: float) -> None:
        ll, rs, me = self.ll, self.rs, self.ll.rank
        bufs = {Buf.INPUT: x, Buf.OUTPUT: out, Buf.SCRATCH: self.scratch}
        prev = -1  # the parity of the last publication
        for t in range(rs.count):
            for q, i_s, o in rs.stash[me][t]:   # read later than it arrives: keep it
                tt, off = rs.slot[q][i_s]
                n = self._lens[q][i_s]
                self.keep[o * self.S:o * self.S + n] = \
                    self.areas[q][tt][prev][off * self.S:off * self.S + n]
            last = t == rs.count - 1
            par = -1 if last else ll.parity(timeout, self.describe)
            for i in rs.order[me][t]:
                self._step(i, bufs, red, prev, par, t)
            if not last:
                prev = ll.sync(self.head, timeout, self.describe)

    def _step(self, i: int, bufs, red: Reducer | None, prev: int, par: int, t: int) -> None:
        _, s = self.steps[i]
        value = self._view(bufs, s.src) if s.src is not None else None
        tmp = self.tmp[:s.ref.count * self.S]
        if s.reduce and not s.recv_from:       # dst = dst ⊕ src
            red.combine(tmp, self._view(bufs, s.dst), value)
            value = tmp
        for q, i_s in self.rs.inbox[self.ll.rank].get(i, ()):
            msg = self._message(q, i_s, prev)
            if value is None or not s.reduce:
                value = msg
            else:
                red.combine(tmp, value, msg)
                value = tmp
        if s.dst is not None:
            self._store(bufs, s.dst, value)
        if s.send_to:
            _, off = self.rs.slot[self.ll.rank][i]
            self.areas[self.ll.rank][t][par][off * self.S:off * self.S + value.size] = value
