"""What ranks must agree on for one call, and how a disagreement is named.

Every message's header carries the call's fingerprint (count, sequence number,
algorithm, collective, dtype, op, protocol, root: the call part of
:class:`~ringtree.ir.wire.WireHeader`, from :class:`~ringtree.runtime.plan.Desc`),
compared by the receiver before a payload byte lands; an LL line carries the same words.
Algorithms travel as a small code every rank computes alike from the name (so an error
prints ``ring``, not a number).

A disagreement on the *root* or the *algorithm* usually changes who talks to whom, so the
message that would reveal it may never be sent: the ranks wait for each other instead.
:func:`check_stalled` closes that gap. Once a rank has waited a second inside a
collective it writes that call's header (its call part) to the store
(``<prefix>/fp/<seq>/<rank>``) and compares it with those of the ranks that did the
same; a difference raises :class:`~ringtree.errors.MismatchError` naming the field and
both values (:meth:`~ringtree.ir.wire.WireHeader.describe_difference`). Every rank
stuck in the call finds it within about two seconds, and the abort line tells the others
it was a mismatch (they raise ``MismatchError`` too). A call that does not stall costs
nothing.
"""

from __future__ import annotations

import time

from ringtree.errors import MismatchError
from ringtree.ir.wire import WireHeader

__all__ = ["check_stalled"]


def check_stalled(comm) -> None:
    """Called about once a second while ``comm`` waits: compare the stalled call's
    fingerprint with the other stalled ranks' (see the module docstring)."""
    fr = getattr(comm, "flight", None)
    cur = fr.current() if fr is not None else None
    if cur is None or cur.state != 1 or cur.peer >= 0:  # nothing started, or p2p
        return
    desc = cur.desc
    seen = getattr(comm, "_stall", None)
    now = time.monotonic()
    if seen is None or seen[0] != desc.seq:
        comm._stall = (desc.seq, now, False)
        return
    base = f"{comm.prefix}/fp/{desc.seq}"
    head = desc.header()
    mine = head.call_part()
    if not seen[2]:
        comm.store.set(f"{base}/{comm.rank}", mine)
        comm._stall = (desc.seq, seen[1], True)
    for r in range(comm.size):
        if r == comm.rank:
            continue
        raw = comm.store.try_get(f"{base}/{r}")
        if raw is None or raw == mine:
            continue
        theirs = WireHeader.unpack(WireHeader.frame(0, raw))
        diffs = head.describe_difference(theirs, comm.rank, r)
        raise MismatchError(
            f"rank {comm.rank} and rank {r} disagree on {desc}: " + "; ".join(diffs)
            + " (found while both waited for each other; ranks must call the same "
              "collectives in the same order with matching count, dtype, op, root and "
              "algorithm)")
