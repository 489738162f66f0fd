"""Ring algorithms, in NCCL's step order (``src/device/all_reduce.h::runRing`` and friends).

Ranks form the ring 0 → 1 → … → n−1 → 0. With ``channels = k`` the data is cut into k
parts, each going round its own ring concurrently (NCCL's channels).

Costs (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009), p ranks, n bytes:
- all-reduce:       2(p−1)·α + 2(p−1)/p·n·β + (p−1)/p·n·γ   (bandwidth-optimal)
- all-gather / reduce-scatter: (p−1)·α + (p−1)/p·n·β (+ (p−1)/p·n·γ for reduce-scatter)
- broadcast / reduce (pipelined chain of s slices): (p−1+s−1)·(α + n/s·β)
"""

from __future__ import annotations

from typing import Any

from ringtree.core import ir
from ringtree.core.ir import Collective, Program, Step, copy, inp, out
from ringtree.schedules.registry import Options, register


def _program(coll: Collective, n: int, r: int, opts: Options, chunks: int,
             channels: list[list[Step]], **kw: Any) -> Program:
    return Program(coll, "ring", n, r, chunks, tuple(tuple(c) for c in channels),
                   root=opts.root, **kw)


@register(Collective.ALL_REDUCE, "ring", cost="2(p−1)·α + 2(p−1)/p·n·β + (p−1)/p·n·γ")
def all_reduce(n: int, r: int, opts: Options) -> Program:
    """send, recvReduceSend ×(n−2), recvReduceCopySend, recvCopySend ×(n−2), recv."""
    k = opts.channels
    nxt, prv = (r + 1) % n, (r - 1) % n
    channels = []
    for c in range(k):
        base = c * n

        def ch(i: int, base: int = base) -> int:
            return base + i % n

        if n == 1:
            channels.append([copy(inp(base, n), out(base, n))])
            continue
        steps = [ir.send(nxt, inp(ch(r - 1)))]
        steps += [ir.recv_reduce_send(prv, nxt, inp(ch(r - j))) for j in range(2, n)]
        steps.append(ir.recv_reduce_copy_send(prv, nxt, inp(ch(r)), out(ch(r))))
        steps += [ir.recv_copy_send(prv, nxt, out(ch(r - j))) for j in range(1, n - 1)]
        steps.append(ir.recv(prv, out(ch(r + 1))))
        channels.append(steps)
    return _program(Collective.ALL_REDUCE, n, r, opts, n * k, channels)


@register(Collective.ALL_GATHER, "ring", cost="(p−1)·α + (p−1)/p·n·β")
def all_gather(n: int, r: int, opts: Options) -> Program:
    """copySend own block, recvCopySend ×(n−2), recv."""
    k = opts.channels
    nxt, prv = (r + 1) % n, (r - 1) % n
    channels = []
    for c in range(k):
        def blk(b: int, c: int = c) -> ir.Ref:
            return out((b % n) * k + c)

        own = ir.Step(src=inp(c), dst=blk(r), send_to=(nxt,) if n > 1 else ())
        steps = [own]
        steps += [ir.recv_copy_send(prv, nxt, blk(r - j)) for j in range(1, n - 1)]
        if n > 1:
            steps.append(ir.recv(prv, blk(r + 1)))
        channels.append(steps)
    return _program(Collective.ALL_GATHER, n, r, opts, k, channels)


@register(Collective.REDUCE_SCATTER, "ring", cost="(p−1)·α + (p−1)/p·n·β + (p−1)/p·n·γ")
def reduce_scatter(n: int, r: int, opts: Options) -> Program:
    """send, recvReduceSend ×(n−2), recvReduceCopy into the output."""
    k = opts.channels
    nxt, prv = (r + 1) % n, (r - 1) % n
    channels = []
    for c in range(k):
        def blk(b: int, c: int = c) -> ir.Ref:
            return inp((b % n) * k + c)

        if n == 1:
            channels.append([copy(blk(0), out(c))])
            continue
        steps = [ir.send(nxt, blk(r - 1))]
        steps += [ir.recv_reduce_send(prv, nxt, blk(r - j)) for j in range(2, n)]
        steps.append(ir.recv_reduce_copy(prv, blk(r), out(c)))
        channels.append(steps)
    return _program(Collective.REDUCE_SCATTER, n, r, opts, k, channels)


@register(Collective.BROADCAST, "ring", cost="(p−1+s−1)·(α + n/s·β)")
def broadcast(n: int, r: int, opts: Options) -> Program:
    """Pipelined chain root → root+1 → … → root−1 (the executor slices the data)."""
    k, root = opts.channels, opts.root
    pos = (r - root) % n
    nxt, prv = (r + 1) % n, (r - 1) % n
    channels = []
    for c in range(k):
        if pos == 0:
            step = ir.Step(src=inp(c), dst=out(c), send_to=(nxt,) if n > 1 else ())
        elif pos == n - 1:
            step = ir.recv(prv, out(c))
        else:
            step = ir.recv_copy_send(prv, nxt, out(c))
        channels.append([step])
    return _program(Collective.BROADCAST, n, r, opts, k, channels)


@register(Collective.REDUCE, "ring", cost="(p−1+s−1)·(α + n/s·β)")
def reduce(n: int, r: int, opts: Options) -> Program:
    """Pipelined chain root+1 → root+2 → … → root, reducing on the way."""
    k, root = opts.channels, opts.root
    pos = (r - root) % n
    nxt, prv = (r + 1) % n, (r - 1) % n
    channels = []
    for c in range(k):
        if n == 1:
            step = copy(inp(c), out(c))
        elif pos == 1:
            step = ir.send(nxt, inp(c))
        elif pos == 0:
            step = ir.recv_reduce_copy(prv, inp(c), out(c))
        else:
            step = ir.recv_reduce_send(prv, nxt, inp(c))
        channels.append([step])
    return _program(Collective.REDUCE, n, r, opts, k, channels)
