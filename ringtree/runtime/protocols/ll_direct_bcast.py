"""A large single-copy broadcast: the root and its readers share the copies.

The broadcast's single copy (:class:`~ringtree.runtime.protocols.ll_direct.DirectOp`, in
its C entry where the kernel is built) has every rank but the root read the root's buffer
with ``process_vm_readv`` while the root waits: on 2 ranks one core copies and the other
idles. From more than a piece the copies are shared where a large all-gather's are
(``DirectOp.shares``: 2 to ``SHARE_MAX`` ranks, whose counters fit a line's inline
payload; the atomic add compiled; ``RINGTREE_CMA_SHARE``): each reader's buffer is cut
into :data:`~ringtree.runtime.protocols.ll_direct.SHARE_PIECE` pieces drawn from a
counter in the reader's line (an atomic add, ``shm_cma.claim``), by the reader reading
them from the root and by the root writing them into the reader
(``process_vm_writev``), so on 2 ranks both cores copy at once and every piece is copied
once, whoever takes it (a broadcast staged through shared memory keeps both cores busy
too, with two copies).

A rank that does not share (no atomic add compiled, ``RINGTREE_CMA_SHARE=0``) copies
every piece itself: the same bytes, so ranks that differ still give the root's bytes.
The pieces' statuses go through the second synchronisation as every single copy's do.
"""

from __future__ import annotations

import numpy as np

from ringtree.runtime.protocols.ll_direct import ADDR, COUNT, OUT, WROTE, DirectOp
from ringtree.transports import shm_cma as cma

__all__ = ["BroadcastOp"]


class BroadcastOp(DirectOp):
    """A broadcast's single copy, its large calls' copies shared (:attr:`shared`).

    Shared from more than a piece. On 2 ranks of an Intel Xeon host, alternated jobs, µs,
    shared against the straight read in the C entry: 512 KiB (one piece) 26.0-26.6
    against 18.2-18.8, 768 KiB 26.7-27.2 against 30.6-31.7, 1 MiB 28.3-32.7 against
    55.0-55.5, 2 MiB 93-103 against 193-196, 4 MiB 219-223 against 370-372, 16 MiB
    690-694 against 1,281-1,285, 64 MiB 3,899-4,044 against 7,878-8,217; 4 ranks on 2
    cores 2 MiB 514-523 against 644-743, 16 MiB 2,303-2,485 against 2,806-2,887, 64 MiB
    13,861-13,935 against 17,062-17,524."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.shared = self.shares(False)  # (the all-gather's test, pieces not straight)

    def _broadcast(self, x: np.ndarray, out: np.ndarray, red, timeout: float) -> None:
        if not self.shared or not cma.can_claim():  # (asked at each call, as the
            return super()._broadcast(x, out, red, timeout)  # all-gather's shares())
        ll, W, me, root, nb = self.ll, self.ll.W, self.ll.rank, self.root, self.nbytes
        words = self._posted(x, timeout, cma.address(out))  # (zeroes this rank's counters)
        status = 0
        if me != root:  # this rank's pieces, from the root
            e, _ = self.direct.claim(root, words[me] + COUNT + root, cma.address(out),
                                     int(W[words[root] + ADDR]), nb, False)
            status = root << 32 | e if e else 0
        else:  # every reader's, into it: the nearest first
            for q in sorted(range(ll.n), key=lambda q: (q - me) % ll.n)[1:]:
                e, _ = self.direct.claim(q, words[q] + COUNT + me, cma.address(x),
                                         int(W[words[q] + OUT]), nb, True)
                if e:
                    status = q << 32 | WROTE | e
                    break
            if out is not x:
                out[...] = x
        self._complete(status, timeout)
