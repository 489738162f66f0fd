"""ringtree Programs as an MSCCL-IR algorithm (out of place), for MSCCL's executors.

A ringtree step may receive from several peers, reduce, store and send to several peers;
an MSCCL step does one of the executors' ten things in a thread block that has at most
one send and one receive peer. So each step becomes a short sequence of MSCCL steps, each
in the thread block of its role on the step's channel (one block per send peer, one per
receive peer, one for local copies and reductions; the channel is the ringtree channel,
so every connection keeps ringtree's message order):

- receives: ``r`` for the first (``rrc`` when the step has a source to reduce into),
  ``rrc`` for each further one, in ``recv_from`` order (ringtree's reduction order);
  a value that the step sends but does not store goes through a scratch chunk;
- local work: ``cpy``, or ``re`` for a local reduction (``dst ⊕= src``);
- sends: one ``s`` per peer, of the stored value (or of the source).

Each MSCCL step then waits for the latest earlier step of every other block that touches
the same chunk (read after write, write after read or write): the executor's memory rule,
which is also how msccl-tools derives dependencies. A step carries one dependency; the
others are ``nop`` steps before it, and every step waited for publishes its completion.

A Program that talks to a switch (CollNet) or a collective without buffers (barrier)
cannot be written; rooted collectives are written for their root, since MSCCL-IR carries
none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringtree.ir.program import Buf, Conflicts, Program, Ref, Step
from ringtree.msccl.model import EXECUTOR_NAMES, Algorithm, Gpu, MStep, ThreadBlock

_LETTER = {Buf.INPUT: "i", Buf.OUTPUT: "o", Buf.SCRATCH: "s"}


class ExportError(ValueError):
    """A Program MSCCL-IR cannot express (the message says what and why)."""


@dataclass
class _Op:
    """One MSCCL step before blocks and dependencies are laid out."""

    block: tuple[str, int, int]        # (role, peer, channel)
    type: str
    src: Ref | None
    dst: Ref | None
    position: int = -1                 # in its block, counting nops
    deps: list[int] = field(default_factory=list)


def _slots(ref: Ref | None) -> set[tuple[Buf, int]]:
    return set() if ref is None else {(ref.buf, j) for j in ref.chunks()}


class _Gpu:
    """One rank's steps as MSCCL steps in blocks, with their dependencies."""

    def __init__(self, p: Program) -> None:
        self.p = p
        self.ops: list[_Op] = []
        self.scratch = p.scratch

    def temp(self, count: int) -> Ref:
        ref = Ref(Buf.SCRATCH, self.scratch, count)
        self.scratch += count
        return ref

    def add(self, block, type_: str, src: Ref | None, dst: Ref | None) -> None:
        self.ops.append(_Op(block, type_, src, dst))

    def step(self, c: int, s: Step) -> None:
        value = s.src
        if s.recv_from:
            into = s.dst if s.dst is not None else self.temp(s.ref.count)
            for k, q in enumerate(s.recv_from):
                if k == 0 and value is None:
                    self.add(("recv", q, c), "r", None, into)
                else:
                    self.add(("recv", q, c), "rrc", value, into)
                value = into
        elif s.dst is not None:
            self.add(("local", -1, c), "re" if s.reduce else "cpy", s.src, s.dst)
            value = s.dst
        for p in s.send_to:
            self.add(("send", p, c), "s", value, None)

    def dependencies(self) -> None:
        """Each op waits for the earlier ops of other blocks touching its chunks."""
        touch = Conflicts().touch
        for i, op in enumerate(self.ops):
            reads = _slots(op.src) | (_slots(op.dst) if op.type == "re" else set())
            need = touch(i, reads, _slots(op.dst))
            latest: dict = {}
            for d in need:
                if self.ops[d].block != op.block:
                    latest[self.ops[d].block] = max(latest.get(self.ops[d].block, -1), d)
            op.deps = sorted(latest.values())

    def blocks(self) -> list[ThreadBlock]:
        order: dict[tuple, int] = {}
        for op in self.ops:
            order.setdefault(op.block, len(order))
        members: dict[tuple, list[int]] = {b: [] for b in order}
        length = dict.fromkeys(order, 0)
        published: set[int] = {d for op in self.ops for d in op.deps}
        for i, op in enumerate(self.ops):  # positions first: the nops before a step count
            length[op.block] += max(0, len(op.deps) - 1)
            op.position = length[op.block]
            length[op.block] += 1
            members[op.block].append(i)
        out = []
        for b, tb_id in order.items():
            role, peer, chan = b
            mine: list[MStep] = []
            for entry in members[b]:
                op = self.ops[entry]
                for d in op.deps[:-1]:  # the extra dependencies, one nop each
                    t = self.ops[d]
                    mine.append(MStep(len(mine), "nop", "i", -1, "o", -1, 0,
                                      order[t.block], t.position, 0))
                dep = self.ops[op.deps[-1]] if op.deps else None
                mine.append(MStep(
                    len(mine), op.type, _letter(op.src), _off(op.src), _letter(op.dst),
                    _off(op.dst), _count(op), order[dep.block] if dep else -1,
                    dep.position if dep else -1, int(entry in published)))
            out.append(ThreadBlock(tb_id, peer if role == "send" else -1,
                                   peer if role == "recv" else -1, chan, tuple(mine)))
        return out


def _letter(ref: Ref | None) -> str:
    return "i" if ref is None else _LETTER[ref.buf]


def _off(ref: Ref | None) -> int:
    return -1 if ref is None else ref.index


def _count(op: _Op) -> int:
    ref = op.dst if op.dst is not None else op.src
    return 0 if ref is None else ref.count


def from_programs(programs: list[Program], name: str, proto: str = "Simple") -> Algorithm:
    """The MSCCL-IR algorithm of one Program per rank, out of place."""
    p0 = programs[0]
    coll, n = p0.collective, p0.nranks
    if coll not in EXECUTOR_NAMES:
        raise ExportError(f"{coll.value} has no MSCCL-IR collective (it moves no buffer)")
    if p0.meta.get("virtual_programs") or len(programs) != n:
        raise ExportError(f"{p0.algo} {coll.value} runs on an in-network switch, which "
                          "MSCCL-IR cannot name")
    gpus = []
    for p in programs:
        g = _Gpu(p)
        for c, ch in enumerate(p.channels):
            for s in ch:
                g.step(c, s)
        g.dependencies()
        gpus.append(Gpu(p.rank, p.buffer_chunks(Buf.INPUT), p.buffer_chunks(Buf.OUTPUT),
                        g.scratch, tuple(g.blocks())))
    blocks = max(*coll.blocks(n), 1)
    return Algorithm(name, proto, max(len(p.channels) for p in programs), blocks * p0.chunks,
                     n, EXECUTOR_NAMES[coll], False, True, 0, 0, tuple(gpus))
