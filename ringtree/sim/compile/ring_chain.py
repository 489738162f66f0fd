"""A ring all-reduce whose data fit in channel 0's blocks, one element each: its run as
block chains, without generating a Program (:mod:`ringtree.sim.engines.ring_chain`
evaluates it).

The ring all-reduce (:func:`ringtree.schedules.ring.all_reduce`) gives rank r, on each
channel, 2n − 1 steps; step s handles channel block (r − 1 − s) mod n, sends it to r + 1
(s ≤ 2n − 3) and receives it from r − 1 (s ≥ 1): a send, n − 2 recvReduceSends, a
recvReduceCopySend, n − 2 recvCopySends and a recv. Block b therefore travels one chain,
rank b + 1 + k doing its step k for k = 0 … 2n − 2, and the message of step k is the one
step k + 1 of the next rank receives. With ``count`` ≤ n elements cut into n · channels
chunks (the larger first, :func:`ringtree.ir.program.split_even`), block b of channel 0
holds one element for b < count and every other chunk none: only ``count`` chains move
data, one ``itemsize``-byte message per hop, and every other step is empty.

The ring's steps have no memory dependencies (checked here on a compiled three-rank
instance, which also gives each kind of step's reduce/copy passes as the compiler counts
them, :func:`~ringtree.sim.compile.compiled.passes`), so every step is issued at time 0
and a chain is delayed only by its own messages and, through the FIFOs, by the message
before it on the same connection. ``tests/test_sim_ring_chain.py`` compares the
evaluation with the reference engine bit for bit where both run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ringtree.ir.program import Collective
from ringtree.schedules import Options, generate
from ringtree.schedules import ring as ring_schedules
from ringtree.schedules.registry import generator

__all__ = ["RingChain", "ring_chain", "KINDS"]

# the kinds of a rank's steps, in order: step 0, 1 … n−2, n−1, n … 2n−3, 2n−2
KINDS = ("send", "recv_reduce_send", "recv_reduce_copy_send", "recv_copy_send", "recv")


@dataclass(frozen=True)
class RingChain:
    """The run in chains: n ranks, ``count`` moving blocks of ``nbytes`` each, and the
    reduce/copy passes of every kind of step (:data:`KINDS`)."""

    n: int
    count: int
    nbytes: int
    ops: tuple[int, int, int, int, int]

    def kind(self, s: int) -> int:
        """The kind (index into :data:`KINDS`) of a rank's step s."""
        n = self.n
        if s == 0:
            return 0
        if s < n - 1:
            return 1
        if s == n - 1:
            return 2
        return 3 if s < 2 * n - 2 else 4

    @property
    def messages(self) -> int:
        """Messages carried: one per moving block per hop."""
        return self.count * (2 * self.n - 2)


def ring_chain(coll: Collective, algo: str, n: int, opts: Options, count: int,
               itemsize: int, slice_bytes: int, in_place: bool) -> RingChain | None:
    """The chains of this run, or None when it is not a ring all-reduce of at most one
    element per channel-0 block and one slice per message."""
    if coll is not Collective.ALL_REDUCE or algo != "ring" or n < 3 or opts.channels < 1:
        return None
    if generator(coll, algo) is not ring_schedules.all_reduce:
        return None                              # another generator under the name
    if not 1 <= count <= n or itemsize > slice_bytes or itemsize < 1:
        return None
    ops = _kinds(in_place)
    return None if ops is None else RingChain(n, count, itemsize, ops)


@lru_cache(maxsize=2)
def _kinds(in_place: bool) -> tuple[int, int, int, int, int] | None:
    """The passes of each kind of step, read off the compiled Programs of a three-rank
    ring with one element per block (None if a step there has a memory dependency or
    not the shape of the module's docstring)."""
    from ringtree.sim.compile.compiled import compile_programs

    opts = Options(channels=1)
    progs = [generate(Collective.ALL_REDUCE, "ring", 3, r, opts) for r in range(3)]
    cp = compile_programs(progs, 3, 4, 1 << 20, in_place, prune=False)
    mine = [s for s in range(cp.nsteps) if cp.step_rank[s] == 0]
    if len(mine) != 5 or any(cp.step_deps[s] for s in range(cp.nsteps)):
        return None
    sends = [bool(cp.step_send[s]) for s in mine]
    recvs = [bool(cp.step_recv[s]) for s in mine]
    if sends != [True] * 4 + [False] or recvs != [False] + [True] * 4:
        return None
    o = [cp.step_ops[s] for s in mine]
    return o[0], o[1], o[2], o[3], o[4]
