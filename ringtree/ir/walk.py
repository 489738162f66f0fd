"""Running Programs on paper: every rank's steps under the IR's matching rule, with
unbounded buffering. The checker, the tuner's statistics, the online choice's proof and
the tests' small executors are all this walk with a different step function."""

from __future__ import annotations

from collections import deque

from ringtree.ir.program import Step


def walk(programs, run, deps: dict[int, list[tuple[int, ...]]] | None = None
         ) -> tuple[list[tuple[int, int, Step]], dict]:
    """Execute Programs under the IR's matching rule with unbounded buffering: a step runs
    once a message from each of its ``recv_from`` peers is queued on its channel; it is
    called as ``run(rank, channel, index, step, received)`` with those messages (in
    ``recv_from`` order) and returns the message it sends to each of ``send_to``.

    ``deps`` (rank → :meth:`Program.memory_deps`): those ranks' steps also wait for the
    earlier steps, of any channel, that touch the same memory, as the executor makes
    them; the checker passes them for Programs whose channels share memory in a declared
    order (``meta["ordered_channels"]``, :func:`ordered_deps`).

    Returns the steps that never ran (rank, channel, step) — a cyclic wait — and the
    queues of messages nobody received. The checker, the tuner's stats and the tests'
    small executors are all this walk with a different ``run``.
    """
    queues: dict[tuple[int, int, int], deque] = {}
    cursor = [[0] * len(p.channels) for p in programs]
    deps = deps or {}
    first = {r: [sum(len(ch) for ch in programs[r].channels[:c])
                 for c in range(len(programs[r].channels))] for r in deps}
    ran = {r: [False] * programs[r].steps for r in deps}
    progress = True
    while progress:
        progress = False
        for r, p in enumerate(programs):
            waits = deps.get(r)
            for c, ch in enumerate(p.channels):
                while cursor[r][c] < len(ch):
                    i = cursor[r][c]
                    s = ch[i]
                    if any(not queues.get((q, r, c)) for q in s.recv_from):
                        break
                    if waits is not None and not all(ran[r][d] for d in waits[first[r][c] + i]):
                        break
                    got = [queues[(q, r, c)].popleft() for q in s.recv_from]
                    msg = run(r, c, i, s, got)
                    for q in s.send_to:
                        queues.setdefault((r, q, c), deque()).append(msg)
                    cursor[r][c] += 1
                    if waits is not None:
                        ran[r][first[r][c] + i] = True
                    progress = True
    stuck = [(r, c, p.channels[c][cursor[r][c]]) for r, p in enumerate(programs)
             for c in range(len(p.channels)) if cursor[r][c] < len(p.channels[c])]
    return stuck, {k: q for k, q in queues.items() if q}


def ordered_deps(programs, in_place: bool) -> dict[int, list[tuple[int, ...]]]:
    """:meth:`Program.memory_deps` of the Programs whose channels share memory in the
    order the channels are numbered (``meta["ordered_channels"]``: an imported MSCCL
    algorithm whose dependencies between channels all go from a lower channel to a
    higher one), for :func:`walk`."""
    return {r: p.memory_deps(in_place) for r, p in enumerate(programs)
            if p.meta.get("ordered_channels")}
