"""LL's data path compiled (``_llc.c``): one round in one C call, where Python was the
bottleneck of a small collective.

Why: profiled (cProfile, rank 0 of 2 pinned ranks, 8-byte in-place all-reduce), a call
in Python made 31 Python-level function calls (58-85 when its wait loops) — the
communicator's hot path and flight recorder, :meth:`LL.parity`, the NumPy copy of the
contribution, :meth:`LL.sync` (header and sequence words, a fence, the sleep flags, a
spin loop with a ``clock()`` and a lambda per look, a header compare per peer) and
``ufunc(a, b, out=)`` — and each rank's Python sits on the critical path twice per call
(it publishes late and sees the peer late). With the kernel a call makes 18, none of them in LL,
and an all-reduce of a shape already seen 5, C ones included (``Round.hot``: the flight recorder's
entry written in C too; ``docs/design-notes.md``, "LL's round compiled" and "The small
all-reduce in one C entry", has the measurements).

:class:`Round` (prepared once per call shape, with every word index and byte offset)
does copy → header → sequence word → fence → look at the peers' sleep flags → wait for
every peer (spin with ``pause``, then ``sched_yield``, within the LL wait's budgets,
``RINGTREE_LL_SPIN_US`` and ``RINGTREE_LL_YIELD_US``) → compare headers → fold, with
the GIL released throughout. What it does not do stays in Python, unchanged: ringing a
sleeping peer's doorbell, sleeping on our own, the liveness checks that name a dead
peer, the abort check and the timeout, and telling a revoked peer's poisoned line
from a mismatch (:func:`finish`). So a killed peer, a signal, a revoke or a closed
communicator during a wait behave as before, at most one yield budget later.

The fold is the rank-order fold bit for bit (see the C file): every dtype and op
ringtree has except float16 and user ops, whose ops keep LL's Python steps
(:func:`folds`). ``RINGTREE_LL_NATIVE=0``, or a package built without
a C compiler, runs every step in Python; ``tests/test_ll_native.py`` checks both give
the same bits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np

from ringtree import kernels, settings
from ringtree.errors import MismatchError
from ringtree.transports import shm_segment as seg
from ringtree.transports.shm_ll import POISON, SEQ_MASK

# None when built without a C compiler, or built from other sources (ringtree.kernels)
_llc = kernels.load("ringtree.transports._llc")

__all__ = ["available", "describe", "enabled", "finish", "fold_push", "folds", "make_round",
           "pushes", "round_for", "rounds_on", "run_gather", "run_round", "run_scatter", "share_nt",
           "stores"]

def _probes() -> tuple:
    """Arrays and what NumPy says of them, for ``_llc.ndlayout`` (``_ndview.h``): a
    2-D writeable one, a read-only transposed view, a 0-d one, a 1-D int8 slice."""
    a = np.arange(6.0).reshape(2, 3)
    b = a.T
    b.flags.writeable = False
    arrays = (a, b, np.zeros((), np.int32), np.zeros(5, np.int8)[1:])
    return tuple((x, x.__array_interface__["data"][0], x.shape, x.dtype,
                  x.flags.c_contiguous, x.flags.writeable) for x in arrays)


if _llc is not None:  # the one-call entries read an ndarray's fields if they agree
    _llc.ndlayout(np.ndarray, _probes())

RING = _llc.RING if _llc is not None else -1
NOBUF = _llc.NOBUF if _llc is not None else -2  # Round.hot: not the round's buffer
NOTMINE = _llc.NOTMINE if _llc is not None else -3  # Round.hot: not the owner's thread
SECOND = _llc.SECOND if _llc is not None else 1 << 25  # Round.split: call s + 1's code
REG_LEARN = _llc.REG_LEARN if _llc is not None else -4  # Round.reg: agreement to Python


def available() -> bool:
    """Whether the kernel was built with the package."""
    return _llc is not None


def enabled() -> bool:
    """Built and not switched off (``RINGTREE_LL_NATIVE=0``)."""
    return _llc is not None and bool(settings.current().ll_native)


def describe() -> str:
    """How LL's rounds run here, for ``RINGTREE_DEBUG=INFO``."""
    if _llc is None:
        return "in Python (the compiled kernel was not built: no C compiler at install)"
    if not enabled():
        return "in Python (RINGTREE_LL_NATIVE=0)"
    return "compiled (ringtree.transports._llc)"


def folds(dtype_code: int, op_code: int) -> bool:
    """Does the kernel fold ``dtype_code`` (:attr:`DType.code`) with ``op_code``
    (:attr:`ReduceOp.code`)?"""
    return _llc is not None and _llc.folds(dtype_code, op_code)


def fold_push(pids: Sequence[int], ins: Sequence[int], outs: Sequence[int],
              order: Sequence[int], me: int, own: np.ndarray, dst: np.ndarray, at: int,
              dtype_code: int, op_code: int, piece: int, scratch: np.ndarray) -> int:
    """The single-copy all-reduce's block in one call (``_llc.fold_push``, the GIL
    released; :mod:`ringtree.runtime.protocols.ll_direct_fold`): every peer's row read a
    ``piece`` at a time (``process_vm_readv``, from ``ins[q] + at``), folded in ``order``
    with the own row ``own`` into ``dst``, pushed into every peer's output (``outs[q] +
    at``, ``process_vm_writev``). 0, or ``q << 32 | errno`` of the first failed move
    (``| 1 << 16`` for a write). Only where :func:`folds` and the kernel is built."""
    return _llc.fold_push(pids, ins, outs, order, me, own, dst, at, dtype_code, op_code,
                          piece, scratch)


def pushes() -> bool:
    """Is ``fold_push`` there (a build from before it lacks it)?"""
    return enabled() and hasattr(_llc, "fold_push")


# the rounds made on each segment and the bytes from which their copies into it stream
# (:func:`stores`), by segment (an LL); a round goes when its op does
_ROUNDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
SHARE_NT = 4096  # the kernel's default (_llc.c, SHARE_NT)
CACHED = 1 << 62  # a share_nt past any copy: every copy into the segment is cached


def _rounds(ll) -> list:
    rounds = _ROUNDS.get(ll)
    if rounds is None:
        rounds = _ROUNDS[ll] = [SHARE_NT, weakref.WeakSet()]
    return rounds


def stores(ll, share_nt: int) -> None:
    """Every round on ``ll``, made or to be made: copies into the segment of at least
    ``share_nt`` bytes stream (non-temporal stores), smaller ones go through the caches
    (:data:`SHARE_NT` the default, :data:`CACHED` none streamed). The bits never change."""
    rounds = _rounds(ll)
    rounds[0] = share_nt
    for k in list(rounds[1]):
        k.stores(share_nt)


def share_nt(ll) -> int:
    """The bytes from which ``ll``'s rounds stream their copies into the segment."""
    rounds = _ROUNDS.get(ll)
    return SHARE_NT if rounds is None else rounds[0]


def rounds_on(ll) -> list:
    """The rounds made on ``ll`` that are still in use."""
    rounds = _ROUNDS.get(ll)
    return [] if rounds is None else list(rounds[1])


def make_round(ll, mine: tuple[int, int], nbytes: int, rows: Sequence[Sequence[int]],
               row_bytes: int, dtype_code: int, op_code: int):
    """A prepared round on ``ll`` (:class:`ringtree.transports.shm_ll.LL`): this rank's
    contribution at byte offsets ``mine`` (by parity) of at most ``nbytes``, and the
    rows to fold at byte offsets ``rows[parity]`` in the Program's order (empty: the
    round folds nothing), each ``row_bytes`` long."""
    words = tuple(tuple(j for _, j in ll.peer_seq[p]) for p in (0, 1))
    sleep = tuple(j for _, j in ll.peer_sleep)
    if rows[0]:
        last = max(max(r) for r in rows) + row_bytes
        if last > ll.seg.size:
            raise ValueError(f"LL rows end at byte {last}, past the segment")
    if max(mine) + nbytes > ll.seg.size:
        raise ValueError("LL contribution past the segment")
    k = _llc.Round(ll.seg.mm, ll.my_seq, mine, words[0], words[1], sleep,
                   tuple(rows[0]), tuple(rows[1]), dtype_code, op_code,
                   int(ll.spin * 1e9), int(ll.yield_s * 1e9), nbytes, row_bytes)
    rounds = _rounds(ll)
    rounds[1].add(k)
    if rounds[0] != SHARE_NT:
        k.stores(rounds[0])
    return k


def round_for(ll, order: Sequence[int], block: int, dtype_code: int, itemsize: int,
              op_code: int, count: int, per: int, size: int):
    """The compiled round of an LL op (None: a fold the kernel does not do): this rank
    contributes ``per`` elements; it folds (if ``order`` is not empty) the ranks in
    ``order``, ``count`` elements of each from block ``block`` of contributions of
    ``size`` bytes."""
    if order and not folds(dtype_code, op_code):
        return None
    mine = tuple(ll.area(ll.rank, p, per * itemsize)[0] for p in (0, 1))
    rows: list[list[int]] = [[], []]
    if order:
        for p in (0, 1):
            off, stride = ll.area(0, p, size)
            rows[p] = [off + block * count * itemsize + q * stride for q in order]
    return make_round(ll, mine, per * itemsize, rows, count * itemsize, dtype_code,
                      op_code if order else 0)


def alone_round(ll, dtype_code: int, nbytes: int):
    """One rank's round (``Round.alone``): no peers, no rows; every entry checks its
    buffers of ``nbytes``, writes the flight recorder's entry and copies (or scales) x
    into out, or does nothing in place."""
    k = _llc.Round(ll.seg.mm, ll.my_seq, (0, 0), (), (), (), (), (), dtype_code, 0, 0, 0,
                   0, 0)
    k.alone(nbytes, None)
    return k


def run_round(ll, k, x, out, head: tuple[int, int, int], timeout: float, what) -> int:
    """:meth:`LL.parity`, then the whole round of ``ll`` in the kernel ``k`` (a
    :func:`make_round`): ``x`` (None: already in place, or nothing to send) written,
    published, waited for, folded into ``out`` (None: no fold). Returns the parity read."""
    s = ll.seq + 1
    if ll.synced < s - 1:
        ll.parity(timeout, what)
    p = s & 1
    ll.written[p] = None  # the kernel writes all three header words
    r = k.run(x, out, s, head[0], head[1] | (s & SEQ_MASK), head[2])
    ll.seq = s
    if r != -1:
        finish(ll, k, r, s, timeout, what)
        if out is not None:
            k.fold(out, p)
    ll.synced = s
    return p


def run_gather(ll, k, x, out, off: int, block: int, head: tuple[int, int, int],
               timeout: float, what) -> int:
    """:func:`run_round` for one part of an all-gather (``Round.gather``, its blocks set
    by ``Round.places``): ``x`` written and published, the output's own block's part
    copied from ``x``, the peers' parts copied once they are there, each at byte ``off``
    of its output block of ``block`` bytes. Returns the parity read, or ``-1 - parity``
    when the kernel returned before it could place the peers' parts (a peer slept or
    came late): the caller places the blocks from the segment."""
    s = ll.seq + 1
    if ll.synced < s - 1:
        ll.parity(timeout, what)
    ll.written[s & 1] = None  # the kernel writes all three header words
    r = k.gather(x, out, s, head[0], head[1] | (s & SEQ_MASK), head[2], off, block)
    ll.seq = s
    if r != -1:
        finish(ll, k, r, s, timeout, what)
    ll.synced = s
    return s & 1 if r == -1 else -1 - (s & 1)


def run_scatter(ll, k, x, out, head: tuple[int, int, int], timeout: float, what,
                own: Callable[[int], None]) -> None:
    """:func:`run_round` for a reduce-scatter (``Round.scatter``, its own block set by
    ``Round.skips``): ``x`` but its own block written and published, the fold reading
    that block from ``x``. When the kernel returns before the fold, ``own(parity)``
    writes the own block into the segment and the fold reads it there."""
    s = ll.seq + 1
    if ll.synced < s - 1:
        ll.parity(timeout, what)
    ll.written[s & 1] = None  # the kernel writes all three header words
    r = k.scatter(x, out, s, head[0], head[1] | (s & SEQ_MASK), head[2])
    ll.seq = s
    if r != -1:
        own(s & 1)
        finish(ll, k, r, s, timeout, what)
        k.fold(out, s & 1)
    ll.synced = s


def finish(ll, k, r: int, s: int, timeout: float, what: Callable[[], str]) -> None:
    """Complete call ``s``'s wait after :meth:`Round.run` returned ``r`` (not -1): ring
    sleeping peers (``RING``), raise on a header mismatch, sleep in Python for a peer that
    did not arrive within the budgets (liveness, abort and timeout checks), then let the
    kernel look at the rest."""
    W = ll.W
    p = s & 1
    mine = None
    while r != -1:
        if r == RING:
            for peer, j in ll.peer_sleep:
                if W[j]:
                    seg.ring_bell(ll.peer_bells[peer])
            r = k.wait(s, 0)
            continue
        if mine is None:
            i = ll.my_seq[p]
            mine = (W[i + 1], W[i + 2], W[i + 3])
        if r <= -2:
            peer, j = ll.peer_seq[p][-2 - r]
            if W[j] == POISON:  # it closed (a revoke) without its part of call s
                ll._check_closed(peer, s, what)
            raise MismatchError(ll._mismatch(peer, mine, W[j + 1:j + 4], s, what))
        peer, j = ll.peer_seq[p][r]
        ll._wait(peer, lambda j=j: W[j] >= s, s, timeout, what, mine, busy=False)
        r = k.wait(s, r)
