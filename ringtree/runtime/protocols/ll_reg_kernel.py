"""Registered buffers' calls in one compiled entry (``Round.reg`` in ``_llc.c``): the
part of :class:`~ringtree.runtime.protocols.ll_reg.Registered` that drives the kernel.

After the agreement, a registered call's data path and its LL synchronisations are one C
entry with the GIL released (the rank-order fold of the rows where they lie, the
synchronisations, the copies), its arguments (every address, the peers' mapped once)
prepared once for a call's buffers and the peers' locations (:meth:`KernelPath._prepare`)
and kept. On the buffers of the last call the entry also makes the agreement
(:meth:`KernelPath._fast`): it marks the call, waits for the peers' marks within the LL
wait's budgets and checks each one's header and locations against the last call's; a
peer asleep, late, not registered, or on other buffers leaves the rest of the agreement
to Python (``REG_LEARN``), whose waits name a dead peer. A wait of the data path that
outlasts the budgets returns its code, and Python finishes it
(:func:`ringtree.transports.shm_native.finish`), as for the other entries.
"""

from __future__ import annotations

import numpy as np

from ringtree.errors import RingtreeError
from ringtree.ir.program import Collective
from ringtree.transports import cpu_caches
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import SEQ_MASK

# output bytes from which the peers' blocks are copied with streaming stores (no read for
# ownership; as ll_direct's all-gather): a 32 MiB copy took 0.3-0.55x NumPy's alone
STREAM_MIN = 8 << 20
# an all-reduce's folded block is copied into the peers' outputs with streaming stores
# once the ranks' buffers together (ranks x bytes) exceed this; else with cached ones
# (pushes_stream). Twice the L3: quiet host, AMD EPYC with a 16 MiB L3 shared by both
# cores, 512 KiB L2 each, alternated in one job, cached ÷ streamed: 2 ranks 1 MiB 0.60,
# 2 MiB 0.49-0.53, 4 MiB 0.54, 8 MiB 0.90, 16 MiB 0.92, 32 MiB 1.00 (each rank reading
# its whole result after every call: 0.58, 0.53, 0.53, 0.94, 0.95); 4 ranks on 2 cores
# 1 MiB 0.61, 4 MiB 0.91, 16 MiB 1.16. On a host with 2 MiB of L2 a core (and a 32 MiB
# L3), loaded, a line written into another core's cache cost more than one streamed to
# memory from 1 MiB (2 ranks) on: there, from 2 MiB in all (docs/design-notes.md)
STREAM_MIN_AR = 2 << 20 if cpu_caches.level_bytes(2) >= 2 << 20 else \
    2 * cpu_caches.level_bytes(3)


def pushes_stream(n: int, nbytes: int) -> bool:
    """Does an all-reduce of ``nbytes`` on ``n`` ranks push its folded blocks with
    streaming stores (:data:`STREAM_MIN_AR`)?"""
    return n * nbytes > STREAM_MIN_AR


class KernelPath:
    """The compiled entry's half of ``Registered`` (its state: ``ll``, ``arena``,
    ``current``, ``locs``, ``in_place``, ``_xa``/``_oa``, ``_args``, ``code``)."""

    def _fast(self, rop, words: tuple[int, int], t: float):
        """On the buffers of the last call (and after an LL call), the agreement and the
        call in one kernel entry (``Round.reg`` with ``agree``): True when it ran
        (:attr:`code`, its answer, is for the call's run to complete); when the entry
        left the agreement to Python (``REG_LEARN``), :meth:`_learn`'s answer; False
        when it was not taken (nothing done)."""
        ll, last = self.ll, self._args
        if rop.k is None or last[0] is None or last[0][0] is not rop or \
                last[0][2] != self._xa or last[0][3] != self._oa or ll.synced < ll.seq:
            return False
        s = ll.seq + 1
        h = rop.head
        r = rop.k.reg(s, h[0], h[1] | (s & SEQ_MASK), h[2], *last[1],
                      (words[0], words[1], *last[2]))
        if r != native.REG_LEARN:
            self.code = (r, s)
            return True
        return self._learn(rop, words, t, False)  # (no wait here spun or yielded)

    # ---- the compiled entry ------------------------------------------------------------

    def _native(self, x: np.ndarray, out: np.ndarray, t: float) -> None:
        """The call after the agreement in one kernel entry (``Round.reg``; or its
        answer, :attr:`code`, when the entry also made the agreement), completed (a
        wait that outlasted the kernel's budgets finished in Python)."""
        ll, rop = self.ll, self.current
        if self.code is not None:  # the entry of the agreement ran it
            (r, s), self.code = self.code, None
        else:
            key = (rop, self.locs, self._xa, self._oa)
            args = self._args[1] if self._args[0] == key else self._prepare(key, x, out)
            s = ll.seq + 1
            if ll.synced < s - 1:
                ll.parity(t, rop.describe)
            h = rop.head
            r = rop.k.reg(s, h[0], h[1] | (s & SEQ_MASK), h[2], *args)
        ll.written[s & 1] = None  # the kernel wrote the line's header
        ll.seq = s
        if r != -1:
            native.finish(ll, rop.k, r, s, t, rop.describe)
        ll.synced = s

    def _prepare(self, key: tuple, x: np.ndarray, out: np.ndarray) -> tuple:
        """``Round.reg``'s arguments after ``s`` and the header: the rows' addresses
        (every rank's input where it lies, the peers' mapped once), the fold's
        destinations and bytes, the copies (dst, src, bytes), streamed or not. Kept for
        the next call with the same buffers and peers' locations."""
        n, me, locs, coll = self.ll.n, self.ll.rank, self.locs, key[0].coll
        item, xa, oa, size = x.itemsize, key[2], key[3], out.nbytes
        rows: tuple = ()
        dst, nbytes, cps, stream = 0, 0, [], size >= STREAM_MIN
        if coll is Collective.ALL_REDUCE:  # block me folded, then pushed to the peers'
            m = x.size
            b = [q * m // n * item for q in range(n + 1)]
            rows = tuple(xa + b[me] if q == me else self._at(q, locs[q][0], m * item) + b[me]
                         for q in range(n))
            dst, nbytes, stream = oa + b[me], b[me + 1] - b[me], pushes_stream(n, size)
            for q in range(n):
                if q != me and nbytes:
                    cps += [self._at(q, locs[q][1], m * item) + b[me], dst, nbytes]
        elif coll is Collective.BROADCAST:  # one copy of the root's buffer, but at the root
            root, c = key[0].root, x.nbytes
            if me != root and c:
                cps = [oa, self._at(root, locs[root][0], c), c]
        elif coll is Collective.ALL_GATHER:
            c = x.nbytes
            for q in range(n):
                if c and (q != me or not self.in_place):
                    cps += [oa + q * c, xa if q == me else self._at(q, locs[q][0], c), c]
        else:  # reduce-scatter: block me folded into the own output
            c = out.nbytes
            rows = tuple(xa + me * c if q == me else self._at(q, locs[q][0], n * c) + me * c
                         for q in range(n))
            dst, nbytes = oa, c
        args = (rows, dst, nbytes, tuple(cps), stream)
        self._args = (key, args, tuple(w for q in range(n) if q != me for w in locs[q]))
        return args

    def _at(self, q: int, word: int, nbytes: int) -> int:
        info = self.ll.peers[q]
        try:
            return self.arena.peer_address(q, info.pid, info.ns, word, nbytes)
        except (OSError, TypeError) as e:
            raise RingtreeError(f"rank {self.ll.rank} cannot map rank {q}'s registered "
                                f"buffer: {e}") from None

