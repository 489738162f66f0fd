"""An MSCCL-IR algorithm as ringtree Programs: the same steps, in an order that keeps what
MSCCL's explicit dependencies keep.

The two models differ in their unit of concurrency:

- MSCCL: a GPU runs many *thread blocks* at once; each runs its steps strictly in order,
  talks to at most one send and one receive peer over one NCCL channel, and is ordered
  against the other blocks only by explicit dependencies (``depid``/``deps``, waits for
  a completion flag that a step with ``hasdep="1"`` publishes; ``nop`` steps carry extra
  ones). A connection (sender, receiver, channel) carries one block's messages in order.
- ringtree: a rank runs one step list per *channel*; messages between (sender,
  receiver, channel) match in program order; a step waits only for earlier steps that
  touch the same memory (the executor's rule, :meth:`~ringtree.ir.program.Program.memory_deps`),
  and the channels of a rank may not touch each other's memory.

The import runs the file once on an interpreter with MSCCL's rules (:func:`schedule`:
every block in order, dependencies and flags as the kernel checks them, a FIFO per
connection, unbounded buffering as the checker assumes) and lists each rank's steps of
each MSCCL channel in the order they completed there. That list is a ringtree channel:
its messages to each peer are in the order the one block that owns that connection sent
them, every dependency is satisfied by an earlier entry, and the checker's walk can
replay it. Memory dependencies then order every pair of steps that touch the same chunk
in the order MSCCL's dependencies gave them, which is all MSCCL's dependencies are for
(msccl-tools derives them from the chunks each step reads and writes). ``nop`` steps
vanish with the dependencies they carried. Where dependencies join two MSCCL channels,
those channels share memory: the executor orders such steps in the order it numbers
them, channel by channel, so when every such dependency goes from a lower channel to a
higher one the Programs keep MSCCL's channels and say so (``ordered_channels``: the
checker then lets their channels share memory and walks them in that order, as the
executor runs them); otherwise all of a GPU's blocks are merged into one channel
(:func:`to_programs` with ``merged``), which is still exact as long as the interpreter,
with one FIFO per pair of GPUs, does not deadlock.

One difference stays: a send in MSCCL blocks when the receiver's 8 slots are full, a
ringtree send never does. A file that needs more than that in flight runs here and would
hang on a GPU; the interpreter reports the most messages it ever saw queued on one
connection (:attr:`Schedule.max_in_flight`) so that is visible.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ringtree.ir.program import Buf, Program, Ref, Step
from ringtree.msccl.model import STEP_TYPES, Algorithm, MStep, ThreadBlock

_BUF = {"i": Buf.INPUT, "o": Buf.OUTPUT, "s": Buf.SCRATCH}


class MscclImportError(ValueError):
    """The file cannot become ringtree Programs (it deadlocks, or uses what ringtree
    does not run); the message names the file, GPU, block and step."""


@dataclass
class Schedule:
    """The order in which the interpreter completed each GPU's steps:
    ``order[g]`` lists (block id, step position)."""

    order: list[list[tuple[int, int]]]
    max_in_flight: int


def schedule(algo: Algorithm, merged: bool = False) -> Schedule:
    """Run ``algo`` with MSCCL's rules (see the module docstring). ``merged``: one FIFO
    per pair of GPUs instead of one per channel. Raises :class:`MscclImportError` naming
    the steps that wait forever."""
    gpus = algo.gpus
    pc = [[0] * len(g.tbs) for g in gpus]
    published = [[0] * len(g.tbs) for g in gpus]  # 1 + highest published position
    queues: dict[tuple[int, int, int], deque] = {}
    order: list[list[tuple[int, int]]] = [[] for _ in gpus]
    most = 0
    progress = True
    while progress:
        progress = False
        for g, gpu in enumerate(gpus):
            for t, tb in enumerate(gpu.tbs):
                while pc[g][t] < len(tb.steps):
                    st = tb.steps[pc[g][t]]
                    if not _ready(st, tb, g, published[g], queues, merged):
                        break
                    most = max(most, _fire(st, tb, g, queues, merged))
                    if st.hasdep:
                        published[g][t] = st.s + 1
                    pc[g][t] += 1
                    order[g].append((tb.id, st.s))
                    progress = True
    stuck = [(g, t, pc[g][t]) for g, gpu in enumerate(gpus) for t, tb in enumerate(gpu.tbs)
             if pc[g][t] < len(tb.steps)]
    if stuck:
        raise MscclImportError("the algorithm deadlocks: " + _why(algo, pc, published,
                                                                  merged, stuck[0][:2]))
    return Schedule(order, most)


def _why(algo: Algorithm, pc, published, merged: bool, start: tuple[int, int]) -> str:
    """What the blocked step of block ``start`` waits for, followed from block to block
    until a block that will never act (a receive with no send) or a cycle of waits."""
    gpus = algo.gpus
    seen: list[tuple[int, int]] = []
    said: list[str] = []
    g, t = start
    while (g, t) not in seen:
        seen.append((g, t))
        tb = gpus[g].tbs[t]
        st = tb.steps[pc[g][t]]
        here = f"gpu {g} tb {tb.id} step {st.s} ({st.type})"
        if st.depid >= 0 and published[g][st.depid] <= st.deps:
            said.append(f"{here} waits for tb {st.depid} step {st.deps}")
            g, t = g, st.depid
            continue
        q, key = tb.recv, _key(tb, merged)
        senders = [u for u, b in enumerate(gpus[q].tbs) if b.send == g and _key(b, merged) == key
                   and any(STEP_TYPES[x.type][2] for x in b.steps[pc[q][u]:])]
        if not senders:
            return (f"{here} receives from GPU {q} on channel {key}, which sends it nothing "
                    "more: a receive with no send")
        said.append(f"{here} waits for a message from gpu {q} tb {senders[0]}")
        g, t = q, senders[0]
    cycle = said[seen.index((g, t)):]
    kind = "a dependency cycle" if all(" message " not in x for x in cycle) else \
        "a cycle of waits"
    return f"{kind}: " + "; ".join(cycle)


def _key(tb: ThreadBlock, merged: bool) -> int:
    return 0 if merged else tb.chan


def _ready(st: MStep, tb: ThreadBlock, g: int, published: list[int], queues,
           merged: bool) -> bool:
    if st.depid >= 0 and published[st.depid] <= st.deps:
        return False
    if STEP_TYPES[st.type][3]:
        q = queues.get((tb.recv, g, _key(tb, merged)))
        return bool(q)
    return True


def _fire(st: MStep, tb: ThreadBlock, g: int, queues, merged: bool) -> int:
    """Take the step's message, queue the one it sends; the new queue's length."""
    reads, writes, sends, recvs = STEP_TYPES[st.type]
    if recvs:
        queues[(tb.recv, g, _key(tb, merged))].popleft()
    if sends:
        q = queues.setdefault((g, tb.send, _key(tb, merged)), deque())
        q.append(st)
        return len(q)
    return 0


def step_of(st: MStep, tb: ThreadBlock) -> Step | None:
    """The ringtree Step of an MSCCL step (None for ``nop``)."""
    if st.type == "nop":
        return None
    if st.type == "ra":
        raise MscclImportError("type 'ra' (residual add) has no ringtree step")
    reads, writes, sends, recvs = STEP_TYPES[st.type]
    src = Ref(_BUF[st.srcbuf], st.srcoff, st.cnt) if reads else None
    dst = Ref(_BUF[st.dstbuf], st.dstoff, st.cnt) if writes else None
    reduce = st.type in ("rrs", "rrc", "rrcs", "re")
    return Step(src=src, dst=dst, recv_from=(tb.recv,) if recvs else (),
                send_to=(tb.send,) if sends else (), reduce=reduce)


def channel_edges(algo: Algorithm) -> set[tuple[int, int]]:
    """(waited-for channel, waiting channel) of every dependency that joins blocks of two
    MSCCL channels on one GPU."""
    edges = set()
    for g in algo.gpus:
        chan = {tb.id: tb.chan for tb in g.tbs}
        edges |= {(chan[st.depid], tb.chan) for tb in g.tbs for st in tb.steps
                  if st.depid >= 0 and chan[st.depid] != tb.chan}
    return edges


def to_programs(algo: Algorithm, name: str, merged: bool | None = None) -> list[Program]:
    """Every GPU's Program. Dependencies between channels that all go from a lower
    channel to a higher one are kept by the executor's memory order, which numbers steps
    channel by channel (``meta["ordered_channels"]``); otherwise (``merged``) all of a
    GPU's blocks go into one channel."""
    edges = channel_edges(algo)
    back = sorted((a, b) for a, b in edges if a > b)
    if merged is None:
        merged = bool(back)
    try:
        sched = schedule(algo, merged)
    except MscclImportError as e:
        if not back:
            raise
        raise MscclImportError(
            f"dependencies go from channel {back[0][0]} to channel {back[0][1]} and back, "
            "which ringtree's channels cannot order; with all of a GPU's blocks in one "
            f"channel (one message order per pair of GPUs) {e}") from None
    coll, n = algo.collective, algo.ngpus
    in_blocks, out_blocks = coll.blocks(n)
    blocks = max(in_blocks, out_blocks, 1)
    if algo.nchunksperloop % blocks:
        raise MscclImportError(f"nchunksperloop={algo.nchunksperloop} is not a multiple of the "
                           f"{blocks} blocks of {coll.value} on {n} GPUs")
    chunks = algo.nchunksperloop // blocks
    nchan = 1 if merged else algo.nchannels
    programs = []
    for g, gpu in enumerate(algo.gpus):
        tbs = {tb.id: tb for tb in gpu.tbs}
        chans: list[list[Step]] = [[] for _ in range(nchan)]
        origin: list[list[tuple[int, int]]] = [[] for _ in range(nchan)]
        for t, s in sched.order[g]:
            tb = tbs[t]
            step = step_of(tb.steps[s], tb)
            if step is not None:
                chans[0 if merged else tb.chan].append(step)
                origin[0 if merged else tb.chan].append((t, s))
        programs.append(Program(coll, name, n, g, chunks, tuple(tuple(c) for c in chans),
                                scratch=gpu.s_chunks, in_place_ok=algo.inplace,
                                meta={"msccl": algo.name, "proto": algo.proto,
                                      "equal_chunks": True,
                                      "ordered_channels": bool(edges) and not merged,
                                      "in_place_only": not (algo.outofplace or
                                                            algo.outofplace is None and
                                                            not algo.inplace),
                                      "max_in_flight": sched.max_in_flight,
                                      "msccl_steps": origin}))  # (tb, s) of each step
    return programs
