"""Bruck's log-step algorithms (Bruck, Ho, Kipnis, Upfal & Weathersby, *Efficient
algorithms for all-to-all communications in multiport message-passing systems*, IEEE TPDS
8(11), 1997; MPICH ``allgather_intra_brucks.c`` and ``alltoall_intra_brucks.c``).

- all-gather, ``bruck``: in round k (distance d = 2^k) every rank sends the first
  min(d, p − d) blocks it holds, counted from its own, to r − d and receives as many from
  r + d. Bruck keeps the blocks rotated in a temporary buffer and rotates at the end; here
  the blocks land straight in their place in the output, so a round whose range wraps
  past block p − 1 sends two messages instead of one, and there is no final copy.
  Cost: ⌈lg p⌉·α + (p−1)/p·n·β (n = gathered bytes), any p.
- all-to-all, ``bruck``: rotate the input by r (scratch), then in round k send every
  block whose position has bit k set to r + 2^k (packed into one message with local
  copies), receive the same positions from r − 2^k, and finally un-rotate into the output.
  Cost: ⌈lg p⌉·α + (n/2)·⌈lg p⌉·β + local copies (n = bytes each rank sends); the
  latency-optimal all-to-all for small blocks.

Both move ranges of blocks, so they use one channel.
"""

from __future__ import annotations

from ringtree.ir import program as ir
from ringtree.ir.program import Collective, Program, Ref, Step, copy, inp, out, scr
from ringtree.schedules.registry import Options, register


def _wrap(n: int, start: int, count: int) -> list[tuple[int, int]]:
    """Blocks start, start+1, …, start+count−1 (mod n) as at most two (index, count) runs."""
    first = min(count, n - start)
    runs = [(start, first)]
    if count > first:
        runs.append((0, count - first))
    return runs


@register(Collective.ALL_GATHER, "bruck", cost="⌈lg p⌉·α + (p−1)/p·n·β (n = gathered bytes), any p")
def all_gather(n: int, r: int, opts: Options) -> Program:
    """Round k: send blocks r … r+m−1 to r − 2^k, receive r+2^k … r+2^k+m−1 from r + 2^k."""
    steps: list[Step] = [copy(inp(0), out(r))]
    dist = 1
    while dist < n:
        m = min(dist, n - dist)
        steps += [ir.send((r - dist) % n, out(i, c)) for i, c in _wrap(n, r, m)]
        steps += [ir.recv((r + dist) % n, out(i, c)) for i, c in _wrap(n, (r + dist) % n, m)]
        dist *= 2
    return Program(Collective.ALL_GATHER, "bruck", n, r, 1, (tuple(steps),))


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted positions as maximal (start, length) runs."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


@register(Collective.ALL_TO_ALL, "bruck",
          cost="⌈lg p⌉·α + (n/2)·⌈lg p⌉·β + local copies (n = bytes each rank sends)")
def all_to_all(n: int, r: int, opts: Options) -> Program:
    """Scratch: positions T[0:n], then a send pack S and a receive pack R."""
    rounds = []
    dist = 1
    while dist < n:
        rounds.append((dist, _runs([i for i in range(n) if i & dist])))
        dist *= 2
    half = max((sum(c for _, c in runs) for _, runs in rounds), default=0)
    S, R = n, n + half

    def T(i: int, c: int = 1) -> Ref:
        return scr(i, c)

    # T[i] = input block (r + i) mod n: what this rank sends to r + i.
    steps: list[Step] = [copy(inp(r, n - r), T(0, n - r))]
    if r:
        steps.append(copy(inp(0, r), T(n - r, r)))
    for dist, runs in rounds:
        m = sum(c for _, c in runs)
        if len(runs) == 1:      # already contiguous: send in place, no packing
            steps.append(ir.send((r + dist) % n, T(runs[0][0], m)))
        else:
            off = 0
            for a, c in runs:
                steps.append(copy(T(a, c), scr(S + off, c)))
                off += c
            steps.append(ir.send((r + dist) % n, scr(S, m)))
        # never receive into what this round sends: the receive would wait for the send
        # to drain, which (rendezvous, everybody doing the same) never happens
        steps.append(ir.recv((r - dist) % n, scr(R, m)))
        off = 0
        for a, c in runs:
            steps.append(copy(scr(R + off, c), T(a, c)))
            off += c
    # T[i] now holds what rank r − i sent to r.
    steps += [copy(T(i), out((r - i) % n)) for i in range(n)]
    return Program(Collective.ALL_TO_ALL, "bruck", n, r, 1, (tuple(steps),),
                   scratch=n + 2 * half)
