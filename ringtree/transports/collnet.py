"""The CollNet transport: the switch plays the virtual ranks of CollNet schedules.

In ``collnet_direct`` / ``collnet_chain`` a node's head sends its part *up* to a virtual
rank ``v ≥ nranks`` and then receives the reduced part back from it
(:mod:`ringtree.schedules.collnet`). This transport gives the executor exactly that
peer: the k-th message sent to ``v`` and the k-th receive posted from ``v`` (per virtual
rank, in posting order, the IR's FIFO rule) become one switch all-reduce of that message
over the group of heads that ``v`` aggregates — NCCL's CollNet plugin ``iallreduce``
between the ``send`` and ``recv`` proxies. The call's 32-byte header travels with every
chunk, so the switch compares the members' calls the way a peer's receive does.

Which heads a virtual rank aggregates comes from its Program (``meta["members"]``); the
group key hashes the communicator, the algorithm and those members, so two algorithms or
two communicators never share a group.
"""

from __future__ import annotations

import hashlib
from collections import deque

import numpy as np

from ringtree.dtypes import DType
from ringtree.ops import ReduceOp
from ringtree.switch.client import SwitchGroup, SwitchLink, SwitchOp
from ringtree.transports.base import Request, Transport

_DTYPES = list(DType)
_OPS = list(ReduceOp)
_DTYPE_AT, _OP_AT = 25, 26  # byte offsets in the message header (ringtree.core.plan.HEADER)


def group_key(comm_id: str, algo: str, vrank: int, members: tuple[int, ...]) -> bytes:
    text = f"{comm_id}|{algo}|{vrank}|{','.join(map(str, members))}"
    return hashlib.sha256(text.encode()).digest()[:16]


class CollNetTransport(Transport):
    """Virtual ranks served by the switch at the other end of ``link``."""

    name = "collnet"

    def __init__(self, link: SwitchLink):
        self.link = link
        self.groups: dict[int, SwitchGroup] = {}
        self._ops: dict[int, deque[SwitchOp]] = {}
        self._recvs: dict[int, deque[Request]] = {}

    def add_group(self, vrank: int, group: SwitchGroup) -> None:
        self.groups[vrank] = group
        self._ops.setdefault(vrank, deque())
        self._recvs.setdefault(vrank, deque())

    # ---- the transport contract --------------------------------------------------------
    #
    # A send is staged (copied) and streamed at once, and the send completes: the
    # executor may then reuse or overwrite that memory — an in-place all-reduce's
    # down-step writes the very buffer the up-step sent — while the switch still may
    # ask for a retransmission. The result lands in the staging buffer chunk by chunk
    # (a chunk is never resent once its result is back) and is copied into the k-th
    # receive posted from the same virtual rank.

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        req = Request(peer, channel, header, payload, True)
        g = self.groups.get(peer)
        if g is None:
            req.fail(ValueError(f"virtual rank {peer} has no switch group"))
            return req
        if self.link.error is not None:
            req.fail(self.link.error)
            return req
        dcode, ocode = header[_DTYPE_AT], header[_OP_AT]
        if dcode >= len(_DTYPES) or ocode >= len(_OPS):
            req.fail(ValueError("the switch reduces SUM, MIN and MAX on SHARP's dtypes only"))
            return req
        dtype, op = _DTYPES[dcode], _OPS[ocode]
        stage = payload.reshape(-1).view(dtype.storage).copy()
        try:
            o = g.post(stage, stage, dtype, op, header)
        except ValueError as e:
            req.fail(e)
            return req
        self._ops[peer].append(o)
        req.done = True
        self._match(peer)
        return req

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        req = Request(peer, channel, header, into, False)
        if peer not in self.groups:
            req.fail(ValueError(f"virtual rank {peer} has no switch group"))
            return req
        self._recvs[peer].append(req)
        self._match(peer)
        return req

    def _match(self, peer: int) -> bool:
        """Complete receives whose switch all-reduce is done (FIFO per virtual rank)."""
        ops, recvs = self._ops[peer], self._recvs[peer]
        moved = False
        while ops and recvs and ops[0].done:
            o, r = ops.popleft(), recvs.popleft()
            if o.error is not None:
                r.fail(o.error)
                continue
            dst = r.buf.reshape(-1).view(np.uint8)
            src = o.recv.view(np.uint8)
            if dst.nbytes != src.nbytes:
                r.fail(ValueError(f"receive of {dst.nbytes} bytes from virtual rank {peer} "
                                  f"pairs with a {src.nbytes}-byte send"))
                continue
            np.copyto(dst, src)
            r.done = moved = True
        return moved

    def poll(self) -> bool:
        moved = self.link.poll()
        for peer in self.groups:
            moved |= self._match(peer)
        if self.link.error is not None:
            for q in self._recvs.values():
                while q:
                    q.popleft().fail(self.link.error)
        return moved

    def pending(self) -> bool:
        return any(self._recvs.values()) or self.link.pending()

    def wait_fds(self) -> list[tuple[int, int]]:
        return self.link.wait_fds()

    def wait(self, timeout: float) -> None:
        self.link.wait(timeout)

    def close(self) -> None:
        self.link.close()
