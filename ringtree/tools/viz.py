"""Draw schedules: the step table (rank × step → primitive, peer, chunk) the way the ring
algorithm is taught on a whiteboard, and a rank/time diagram with an arrow per message.

Times come from a unit-cost replay of the Programs under the IR's matching rule: a step
starts when its channel's previous step has finished and its messages have arrived, and
takes one unit. That is the dependency depth the checker reports (the α term), not a
performance model; ``ringtree sim`` is the tool for that.
"""

from __future__ import annotations

import shutil
from collections import deque
from dataclasses import dataclass

from ringtree.ir.program import Collective, Program, Ref, Step

ABBREV = {
    "send": "S", "recv": "R", "copy": "C", "reduce": "+", "copySend": "CS",
    "reduceSend": "+S", "recvSend": "RS", "recvCopySend": "RCS", "recvReduceSend": "RRS",
    "recvReduceCopy": "RRC", "recvReduceCopySend": "RRCS",
}


def _span(ref: Ref) -> str:
    return f"{ref.index}" if ref.count == 1 else f"{ref.index}:{ref.index + ref.count}"


def region(step: Step) -> str:
    """The chunks a step reads and writes: ``i3``, ``o0:4``, ``io2`` (input 2 → output 2,
    NCCL's Input→Output), ``s1>o1`` (scratch 1 → output 1)."""
    src, dst = step.src, step.dst
    if src is None or dst is None:
        ref = src if src is not None else dst
        assert ref is not None
        return ref.buf.letter + _span(ref)
    if src == dst:
        return src.buf.letter + _span(src)
    if (src.buf.letter, dst.buf.letter) == ("i", "o") and (src.index, src.count) == (
            dst.index, dst.count):
        return src.buf.letter + dst.buf.letter + _span(src)
    return f"{src.buf.letter}{_span(src)}>{dst.buf.letter}{_span(dst)}"


def cell(step: Step, long: bool = False) -> str:
    """One table cell: primitive, peers (←from →to) and region, e.g. ``RRS ←3 →1 i2``."""
    bits = [step.name if long else ABBREV.get(step.name, step.name)]
    if step.recv_from:
        bits.append("←" + ",".join(map(str, step.recv_from)))
    if step.send_to:
        bits.append("→" + ",".join(map(str, step.send_to)))
    bits.append(region(step))
    return " ".join(bits)


@dataclass(frozen=True)
class Event:
    rank: int
    channel: int
    index: int          # position in the channel
    start: int
    step: Step


@dataclass(frozen=True)
class Message:
    src: int
    dst: int
    channel: int
    sent: int           # time the sending step finished
    received: int       # time the receiving step started
    ref: Ref


def timeline(programs: list[Program]) -> tuple[list[Event], list[Message]]:
    """Replay with unit-time steps; raise RuntimeError naming the stuck steps on deadlock."""
    n = len(programs)
    queues: dict[tuple[int, int, int], deque] = {}
    cursor = [[0] * len(p.channels) for p in programs]
    clock = [[0] * len(p.channels) for p in programs]
    events: list[Event] = []
    messages: list[Message] = []
    progress = True
    while progress:
        progress = False
        for r in range(n):
            for c, ch in enumerate(programs[r].channels):
                while cursor[r][c] < len(ch):
                    s = ch[cursor[r][c]]
                    if any(not queues.get((q, r, c)) for q in s.recv_from):
                        break
                    t = clock[r][c]
                    arrived = [queues[(q, r, c)].popleft() for q in s.recv_from]
                    t = max([t] + [a[0] for a in arrived])
                    for q, (sent, ref) in zip(s.recv_from, arrived):
                        messages.append(Message(q, r, c, sent, t, ref))
                    events.append(Event(r, c, cursor[r][c], t, s))
                    clock[r][c] = t + 1
                    for q in s.send_to:
                        queues.setdefault((r, q, c), deque()).append((t + 1, s.ref))
                    cursor[r][c] += 1
                    progress = True
    stuck = [(r, c) for r in range(n) for c in range(len(programs[r].channels))
             if cursor[r][c] < len(programs[r].channels[c])]
    if stuck:
        r, c = stuck[0]
        raise RuntimeError(f"schedule deadlocks: rank {r} channel {c} waits at "
                           f"'{programs[r].channels[c][cursor[r][c]]}'")
    return events, messages


def header(programs: list[Program]) -> str:
    p = programs[0]
    msgs = sum(len(s.send_to) for q in programs for ch in q.channels for s in ch)
    root = f" root={p.root}" if p.collective in (Collective.BROADCAST, Collective.REDUCE,
                                                 Collective.GATHER, Collective.SCATTER) else ""
    return (f"{p.algo} {p.collective.value}  n={p.nranks}{root}  chunks/block={p.chunks}  "
            f"channels={max(len(q.channels) for q in programs)}  "
            f"scratch={max(q.scratch for q in programs)}  messages={msgs}  "
            f"max steps/rank={max(q.steps for q in programs)}")


def step_table(programs: list[Program], long: bool = False, by_time: bool = False,
               width: int | None = None) -> str:
    """The schedule as text: one table per channel, a row per rank, a column per step
    (program order, or logical time with ``by_time``). Wide tables are cut into bands."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    starts: dict[tuple[int, int, int], int] = {}
    if by_time:
        events, _ = timeline(programs)
        starts = {(e.rank, e.channel, e.index): e.start for e in events}
    lines = [header(programs)]
    nch = max(len(p.channels) for p in programs)
    used: set[str] = set()
    for c in range(nch):
        rows: dict[int, dict[int, str]] = {}
        for p in programs:
            ch = p.channels[c] if c < len(p.channels) else ()
            for i, s in enumerate(ch):
                col = starts[(p.rank, c, i)] if by_time else i
                rows.setdefault(p.rank, {})[col] = cell(s, long)
                used.add(s.name)
        ncols = 1 + max((col for row in rows.values() for col in row), default=-1)
        if nch > 1:
            lines.append(f"-- channel {c}")
        if ncols == 0:
            lines.append("   (no steps)")
            continue
        colw = [max([len(f"{'t' if by_time else 'step'} {j}")]
                    + [len(row.get(j, "")) for row in rows.values()]) for j in range(ncols)]
        rankw = max(4, len(str(len(programs) - 1)))
        j0 = 0
        while j0 < ncols:                      # bands of columns that fit the width
            j1, w = j0, rankw + 1
            while j1 < ncols and (j1 == j0 or w + colw[j1] + 3 <= width):
                w += colw[j1] + 3
                j1 += 1
            label = "t" if by_time else "step"
            lines.append(f"{'rank':>{rankw}} | " + " | ".join(
                f"{label + ' ' + str(j):<{colw[j]}}" for j in range(j0, j1)))
            lines.append("-" * min(w, width))
            for p in programs:
                row = rows.get(p.rank, {})
                lines.append(f"{p.rank:>{rankw}} | " + " | ".join(
                    f"{row.get(j, ''):<{colw[j]}}" for j in range(j0, j1)).rstrip())
            j0 = j1
            if j0 < ncols:
                lines.append("")
    if not long:
        legend = ", ".join(f"{ABBREV[u]}={u}" for u in sorted(used, key=lambda u: ABBREV.get(u, u))
                           if u in ABBREV)
        lines.append(f"legend: {legend}; ←from →to; i/o/s = input/output/scratch chunk")
    return "\n".join(lines)


def draw_png(programs: list[Program], path: str) -> None:
    """Rank/time diagram: a box per step (colour = primitive), an arrow per message.
    Needs matplotlib (``pip install ringtree[plot]``); raises
    :class:`~ringtree.tools.figure.FigureUnavailable` otherwise."""
    from ringtree.tools.figure import pyplot

    plt = pyplot("drawing")
    events, messages = timeline(programs)
    n = len(programs)
    nch = max(len(p.channels) for p in programs)
    tmax = max((e.start + 1 for e in events), default=1)
    names = sorted({e.step.name for e in events})
    cmap = plt.get_cmap("tab10")
    color = {nm: cmap(i % 10) for i, nm in enumerate(names)}
    fig, ax = plt.subplots(figsize=(min(6 + 0.6 * tmax, 40), min(1.5 + 0.45 * n * nch, 40)))

    def y(rank: int, channel: int) -> float:
        return rank + (channel + 0.5) / nch - 0.5

    h = 0.8 / nch
    for r in range(0, n, 2):                   # shade every other rank's band
        ax.axhspan(r - 0.5, r + 0.5, color="0.93", zorder=0)
    for e in events:
        ax.add_patch(plt.Rectangle((e.start + 0.1, y(e.rank, e.channel) - h / 2), 0.8, h,
                                   color=color[e.step.name], alpha=0.8))
        if tmax <= 40 and n * nch <= 32:
            ax.text(e.start + 0.5, y(e.rank, e.channel), region(e.step), ha="center",
                    va="center", fontsize=6)
    for m in messages:
        ax.annotate("", xy=(m.received + 0.1, y(m.dst, m.channel)),
                    xytext=(m.sent - 0.1, y(m.src, m.channel)),
                    arrowprops={"arrowstyle": "->", "lw": 0.6, "alpha": 0.6})
    ax.set_xlim(0, tmax)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_ylabel("rank")
    ax.set_xlabel("logical time (unit steps)")
    ax.set_title(header(programs), fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[nm]) for nm in names]
    if nch > 1:
        names = names + [f"rows per rank: channel 0..{nch - 1}, top to bottom"]
        handles.append(plt.Rectangle((0, 0), 1, 1, color="white"))
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)




def cost_of(collective: Collective, algo: str) -> str:
    """The α-β-γ cost line of (collective, algo): what it was registered with
    (``@register(..., cost=...)``); '' if none."""
    from ringtree.schedules import registry

    return registry.cost(collective, algo)
