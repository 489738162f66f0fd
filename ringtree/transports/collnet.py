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
        self._sends: dict[int, deque[Request]] = {}
        self._recvs: dict[int, deque[Request]] = {}
        self._active: list[tuple[SwitchOp, Request, Request]] = []

    def add_group(self, vrank: int, group: SwitchGroup) -> None:
        self.groups[vrank] = group
        self._sends.setdefault(vrank, deque())
        self._recvs.setdefault(vrank, deque())

    # ---- the transport contract --------------------------------------------------------

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        req = Request(peer, channel, header, payload, True)
        self._queue(self._sends, req)
        return req

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        req = Request(peer, channel, header, into, False)
        self._queue(self._recvs, req)
        return req

    def _queue(self, table: dict[int, deque[Request]], req: Request) -> None:
        if req.peer not in self.groups:
            req.fail(ValueError(f"virtual rank {req.peer} has no switch group"))
            return
        if self.link.error is not None:
            req.fail(self.link.error)
            return
        table[req.peer].append(req)
        sends, recvs = self._sends[req.peer], self._recvs[req.peer]
        while sends and recvs:
            s, r = sends.popleft(), recvs.popleft()
            dtype = _DTYPES[s.header[_DTYPE_AT]]
            op = _OPS[s.header[_OP_AT]]
            src = s.buf.reshape(-1).view(dtype.storage)
            dst = r.buf.reshape(-1).view(dtype.storage)
            try:
                o = self.groups[req.peer].post(src, dst, dtype, op, s.header)
            except ValueError as e:
                s.fail(e)
                r.fail(e)
                continue
            self._active.append((o, s, r))

    def poll(self) -> bool:
        moved = self.link.poll()
        if self._active:
            still = []
            for o, s, r in self._active:
                if not o.done:
                    still.append((o, s, r))
                elif o.error is not None:
                    s.fail(o.error)
                    r.fail(o.error)
                else:
                    s.done = r.done = True
                    moved = True
            self._active = still
        if self.link.error is not None:
            for q in (*self._sends.values(), *self._recvs.values()):
                while q:
                    q.popleft().fail(self.link.error)
        return moved

    def pending(self) -> bool:
        return bool(self._active) or self.link.pending()

    def wait_fds(self) -> list[tuple[int, int]]:
        return self.link.wait_fds()

    def wait(self, timeout: float) -> None:
        self.link.wait(timeout)

    def close(self) -> None:
        self.link.close()
