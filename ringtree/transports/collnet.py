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
from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp
from ringtree.switch.client import SwitchGroup, SwitchLink, SwitchOp
from ringtree.transports.base import Request, Transport

_DTYPES = list(DType)
_OPS = list(ReduceOp)
# byte offsets in the message header (ringtree.ir.wire.WireHeader)
_COLL_AT, _DTYPE_AT, _OP_AT, _ROOT_AT = 24, 25, 26, 28
_BROADCAST = Collective.BROADCAST.code
_REDUCING = {c.code for c in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER,
                              Collective.REDUCE)}


def group_key(comm_id: str, algo: str, vrank: int, members: tuple[int, ...],
              coll: int = 0, root: int = 0) -> bytes:
    text = f"{comm_id}|{algo}|{coll}|{root}|{vrank}|{','.join(map(str, members))}"
    return hashlib.sha256(text.encode()).digest()[:16]


def message_key(peer: int, header: bytes) -> tuple[int, int, int]:
    """The switch group a message to or from virtual rank ``peer`` belongs to: one per
    (virtual rank, collective, broadcast root), so that every op of a group has the same
    shape on a member (all send-and-receive, send-only or receive-only), and the order
    in which the executor posts its messages is the order of the group's stream."""
    coll = header[_COLL_AT]
    root = int.from_bytes(header[_ROOT_AT:_ROOT_AT + 4], "little", signed=True) \
        if coll == _BROADCAST else 0
    return peer, coll, root


class CollNetTransport(Transport):
    """Virtual ranks served by the switch at the other end of ``link``."""

    name = "collnet"

    def __init__(self, link: SwitchLink):
        self.link = link
        self.groups: dict[tuple[int, int, int], tuple[SwitchGroup, bool, bool]] = {}
        self._ops: dict[tuple, deque[_Pair]] = {}       # sends whose receive is not posted
        self._recvs: dict[tuple, deque[Request]] = {}   # receives whose send is not posted
        self._active: list[_Pair] = []                  # ops not yet complete
        self._vranks: set[int] = set()

    def add_group(self, key: tuple[int, int, int], group: SwitchGroup, sends: bool = True,
                  receives: bool = True) -> None:
        """Serve ``key`` (:func:`message_key`) with ``group``; this member sends to the
        virtual rank (contributes) and/or receives from it, in every op of the group."""
        self.groups[key] = (group, sends, receives)
        self._ops.setdefault(key, deque())
        self._recvs.setdefault(key, deque())
        self._vranks.add(key[0])

    # ---- the transport contract --------------------------------------------------------
    #
    # No copies on the way: a chunk goes to the switch straight from the send's memory,
    # and its result lands straight in the paired receive's memory. So the send stays
    # incomplete until every result of its op is back (until then a lost chunk may have
    # to be resent from it; the executor does not touch memory a send still holds). In a
    # group where this member sends and receives (all-reduce, its own reduce-scatter
    # block) the k-th send pairs with the k-th receive. A receive posted after its send is
    # usually still in time to take the remaining chunks (the chunks already back are
    # copied over); only a receive that must wait for its own send — in place, where the
    # receive overwrites the memory being sent — finds the result complete in a temporary
    # buffer and copies it once. A send-only op gets DONEs; a receive-only op (a
    # multicast's receivers) checks in and lands the result in the receive.

    def _group(self, peer: int, header: bytes, req: Request):
        entry = self.groups.get(message_key(peer, header))
        if entry is None:
            req.fail(ValueError(f"virtual rank {peer} has no switch group for this call"))
        elif self.link.error is not None:
            req.fail(self.link.error)
            entry = None
        return entry

    def _types(self, header: bytes, req: Request):
        dcode, ocode = header[_DTYPE_AT], header[_OP_AT]
        if dcode >= len(_DTYPES) or ocode >= len(_OPS):
            req.fail(ValueError("the switch reduces SUM, MIN and MAX on SHARP's dtypes only"))
            return None
        op = _OPS[ocode] if header[_COLL_AT] in _REDUCING else ReduceOp.SUM
        return _DTYPES[dcode], op

    def isend(self, peer: int, channel: int, header: bytes, payload: np.ndarray) -> Request:
        req = Request(peer, channel, header, payload, True)
        entry, types = self._group(peer, header, req), self._types(header, req)
        if entry is None or types is None:
            return req
        (g, _, receives), (dtype, op) = entry, types
        key = message_key(peer, header)
        src = payload.reshape(-1).view(dtype.storage)
        recvs = self._recvs[key]
        recv = recvs[0] if recvs and receives else None
        if recv is not None and recv.buf.nbytes != src.nbytes:
            err = ValueError(f"receive of {recv.buf.nbytes} bytes from virtual rank {peer} "
                             f"pairs with a {src.nbytes}-byte send")
            recvs.popleft().fail(err)
            req.fail(err)
            return req
        into = recv.buf.reshape(-1).view(dtype.storage) if recv is not None else \
            np.empty_like(src) if receives else src
        try:
            o = g.post(src, into, dtype, op, header, want=receives)
        except ValueError as e:
            req.fail(e)
            return req
        if recv is not None:
            recvs.popleft()
        pair = _Pair(o, req, recv)
        self._active.append(pair)
        if recv is None and receives:
            self._ops[key].append(pair)
        self._finish()
        return req

    def irecv(self, peer: int, channel: int, header: bytes, into: np.ndarray) -> Request:
        req = Request(peer, channel, header, into, False)
        entry = self._group(peer, header, req)
        if entry is None:
            return req
        g, sends, _ = entry
        key = message_key(peer, header)
        if not sends:  # a multicast's receiver: check in, land the result here
            types = self._types(header, req)
            if types is not None:
                flat = into.reshape(-1).view(types[0].storage)
                try:
                    o = g.post(flat, flat, types[0], types[1], header, contribute=False)
                except ValueError as e:
                    req.fail(e)
                    return req
                self._active.append(_Pair(o, None, req))
                self._finish()
            return req
        ops = self._ops[key]
        if not ops:
            self._recvs[key].append(req)
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
        """Complete the requests of every op that is done."""
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
    """A switch op and the send (None: a receive-only op) and receive it serves."""

    __slots__ = ("op", "send", "recv")

    def __init__(self, op: SwitchOp, send: Request | None, recv: Request | None):
        self.op, self.send, self.recv = op, send, recv
