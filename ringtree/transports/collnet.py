"""The CollNet transport: the switch plays the virtual ranks of CollNet schedules.

In ``collnet_direct`` / ``collnet_chain`` a node's head sends its part *up* to a virtual
rank ``v ≥ nranks`` and then receives the reduced part back from it
(:mod:`ringtree.schedules.collnet`). This transport gives the executor exactly that
peer: the k-th message sent to ``v`` and the k-th receive posted from ``v`` (per virtual
rank, in posting order, the IR's FIFO rule) become one switch all-reduce of that message
over the group of heads that ``v`` aggregates — NCCL's CollNet plugin ``iallreduce``
between the ``send`` and ``recv`` proxies, zero-copy on both sides as NCCL's is when it
registers the user buffers (``regIallreduce``). The call's 32-byte header travels with every
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
        self._ops: dict[int, deque[_Pair]] = {}       # sends whose receive is not posted
        self._recvs: dict[int, deque[Request]] = {}   # receives whose send is not posted
        self._active: list[_Pair] = []                # all-reduces not yet complete

    def add_group(self, vrank: int, group: SwitchGroup) -> None:
        self.groups[vrank] = group
        self._ops.setdefault(vrank, deque())
        self._recvs.setdefault(vrank, deque())

    # ---- the transport contract --------------------------------------------------------
    #
    # No copies on the way: a chunk goes to the switch straight from the send's memory,
    # and its result lands straight in the paired receive's memory. So the send stays
    # incomplete until every result of its all-reduce is back (until then a lost chunk may
    # have to be resent from it; the executor does not touch memory a send still holds).
    # The k-th send to ``v`` pairs with the k-th receive from ``v``. A receive posted
    # after its send is usually still in time to take the remaining chunks (the chunks
    # already back are copied over); only a receive that must wait for its own send — an
    # in-place all-reduce, whose receive overwrites the memory being sent — finds the
    # result complete in a temporary buffer and copies it once.

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
        src = payload.reshape(-1).view(dtype.storage)
        recvs = self._recvs[peer]
        recv = recvs[0] if recvs else None
        if recv is not None and recv.buf.nbytes != src.nbytes:
            err = ValueError(f"receive of {recv.buf.nbytes} bytes from virtual rank {peer} "
                             f"pairs with a {src.nbytes}-byte send")
            recvs.popleft().fail(err)
            req.fail(err)
            return req
        into = recv.buf.reshape(-1).view(dtype.storage) if recv is not None else \
            np.empty_like(src)
        try:
            o = g.post(src, into, dtype, op, header)
        except ValueError as e:
            req.fail(e)
            return req
        if recv is not None:
            recvs.popleft()
        entry = _Pair(o, req, recv)
        self._active.append(entry)
        if recv is None:
            self._ops[peer].append(entry)
        self._finish()
        return req

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        req = Request(peer, channel, header, into, False)
        if peer not in self.groups:
            req.fail(ValueError(f"virtual rank {peer} has no switch group"))
            return req
        ops = self._ops[peer]
        if not ops:
            self._recvs[peer].append(req)
            return req
        pair = ops.popleft()
        o = pair.op
        if into.nbytes != o.recv.nbytes:
            req.fail(ValueError(f"receive of {into.nbytes} bytes from virtual rank {peer} "
                                f"pairs with a {o.recv.nbytes}-byte send"))
            return req
        pair.recv = req
        if o.done:
            if o.error is None:
                np.copyto(into.reshape(-1).view(np.uint8), o.recv.view(np.uint8))
            self._complete(pair)
        else:
            o.retarget(into.reshape(-1).view(o.recv.dtype))
        return req

    @staticmethod
    def _complete(pair: _Pair) -> None:
        o = pair.op
        for r in (pair.send, pair.recv):
            if r is None or r.done:
                continue
            if o.error is not None:
                r.fail(o.error)
            else:
                r.done = True

    def _finish(self) -> bool:
        """Complete the requests of every all-reduce that is done."""
        if not any(p.op.done for p in self._active):
            return False
        for p in [p for p in self._active if p.op.done]:
            self._complete(p)
        self._active = [p for p in self._active if not p.op.done]
        return True

    def poll(self) -> bool:
        moved = self.link.poll()
        moved |= self._finish()
        if self.link.error is not None:
            for q in self._recvs.values():
                while q:
                    q.popleft().fail(self.link.error)
        return moved

    def peer_name(self, peer: int) -> str:
        return f"the switch at {self.link.address} (virtual rank {peer})"

    def pending(self) -> bool:
        return any(self._recvs.values()) or bool(self._active) or self.link.pending()

    def wait_fds(self) -> list[tuple[int, int]]:
        return self.link.wait_fds()

    def wait(self, timeout: float) -> None:
        self.link.wait(timeout)

    def close(self) -> None:
        self.link.close()


class _Pair:
    """A switch all-reduce, the send it came from and (once posted) its receive."""

    __slots__ = ("op", "send", "recv")

    def __init__(self, op: SwitchOp, send: Request, recv: Request | None):
        self.op, self.send, self.recv = op, send, recv
