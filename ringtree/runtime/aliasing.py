"""Memory aliasing rules of a call's buffers, checked before anything is sent.

Within one call (the builders of :mod:`ringtree.api`): an output either *is* the input
(in place: the same memory, or for all-gather / reduce-scatter the input is exactly this
rank's block of the output / the output this rank's block of the input), or it does not
touch the input at all. A partial overlap — ``all_reduce(x[:-k], out=x[k:])`` — would let
the call read what it has already written, so it is a ``ValueError``.

Within one group (:meth:`Communicator.group`), whose sends and receives run
concurrently:

- two receives into overlapping memory are a ``ValueError``: no order would be right;
- a send of memory that another operation of the group writes (the buffer a receive
  fills, the README's ring shift) sends it as it was when the group was closed: ringtree
  takes a private copy of that buffer before anything is sent (``MPI_Sendrecv_replace``'s
  semantics, one copy of the overlapping buffer only).

Collectives inside one group run concurrently too, except where their memory overlaps
(either one writes): then the later one starts when the earlier one has completed, in
issue order, as collectives of one communicator run on one NCCL stream. ``ringtree perf
-a`` aggregates iterations on one buffer this way. Such an ordering is only safe in a
group without sends and receives (a receive could wait for a send that the ordering put
behind it on another rank), so there it is a ``ValueError``, and so is a receive into
memory that a collective of the group reads or writes.

Between calls in flight the executor orders overlapping calls as one NCCL stream would
(:meth:`Executor.submit`), so separate calls need no rule here.
"""

from __future__ import annotations

import numpy as np

from ringtree.ir.program import Buf
from ringtree.runtime.batch import conflict
from ringtree.transports.shm_cma import address

__all__ = ["check_out", "order_group", "span"]


def span(a: np.ndarray | None) -> tuple[int, int] | None:
    """The byte range ``[lo, hi)`` of a contiguous array (None if empty or absent)."""
    if a is None or a.nbytes == 0:
        return None
    lo = address(a) if a.flags.c_contiguous else a.__array_interface__["data"][0]
    return lo, lo + a.nbytes


def _meets(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def check_out(what: str, inp: np.ndarray | None, out: np.ndarray | None,
              in_place: bool) -> None:
    """Raise if ``out`` overlaps ``inp`` without being the call's in-place layout."""
    if in_place or not _meets(span(inp), span(out)):
        return
    raise ValueError(
        f"{what}: out= partly overlaps the input (input bytes {_fmt(span(inp))}, out bytes "
        f"{_fmt(span(out))}); pass the same buffer for an in-place call, or memory that "
        "does not overlap")


def _fmt(s: tuple[int, int] | None) -> str:
    return "-" if s is None else f"{s[0]:#x}..{s[1]:#x}"


def _uses(call) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(read-only spans, written spans) of one call, from its compiled steps."""
    rd = wr = 0
    for csteps in call.steps:
        for cs in csteps:
            if cs.src is not None:
                rd |= 1 << cs.src.buf
            if cs.dst is not None:
                wr |= 1 << cs.dst.buf
    reads, writes = [], []
    bufs = call.bufs
    same = bufs[Buf.INPUT] is not None and bufs[Buf.OUTPUT] is not None and \
        span(bufs[Buf.INPUT]) == span(bufs[Buf.OUTPUT]) and rd >> Buf.INPUT & 1 \
        and wr >> Buf.OUTPUT & 1
    for b in (Buf.INPUT, Buf.OUTPUT):
        s = span(bufs[b]) if (rd | wr) >> b & 1 else None
        if s is None:
            continue
        (writes if wr >> b & 1 or (same and b == Buf.INPUT) else reads).append(s)
    return reads, writes


def order_group(calls: list) -> list[list]:
    """Apply the group rules to ``calls`` (before anything is submitted) and return them
    as consecutive batches to submit in order: raise on two writers of the same memory,
    give sends of memory the group writes a private copy, and start a new batch at a
    collective whose memory overlaps a collective of the batch before it."""
    uses = [_uses(c) for c in calls]
    p2p = [c.desc.algo == "p2p" for c in calls]
    for i, (_, wi) in enumerate(uses):
        for j in range(i + 1, len(calls)):
            if not (p2p[i] or p2p[j]):
                continue
            if p2p[i] and p2p[j]:
                clash = any(_meets(a, b) for a in wi for b in uses[j][1])
            else:   # a receive (the p2p call's writes) against a collective's memory
                k, c = (i, j) if p2p[i] else (j, i)
                clash = any(_meets(a, b) for a in uses[k][1] for b in uses[c][0] + uses[c][1])
            if clash:
                raise ValueError(
                    f"group: {calls[i].desc.name} and {calls[j].desc.name} write "
                    "overlapping memory in one group, whose operations run concurrently; "
                    "use separate buffers or separate groups")
    batches: list[list] = [[]]
    members: list[int] = []   # indices of the collectives in the last batch
    for i, call in enumerate(calls):
        if not p2p[i] and any(conflict(*uses[i], *uses[j]) for j in members):
            if any(p2p):
                raise ValueError(
                    f"group: {calls[members[0]].desc.name} and {call.desc.name} use "
                    "overlapping memory in a group that also sends or receives; ringtree "
                    "orders such collectives one after the other, which could deadlock the "
                    "group's sends and receives: use separate buffers or separate groups")
            batches.append([])
            members = []
        batches[-1].append(call)
        if not p2p[i]:
            members.append(i)
    for i, (ri, _) in enumerate(uses):
        if not ri or not p2p[i]:
            continue
        hit = any(_meets(a, b) for j, (_, wj) in enumerate(uses) if j != i
                  for a in ri for b in wj)
        if hit:
            call = calls[i]
            src = call.bufs[Buf.INPUT]
            call.bufs[Buf.INPUT] = src.copy()  # what it held when the group closed
    return batches


def run_group(items: list, submit, wait, timeout: float) -> None:
    """Issue a closed group's ``(call, work, result)`` items as the batches
    :func:`order_group` cuts them into (each waits for the overlapping ones before it),
    with ``submit(calls, works, results, timeout)``, and ``wait`` for every batch."""
    handles = []
    for calls in order_group([item[0] for item in items]):
        part, items = items[:len(calls)], items[len(calls):]
        handles.append(submit(calls, [w for _, w, _ in part], [r for _, _, r in part],
                              timeout))
    for h in handles:
        wait(h)
