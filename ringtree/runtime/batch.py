"""What the executor keeps per submission: batches, probes and the steps in flight.

A :class:`Batch` is the calls submitted together (one call, or a ``group()``); it
completes when all their steps have, and carries the memory-order rule between calls: the
byte ranges its calls read and write, and the earlier batches it must wait for. A
:class:`Probe` is a receive from any source waiting for a message. An :class:`Issued` is
one step on its way through the executor, from the channel queue to completion, and a
:class:`Waiting` is what the executor reports it blocked on (for the flight recorder, the
doctor and timeout messages).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ringtree.runtime.plan import Call, CStep


class Batch:
    """Calls submitted together; complete when all their steps are."""

    __slots__ = ("calls", "deadline", "timeout", "on_done", "remaining", "done", "error",
                 "reads", "writes", "after", "probe")

    def __init__(self, calls: list[Call], deadline: float, timeout: float,
                 on_done: Callable[[Batch], None] | None):
        self.calls, self.deadline, self.timeout, self.on_done = calls, deadline, timeout, on_done
        self.remaining = 0
        self.done = False
        self.error: BaseException | None = None
        self.reads: list[tuple[int, int]] = []   # byte ranges of its calls' buffers
        self.writes: list[tuple[int, int]] = []
        self.after: list[Batch] = []             # earlier batches it must wait for
        self.probe: Probe | None = None          # set for a receive from any source

    def conflicts(self, later: Batch) -> bool:
        """Must ``later`` wait for this batch (its memory is written by either)?"""
        return conflict(self.reads, self.writes, later.reads, later.writes)

    def touch(self, a: np.ndarray | None, writes: bool) -> None:
        """Add ``a``'s bytes to what the batch reads (or writes)."""
        span = byte_span(a)
        if span is not None:
            (self.writes if writes else self.reads).append(span)


class Probe:
    """A receive from any source waiting for a message (see :meth:`Executor.probe`)."""

    __slots__ = ("channel", "peers", "test", "batch", "peer")

    def __init__(self, channel: int, peers: list[int], test: Callable[[int, int], bool],
                 batch: Batch):
        self.channel, self.peers, self.test, self.batch = channel, peers, test, batch
        self.peer: int | None = None


class Pending(Protocol):
    """What a step waits on: a transport's :class:`~ringtree.transports.base.Request`,
    or its turn to send (:class:`ringtree.runtime.step.Turn`)."""

    done: bool
    peer: int
    is_send: bool
    header: bytes
    pos: int
    error: BaseException | None


@dataclass(slots=True, eq=False)
class Issued:
    """One step of a call: queued on its channel, then running as ``gen`` (the step's
    generator), which last yielded ``awaited`` (a request or a send turn)."""

    cs: CStep
    call: Call
    batch: Batch
    gen: Generator[Pending, None, None] | None = None
    awaited: Pending | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """A running step and the request it waits on (None: it can move): one line of
    :meth:`Executor.snapshot`."""

    req: Pending | None
    cs: CStep
    call: Call


def byte_span(a: np.ndarray | None) -> tuple[int, int] | None:
    """The byte range ``[start, end)`` of ``a``'s memory (None if empty)."""
    if a is None or a.nbytes == 0:
        return None
    start = a.__array_interface__["data"][0]
    return (start, start + a.nbytes)


def conflict(reads_a: list[tuple[int, int]], writes_a: list[tuple[int, int]],
             reads_b: list[tuple[int, int]], writes_b: list[tuple[int, int]]) -> bool:
    """Do two uses of memory (byte ranges read, written) overlap where either writes?
    The memory-order rule of batches in flight and of collectives in one group."""
    return _overlap(writes_a, writes_b) or _overlap(writes_a, reads_b) \
        or _overlap(reads_a, writes_b)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)
