"""Recursive doubling and recursive halving (Thakur, Rabenseifner & Gropp 2005; MPICH's
``allreduce_intra_recursive_doubling.c``, ``allreduce_intra_reduce_scatter_allgather.c``,
``allgather_intra_recursive_doubling.c``, ``reduce_scatter_intra_recursive_halving.c``).

Non-power-of-two p is folded the standard way: with p' = 2^⌊lg p⌋ and rem = p − p', each
even rank r < 2·rem hands its data to r + 1 and sits out; the p' remaining ranks run the
power-of-two algorithm as virtual ranks (r + 1)/2 resp. r − rem; at the end r + 1 hands
the result back. A virtual rank then stands for one or two real ranks, and the blocks of a
range of virtual ranks are still one contiguous range of real blocks.

Costs, p ranks, n bytes (p a power of two; otherwise add 2α + n·β (+ n·γ) for the fold):
- all-reduce, ``recursive_doubling``: lg p·α + n·lg p·β + n·lg p·γ (+ one local copy
  when lg p is odd).
- all-reduce, ``rabenseifner`` (recursive-halving reduce-scatter, recursive-doubling
  all-gather): 2·lg p·α + 2(p−1)/p·n·β + (p−1)/p·n·γ; non-power-of-two:
  (2⌊lg p⌋ + 2)·α + (2(p'−1)/p' + 2)·n·β + (1 + (p'−1)/p')·n·γ.
- all-gather, ``recursive_doubling``: lg p·α + (p−1)/p·n·β (n = gathered bytes).
- reduce-scatter, ``halving``: lg p·α + (p−1)/p·n·β + (p−1)/p·n·γ (n = input bytes).

Every result chunk is reduced on one rank (or, for recursive doubling, by two partners
combining the same two operands), so all ranks end with the same bits. All-gather and
reduce-scatter move ranges of blocks and therefore use one channel.
"""

from __future__ import annotations

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, Ref, Step, copy, inp, out, scr
from ringtree.schedules.registry import Options, register


class Fold:
    """The non-power-of-two fold for ``n`` ranks: p2 = 2^⌊lg n⌋ virtual ranks."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.p2 = 1 << (n.bit_length() - 1)
        self.rem = n - self.p2

    def virtual(self, r: int) -> int | None:
        """Virtual rank of real rank r, None for the ranks that sit out."""
        if r < 2 * self.rem:
            return r // 2 if r % 2 else None
        return r - self.rem

    def real(self, v: int) -> int:
        """The real rank that plays virtual rank v."""
        return 2 * v + 1 if v < self.rem else v + self.rem

    def start(self, v: int) -> int:
        """First real rank (block) of virtual rank v; start(p2) = n."""
        return 2 * v if v <= self.rem else v + self.rem

    def blocks(self, vlo: int, vhi: int) -> tuple[int, int]:
        """(first block, block count) of virtual ranks [vlo, vhi)."""
        return self.start(vlo), self.start(vhi) - self.start(vlo)

    def sits_out(self, r: int) -> bool:
        return r < 2 * self.rem and r % 2 == 0

    def folded_in(self, r: int) -> bool:
        return r < 2 * self.rem and r % 2 == 1

    def enter(self, r: int, src: Ref, dst: Ref) -> tuple[list[Step], bool, int]:
        """A participating rank's start: a folded-in rank first reduces its sitting-out
        partner's ``src`` into ``dst``. Returns (steps, whether ``dst`` now holds the
        working copy, virtual rank)."""
        v = self.virtual(r)
        assert v is not None
        if self.folded_in(r):
            return [ir.recv_reduce_copy(r - 1, src, dst)], True, v
        return [], False, v


@register(Collective.ALL_REDUCE, "recursive_doubling",
          cost="lg p·α + n·lg p·β + n·lg p·γ (+ one local copy when lg p is odd)")
def all_reduce_rd(n: int, r: int, opts: Options) -> Program:
    """lg p rounds of exchanging the whole vector with r ^ 2^k and reducing.

    Round k reduces into a different buffer than the one it sends (scratch and output
    alternate), so the receive never waits for its own round's send to drain: with a
    rendezvous transport and in-place buffers, that wait would deadlock both partners."""
    f = Fold(n)
    k = opts.channels
    channels = []
    for c in range(k):
        x, o, s = inp(c), out(c), scr(c)
        steps: list[Step] = []
        if f.sits_out(r):
            steps += [ir.send(r + 1, x), ir.recv(r + 1, o)]
            channels.append(tuple(steps))
            continue
        v = f.virtual(r)
        assert v is not None
        rounds = f.p2.bit_length() - 1
        writes = rounds + f.folded_in(r)
        # buffers written in turn: end in the output; never start with the output when
        # the first write is a round's receive (in place, the output is what it sends)
        first_out = f.folded_in(r) and writes % 2 == 1
        bufs = [(o if (i % 2 == 0) == first_out else s) for i in range(writes)]
        cur = x
        if f.folded_in(r):
            steps.append(ir.recv_reduce_copy(r - 1, x, bufs[0]))
            cur = bufs[0]
        for i in range(rounds):
            partner = f.real(v ^ (1 << i))
            nxt = bufs[i + f.folded_in(r)]
            steps += [ir.send(partner, cur), ir.recv_reduce_copy(partner, cur, nxt)]
            cur = nxt
        if cur != o:
            steps.append(copy(cur, o))
        if f.folded_in(r):
            steps.append(ir.send(r - 1, o))
        channels.append(tuple(steps))
    return Program(Collective.ALL_REDUCE, "recursive_doubling", n, r, k, tuple(channels),
                   scratch=k)


@register(Collective.ALL_REDUCE, "rabenseifner",
          cost="2·lg p·α + 2(p−1)/p·n·β + (p−1)/p·n·γ; non-power-of-two: (2⌊lg p⌋ + 2)·α + (2(p'−1)/p' + 2)·n·β + (1 + (p'−1)/p')·n·γ")
def all_reduce_rabenseifner(n: int, r: int, opts: Options) -> Program:
    """Recursive-halving reduce-scatter of p' chunks, then recursive-doubling all-gather.

    A range of the virtual ranks' chunks is written as its start and size: at distance m
    a rank holds the aligned range of size 2m around its virtual rank v, keeps the half
    ``lo ^ (v & m)`` and gives the other (``lo ^ (v & m) ^ m``); gathering, the partner's
    range is ``lo ^ m`` and both make ``lo & ~m``. Written with XOR and AND only (no branch
    on the rank), so the generator also runs on a symbolic rank
    (:mod:`ringtree.sim.compile.xor_symbolic`)."""
    f = Fold(n)
    p2 = f.p2
    channels = []
    for c in range(opts.channels):
        base = c * p2

        def i_(lo, size: int, base: int = base) -> Ref:
            return inp(base + lo, size)

        def o_(lo, size: int, base: int = base) -> Ref:
            return out(base + lo, size)

        if f.sits_out(r):
            channels.append((ir.send(r + 1, i_(0, p2)), ir.recv(r + 1, o_(0, p2))))
            continue
        steps, written, v = f.enter(r, i_(0, p2), o_(0, p2))
        lo, mask = 0, p2 // 2
        while mask:                                   # reduce-scatter, distance halving
            partner, keep = f.real(v ^ mask), lo ^ (v & mask)
            src = o_ if written else i_
            steps.append(ir.send(partner, src(keep ^ mask, mask)))
            steps.append(ir.recv_reduce_copy(partner, src(keep, mask), o_(keep, mask)))
            lo, written, mask = keep, True, mask // 2
        if not written:                               # p = 1
            steps.append(copy(i_(0, p2), o_(0, p2)))
        mask = 1
        while mask < p2:                              # all-gather, distance doubling
            partner = f.real(v ^ mask)
            steps += [ir.send(partner, o_(lo, mask)), ir.recv(partner, o_(lo ^ mask, mask))]
            lo, mask = lo & ~mask, mask << 1
        if f.folded_in(r):
            steps.append(ir.send(r - 1, o_(0, p2)))
        channels.append(tuple(steps))
    return Program(Collective.ALL_REDUCE, "rabenseifner", n, r, p2 * opts.channels,
                   tuple(channels))


@register(Collective.ALL_GATHER, "recursive_doubling",
          cost="lg p·α + (p−1)/p·n·β (n = gathered bytes)")
def all_gather_rd(n: int, r: int, opts: Options) -> Program:
    """lg p rounds; in round k exchange the 2^k blocks gathered so far with r ^ 2^k."""
    f = Fold(n)
    steps: list[Step] = []
    if f.sits_out(r):
        steps += [copy(inp(0), out(r)), ir.send(r + 1, inp(0)), ir.recv(r + 1, out(0, n))]
        return Program(Collective.ALL_GATHER, "recursive_doubling", n, r, 1, (tuple(steps),))
    if f.folded_in(r):
        steps.append(ir.recv(r - 1, out(r - 1)))
    steps.append(copy(inp(0), out(r)))
    v = f.virtual(r)
    assert v is not None
    vlo, vhi, mask = v, v + 1, 1
    while mask < f.p2:
        partner = f.real(v ^ mask)
        theirs = (vlo - mask, vlo) if v & mask else (vhi, vhi + mask)
        steps.append(ir.send(partner, out(*f.blocks(vlo, vhi))))
        steps.append(ir.recv(partner, out(*f.blocks(*theirs))))
        vlo, vhi, mask = min(vlo, theirs[0]), max(vhi, theirs[1]), mask << 1
    if f.folded_in(r):
        steps.append(ir.send(r - 1, out(0, n)))
    return Program(Collective.ALL_GATHER, "recursive_doubling", n, r, 1, (tuple(steps),))


@register(Collective.REDUCE_SCATTER, "halving",
          cost="lg p·α + (p−1)/p·n·β + (p−1)/p·n·γ (n = input bytes)")
def reduce_scatter_halving(n: int, r: int, opts: Options) -> Program:
    """lg p rounds; in round k send the half of the blocks the partner r ^ 2^(lg p − 1 − k)
    keeps and reduce the half this rank keeps; working copy in scratch."""
    f = Fold(n)
    if f.sits_out(r):
        return Program(Collective.REDUCE_SCATTER, "halving", n, r, 1,
                       ((ir.send(r + 1, inp(0, n)), ir.recv(r + 1, out(0))),), scratch=n)
    steps, written, v = f.enter(r, inp(0, n), scr(0, n))
    vlo, vhi, mask = 0, f.p2, f.p2 // 2
    while mask:
        partner, vmid = f.real(v ^ mask), (vlo + vhi) // 2
        keep, give = ((vmid, vhi), (vlo, vmid)) if v & mask else ((vlo, vmid), (vmid, vhi))
        buf = scr if written else inp
        steps.append(ir.send(partner, buf(*f.blocks(*give))))
        kb = f.blocks(*keep)
        dst = out(0) if mask == 1 and kb == (r, 1) else scr(*kb)
        steps.append(ir.recv_reduce_copy(partner, buf(*kb), dst))
        (vlo, vhi), written, mask = keep, True, mask // 2
    if not written:                                   # p = 1
        steps.append(copy(inp(0), out(0)))
    if f.folded_in(r):
        steps += [copy(scr(r), out(0)), ir.send(r - 1, scr(r - 1))]
    return Program(Collective.REDUCE_SCATTER, "halving", n, r, 1, (tuple(steps),), scratch=n)
