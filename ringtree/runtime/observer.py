"""What the executor tells whoever watches it: the profiler's interface to the core.

The executor reports to one :class:`Observer` (``Executor.observer``), the no-op one
below unless a profiler is attached (:class:`ringtree.prof.recorder.ProfileObserver`),
in the spirit of NCCL's profiler plugin: the core calls hooks, the plugin decides what to
keep. Hooks that fire per batch are always called (a no-op costs one call per batch);
hooks inside a step go through a :class:`StepWatch` that :meth:`Observer.step` returns
only while ``active``, so a step that nobody watches tests one attribute and pays nothing
per slice.

Times are ``clock()`` values (nanoseconds), taken by the executor where the event starts
and handed to the hook that ends it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ringtree.transports.base import Request


class StepWatch:
    """One step's events (returned by :meth:`Observer.step`, per issued step)."""

    __slots__ = ()

    def recv_waited(self, t0: int, j: int, k: int, req: Request, nbytes: int) -> None:
        """Slice ``k`` of receive ``j`` arrived; the step had needed it since ``t0``."""

    def combined(self, t0: int, nbytes: int) -> None:
        """A slice's value was computed (reduced, if the step reduces) since ``t0``."""

    def draining(self, sends: list[Request]) -> int:
        """The step waits for its sends now: the start time to pass to :meth:`finished`
        (0: they are done already, there is no wait)."""
        return 0

    def sent(self, peer: int, nbytes: int) -> None:
        """A message was posted to ``peer``."""

    def finished(self, t_drain: int, nbytes: int) -> None:
        """The step (of ``nbytes``) completed; it waited for its sends since ``t_drain``
        (0: it did not)."""


class Observer:
    """No-op hooks for every event the executor reports."""

    active = False  # True: the executor asks for a StepWatch per step
    clock = staticmethod(time.perf_counter_ns)

    def run_begin(self, calls: Sequence) -> None:
        """A batch of calls was submitted."""

    def run_end(self, calls: Sequence) -> None:
        """A batch completed (or failed)."""

    def step(self, cs, call, channel: int) -> StepWatch | None:
        """A step was issued on ``channel``; its watch, or None."""
        return None

    def idle(self, t0: int, call) -> None:
        """The executor slept in the transports since ``t0``; ``call``: the oldest call
        in flight."""

    def outside_begin(self, desc, code: int, nbytes: int) -> None:
        """A call that runs outside the executor (LL) starts (``desc``: its name, count,
        dtype, op, root and seq, as :class:`~ringtree.runtime.plan.Desc`)."""

    def outside_end(self, seq: int, code: int) -> None:
        """It ended."""


NO_OBSERVER = Observer()
