"""May the ranks read each other's memory? The single-copy paths' probe.

Whether :mod:`ll_direct`'s paths may run is probed once per communicator (:func:`probe`,
collective, at the LL segment's creation): every rank publishes a random token and its
address, reads every peer's (and writes it back: :mod:`ll_direct_fold` writes), and the
ranks agree on the outcome. Refused reads (``EPERM``: ptrace policy; ``ENOSYS``/seccomp),
another pid namespace, or ``RINGTREE_CMA=0`` leave the segment's paths;
``RINGTREE_DEBUG=INFO`` says which.
"""

from __future__ import annotations

import os
import secrets

import numpy as np

from ringtree.ir.program import Collective
from ringtree.ir.wire import PROTO_LL, WireHeader
from ringtree.runtime.protocols.ll_direct import ADDR, PID, TOKEN, Direct, payload_word
from ringtree.transports import shm_cma as cma
from ringtree.transports import shm_segment as seg
from ringtree.transports.shm_ll import LL

__all__ = ["probe"]

PROBE = 0x434D41    # the probe's "count": its header differs from every call's


def probe(ll: LL, timeout: float) -> tuple[Direct | None, str]:
    """Collective over the segment's ranks: may every rank read every peer's memory?
    (the :class:`Direct` if so, and why not otherwise)."""
    why = ""
    if not cma.supported():
        why = "no process_vm_readv here"
    elif any(info.ns != seg.pid_namespace() for info in ll.peers.values()):
        why = "ranks in different pid namespaces"
    cma.allow_readers()
    token = np.frombuffer(secrets.token_bytes(8), np.uint64).copy()
    head = WireHeader(0, PROBE, 0, 0, Collective.BARRIER.code, 0, 0, PROTO_LL, 0).call_words()
    W = ll.W
    what = lambda: "the single-copy probe"  # noqa: E731
    p = ll.parity(timeout, what)
    i = payload_word(ll, ll.rank, p)
    W[i + PID], W[i + ADDR], W[i + TOKEN] = os.getpid(), cma.address(token), int(token[0])
    ll.sync(head, timeout, what)
    got = np.zeros(1, np.uint64)
    for q in range(ll.n):
        j = payload_word(ll, q, p)
        if q == ll.rank or why:
            continue
        try:
            cma.read_into(int(W[j + PID]), got, int(W[j + ADDR]), 8)
            if int(got[0]) != int(W[j + TOKEN]):
                why = f"read another process than rank {q}'s"
            else:  # the single-copy all-reduce writes too: the same token back
                cma.write_spans(int(W[j + PID]), [(cma.address(got), int(W[j + ADDR]), 8)])
        except OSError as e:
            why = f"reading rank {q}: {os.strerror(e.errno or 0)}"
    p = ll.parity(timeout, what)
    i = payload_word(ll, ll.rank, p)
    W[i] = 1 if why else 0
    ll.sync(head, timeout, what)
    bad = [q for q in range(ll.n) if W[payload_word(ll, q, p)]]
    if bad and not why:
        why = f"rank {bad[0]} may not read its peers"
    return (None, why) if bad else (Direct(ll, None), "")
