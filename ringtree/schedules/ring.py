"""Ring algorithms, in NCCL's step order (``src/device/all_reduce.h::runRing`` and friends).

Ranks form the ring 0 → 1 → … → n−1 → 0. With ``channels = k`` the data is cut into k
parts, each going round its own ring concurrently (NCCL's channels).

Costs (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009), p ranks, n bytes:
- all-reduce:       2(p−1)·α + 2(p−1)/p·n·β + (p−1)/p·n·γ   (bandwidth-optimal)
- all-gather / reduce-scatter: (p−1)·α + (p−1)/p·n·β (+ (p−1)/p·n·γ for reduce-scatter)
- broadcast / reduce (pipelined chain of s slices): (p−1+s−1)·(α + n/s·β)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, Step, copy, inp, out
from ringtree.schedules.registry import Options, register


def _program(coll: Collective, n: int, r: int, opts: Options, chunks: int,
             channel: Callable[[int], list[Step]], **kw: Any) -> Program:
    """The program whose channel c runs ``channel(c)``: what one NCCL channel's
    ``runRing`` does with its part of the data."""
    return Program(coll, "ring", n, r, chunks,
                   tuple(tuple(channel(c)) for c in range(opts.channels)), root=opts.root, **kw)


def _blocks(buf: Callable[[int], ir.Ref], n: int, k: int, c: int) -> Callable[[int], ir.Ref]:
    """Block ``b`` (mod n) of channel ``c``'s part of a buffer of n·k blocks: the block of
    rank b lives at (b mod n)·k + c, so each channel's ring moves whole rank blocks."""
    return lambda b: buf((b % n) * k + c)


@register(Collective.ALL_REDUCE, "ring", cost="2(p−1)·α + 2(p−1)/p·n·β + (p−1)/p·n·γ")
def all_reduce(n: int, r: int, opts: Options) -> Program:
    """send, recvReduceSend ×(n−2), recvReduceCopySend, recvCopySend ×(n−2), recv."""
    nxt, prv = (r + 1) % n, (r - 1) % n

    def channel(c: int) -> list[Step]:
        base = c * n

        def ch(i: int) -> int:
            return base + i % n

        if n == 1:
            return [copy(inp(base, n), out(base, n))]
        steps = [ir.send(nxt, inp(ch(r - 1)))]
        steps += [ir.recv_reduce_send(prv, nxt, inp(ch(r - j))) for j in range(2, n)]
        steps.append(ir.recv_reduce_copy_send(prv, nxt, inp(ch(r)), out(ch(r))))
        steps += [ir.recv_copy_send(prv, nxt, out(ch(r - j))) for j in range(1, n - 1)]
        steps.append(ir.recv(prv, out(ch(r + 1))))
        return steps

    return _program(Collective.ALL_REDUCE, n, r, opts, n * opts.channels, channel)


@register(Collective.ALL_GATHER, "ring", cost="(p−1)·α + (p−1)/p·n·β")
def all_gather(n: int, r: int, opts: Options) -> Program:
    """copySend own block, recvCopySend ×(n−2), recv."""
    k = opts.channels
    nxt, prv = (r + 1) % n, (r - 1) % n

    def channel(c: int) -> list[Step]:
        blk = _blocks(out, n, k, c)
        steps = [ir.Step(src=inp(c), dst=blk(r), send_to=(nxt,) if n > 1 else ())]
        steps += [ir.recv_copy_send(prv, nxt, blk(r - j)) for j in range(1, n - 1)]
        if n > 1:
            steps.append(ir.recv(prv, blk(r + 1)))
        return steps

    return _program(Collective.ALL_GATHER, n, r, opts, k, channel)


@register(Collective.REDUCE_SCATTER, "ring", cost="(p−1)·α + (p−1)/p·n·β + (p−1)/p·n·γ")
def reduce_scatter(n: int, r: int, opts: Options) -> Program:
    """send, recvReduceSend ×(n−2), recvReduceCopy into the output."""
    k = opts.channels
    nxt, prv = (r + 1) % n, (r - 1) % n

    def channel(c: int) -> list[Step]:
        blk = _blocks(inp, n, k, c)
        if n == 1:
            return [copy(blk(0), out(c))]
        steps = [ir.send(nxt, blk(r - 1))]
        steps += [ir.recv_reduce_send(prv, nxt, blk(r - j)) for j in range(2, n)]
        steps.append(ir.recv_reduce_copy(prv, blk(r), out(c)))
        return steps

    return _program(Collective.REDUCE_SCATTER, n, r, opts, k, channel)


@register(Collective.BROADCAST, "ring", cost="(p−1+s−1)·(α + n/s·β)")
def broadcast(n: int, r: int, opts: Options) -> Program:
    """Pipelined chain root → root+1 → … → root−1 (the executor slices the data)."""
    pos = (r - opts.root) % n
    nxt, prv = (r + 1) % n, (r - 1) % n

    def channel(c: int) -> list[Step]:
        if pos == 0:
            return [ir.Step(src=inp(c), dst=out(c), send_to=(nxt,) if n > 1 else ())]
        if pos == n - 1:
            return [ir.recv(prv, out(c))]
        return [ir.recv_copy_send(prv, nxt, out(c))]

    return _program(Collective.BROADCAST, n, r, opts, opts.channels, channel)


@register(Collective.REDUCE, "ring", cost="(p−1+s−1)·(α + n/s·β)")
def reduce(n: int, r: int, opts: Options) -> Program:
    """Pipelined chain root+1 → root+2 → … → root, reducing on the way."""
    pos = (r - opts.root) % n
    nxt, prv = (r + 1) % n, (r - 1) % n

    def channel(c: int) -> list[Step]:
        if n == 1:
            return [copy(inp(c), out(c))]
        if pos == 1:
            return [ir.send(nxt, inp(c))]
        if pos == 0:
            return [ir.recv_reduce_copy(prv, inp(c), out(c))]
        return [ir.recv_reduce_send(prv, nxt, inp(c))]

    return _program(Collective.REDUCE, n, r, opts, opts.channels, channel)
