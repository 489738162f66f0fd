"""A validated call and the plan of its shape: what the planner
(:mod:`ringtree.runtime.planner`) takes and gives.

A :class:`CallSpec` is one call as :mod:`ringtree.api` validated it: its shape (the
first :data:`SHAPE_FIELDS` fields, the plan cache's key) and its buffers. A :class:`Plan`
is a shape compiled for one rank: its steps (or, on LL, the op the LL runner prepared),
its descriptor fields, and the scratch and staging buffers it lends to one call at a time
(:meth:`Plan.bind` makes the :class:`~ringtree.runtime.plan.Call`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Collective, Program
from ringtree.ops import ReduceOp, Reducer
from ringtree.runtime.plan import Call, CStep, Desc

SHAPE_FIELDS = 9        # CallSpec[:SHAPE_FIELDS] is the plan's cache key


class CallSpec(NamedTuple):
    """One validated call: its shape (the first :data:`SHAPE_FIELDS` fields, which
    decide the plan) and the buffers it runs on. Built by :mod:`ringtree.api`."""

    coll: Collective | None      # None: point-to-point
    count: int                   # elements per block (send/recv: elements)
    dtype: DType
    op: ReduceOp | None          # None: no reduction, or a user operator
    root: int                    # root rank; the peer of a send/recv; -1 otherwise
    in_place: bool
    algo: str | None             # requested algorithm (None: tuner); "send"/"recv"
    blocks: tuple[tuple[int, ...], tuple[int, ...]] | None  # uneven (input, output) blocks
    tag: int                     # send/recv tag
    inp: np.ndarray | None       # flat typed views
    out: np.ndarray | None
    reducer: Reducer | None
    result: Any                  # what the call returns
    post: Callable[[], None] | None  # runs after success (e.g. copy into an out list)


_COPY, _PREMUL = 1, 2


class Plan:
    """A call shape compiled for this rank: steps, descriptor fields and buffers to lend."""

    __slots__ = ("key", "protocol", "algo", "steps", "name", "coll_code", "root",
                 "channel_base", "stage", "scratch_len", "scratch_fill", "avg",
                 "_scratch", "_staging", "busy", "ll_op", "announce", "program", "simple")

    def __init__(self, key: tuple, algo: str, steps: list[list[CStep]], *, name: str,
                 coll_code: int, root: int, channel_base: int = 0, stage: int = 0,
                 scratch_len: int = 0, scratch_fill: int | None = None, avg: bool = False,
                 protocol: str = "simple"):
        self.key, self.protocol, self.algo, self.steps = key, protocol, algo, steps
        self.name, self.coll_code, self.root = name, coll_code, root
        self.channel_base, self.stage, self.avg = channel_base, stage, avg
        self.scratch_len, self.scratch_fill = scratch_len, scratch_fill
        self._scratch: np.ndarray | None = None
        self._staging: np.ndarray | None = None
        self.busy = False  # a call in flight holds this plan's buffers
        self.ll_op = None  # the op the LL runner prepared from the Program, on LL
        self.announce = None  # header words a Simple run publishes in the LL segment
        self.program: Program | None = None  # the Program (this rank's), with protocol
        self.simple: Plan | None = None  # an LL plan's Simple twin (inside a group)

    def bind(self, spec: CallSpec, seq: int, nranks: int) -> Call:
        """The Call that runs ``spec`` (sequence number ``seq``) on this plan."""
        own = not self.busy
        inp, dt, red = spec.inp, spec.dtype, spec.reducer
        if self.stage and inp is not None:
            stage = self._staging if own else None
            if stage is None or stage.size != inp.size or stage.dtype != inp.dtype:
                stage = np.empty_like(inp)
                self._staging = stage if own else self._staging
            if self.stage == _PREMUL:
                assert red is not None
                red.premultiply(inp, stage)
            else:
                np.copyto(stage, inp)
            inp = stage
        scratch = None
        if self.scratch_len:
            scratch = self._scratch if own else None
            if scratch is None:
                scratch = np.zeros(self.scratch_len, dtype=dt.storage)
                self._scratch = scratch if own else self._scratch
            if self.scratch_fill is not None:
                scratch[:] = self.scratch_fill
        post = spec.post
        if self.avg and spec.out is not None:
            assert red is not None
            divide = functools.partial(red.postdivide, spec.out, nranks)
            post = divide if post is None else _chain(post, divide)
        desc = Desc(self.name, spec.count, dt.value, dt.code,
                    red.name if red is not None else "-", red.code if red is not None else 0,
                    self.root, seq, self.algo, self.coll_code)
        call = Call(self.steps, [inp, spec.out, scratch], red, desc,
                    channel_base=self.channel_base, post=post)
        if own:
            self.busy = True
            call.plan = self
        return call


def _chain(a: Callable[[], None], b: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        a()
        b()
    return both
