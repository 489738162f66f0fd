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
from ringtree.transports import shm_native as native
from ringtree.transports.shm_ll import SEQ_MASK

# output bytes from which the peers' blocks are copied with streaming stores (no read for
# ownership; as ll_direct's all-gather): a 32 MiB copy took 0.3-0.55x NumPy's alone
STREAM_MIN = 8 << 20
# an all-reduce's from this many bytes: its copies (in place, into the blocks the peers
# read in the next call) and, in the kernel below STREAM_MIN, its folded block (which
# the peers read at once) too: a line a peer reads from memory cost less here than one
# taken from the writer's cache (2 ranks, 1 MiB: the copy 97 -> 43 us); at 256 KiB, in
# the caches, streaming was slower, and from 16 MiB the streamed fold was (loaded
# host; docs/design-notes.md)
STREAM_MIN_AR = 1 << 20


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

    def _native(self, x: np.ndarray, out: np.ndarray, t: float) -> bool:
        """The call after the agreement in one kernel entry (``Round.reg``; or its
        answer, :attr:`code`, when the entry also made the agreement), completed: True;
        False for an all-reduce whose first wait Python finished (a peer slept or came
        late: the copy and the last synchronisation are left)."""
        ll, rop = self.ll, self.current
        two = rop.coll is Collective.ALL_REDUCE
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
        ll.written[0] = ll.written[1] = None  # the kernel wrote the lines' headers
        if r == -1:
            ll.seq = ll.synced = s + two
            return True
        second = r >= native.SECOND // 2
        ll.seq = s + second
        native.finish(ll, rop.k, r - second * native.SECOND, ll.seq, t, rop.describe)
        ll.synced = ll.seq
        return second or not two

    def _prepare(self, key: tuple, x: np.ndarray, out: np.ndarray) -> tuple:
        """``Round.reg``'s arguments after ``s`` and the header: the rows' addresses
        (every rank's input where it lies, the peers' mapped once), the fold's
        destination and bytes, the copies (dst, src, bytes), streamed or not, two calls
        or one. Kept for the next call with the same buffers and peers' locations."""
        n, me, locs, coll = self.ll.n, self.ll.rank, self.locs, key[0].coll
        item, xa, oa = x.itemsize, key[2], key[3]
        rows: tuple = ()
        dst, nbytes, cps = 0, 0, []
        if coll is Collective.ALL_REDUCE:
            m = x.size
            b = [q * m // n * item for q in range(n + 1)]
            rows = tuple(xa + b[me] if q == me else self._at(q, locs[q][0], m * item) + b[me]
                         for q in range(n))
            dst, nbytes = oa + b[me], b[me + 1] - b[me]
            for q in range(n):
                if q != me and b[q + 1] > b[q]:
                    cps += [oa + b[q], self._at(q, locs[q][1], m * item) + b[q], b[q + 1] - b[q]]
        elif coll is Collective.BROADCAST:  # one copy of the root's buffer, but at the root
            root, c = key[0].root, x.nbytes
            if me != root and c:
                cps = [oa, self._at(root, locs[root][0], c), c]
        elif coll is Collective.ALL_GATHER:
            c = x.nbytes
            for q in range(n):
                if c and (q != me or not self.in_place):
                    cps += [oa + q * c, xa if q == me else self._at(q, locs[q][0], c), c]
        else:
            c = out.nbytes
            rows = tuple(xa + me * c if q == me else self._at(q, locs[q][0], n * c) + me * c
                         for q in range(n))
            dst, nbytes = oa, c
        two, size = coll is Collective.ALL_REDUCE, out.nbytes
        stream = size >= STREAM_MIN if not two else \
            (size >= STREAM_MIN_AR) | (STREAM_MIN_AR <= size < STREAM_MIN) << 1
        args = (rows, dst, nbytes, tuple(cps), int(stream), two)
        self._args = (key, args, tuple(w for q in range(n) if q != me for w in locs[q]))
        return args

    def _at(self, q: int, word: int, nbytes: int) -> int:
        info = self.ll.peers[q]
        try:
            return self.arena.peer_address(q, info.pid, info.ns, word, nbytes)
        except (OSError, TypeError) as e:
            raise RingtreeError(f"rank {self.ll.rank} cannot map rank {q}'s registered "
                                f"buffer: {e}") from None

