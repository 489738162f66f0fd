"""Tests of the planner (ringtree.runtime.planner): plan caching, fallbacks and the buffers a
plan lends, in one process without transports."""

from __future__ import annotations

import numpy as np

from ringtree.dtypes import DType
from ringtree.ir.program import Buf, Collective
from ringtree.ops import ReduceOp, premul_sum, resolve
from ringtree.runtime.planner import CallSpec, Planner


def planner(rank: int = 0, size: int = 4) -> Planner:
    return Planner(rank, size, (0,) * size, nchannels=1, slice_bytes=1 << 20,
                   algo_enabled={}, link="shm")


def spec(coll: Collective, x: np.ndarray, out: np.ndarray, *, op=None, algo=None,
         in_place=False, count=None, blocks=None) -> CallSpec:
    dt = DType(x.dtype.name)
    red = resolve(op, dt) if op is not None else None
    return CallSpec(coll, x.size if count is None else count, dt,
                    red.op if red is not None else None, -1, in_place, algo, blocks, 0,
                    x, out, red, out, None)


def test_a_repeated_shape_gets_the_same_plan_back():
    p = planner()
    x = np.zeros(8, np.float32)
    a = p.plan(spec(Collective.ALL_REDUCE, x, x, op="sum", in_place=True))
    assert p.plan(spec(Collective.ALL_REDUCE, x.copy(), x.copy(), op="sum",
                       in_place=True)) is a            # other buffers, same shape
    b = p.plan(spec(Collective.ALL_REDUCE, np.zeros(16, np.float32),
                    np.zeros(16, np.float32), op="sum", in_place=True))
    assert b is not a
    assert p.plan(spec(Collective.ALL_REDUCE, x, x, op="sum", in_place=True)) is a
    c = p.plan(spec(Collective.ALL_REDUCE, x, x, op="max", in_place=True))
    assert c is not a


def test_in_place_fallback_copies_the_input_and_leaves_it_alone():
    p = planner(rank=1)
    x = np.arange(8, dtype=np.int32)
    s = spec(Collective.ALL_TO_ALL, x, x, algo="pairwise", in_place=True, count=2)
    plan = p.plan(s)
    call = plan.bind(s, 1, 4)
    assert call.bufs[Buf.INPUT] is not x and np.array_equal(call.bufs[Buf.INPUT], x)
    assert call.bufs[Buf.OUTPUT] is x


def test_premul_reduces_a_scaled_copy():
    p = planner()
    x = np.full(4, 3.0, np.float32)
    o = np.zeros(4, np.float32)
    s = spec(Collective.ALL_REDUCE, x, o, op=premul_sum(2.0))
    call = p.plan(s).bind(s, 1, 4)
    assert np.array_equal(call.bufs[Buf.INPUT], np.full(4, 6.0, np.float32))
    assert np.array_equal(x, np.full(4, 3.0, np.float32))


def test_scratch_is_lent_to_one_call_at_a_time():
    p = planner()
    s = CallSpec(Collective.BARRIER, 1, DType.UINT8, ReduceOp.BOR, -1, False, None, None, 0,
                 None, None, resolve(ReduceOp.BOR, DType.UINT8), None, None)
    plan = p.plan(s)
    first = plan.bind(s, 1, 4)
    second = plan.bind(s, 2, 4)          # the first is still in flight
    assert first.bufs[Buf.SCRATCH] is not second.bufs[Buf.SCRATCH]
    assert first.plan is plan and second.plan is None
    first.bufs[Buf.SCRATCH][:] = 0       # what a finished barrier may leave behind
    plan.busy = False                    # the communicator frees it on completion
    third = plan.bind(s, 3, 4)
    assert third.bufs[Buf.SCRATCH] is first.bufs[Buf.SCRATCH]
    assert (third.bufs[Buf.SCRATCH] == 1).all()


def test_send_and_recv_plans_name_the_operation():
    p = planner(rank=0, size=2)
    x = np.zeros(3, np.float64)
    send = CallSpec(None, 3, DType.FLOAT64, None, 1, False, "send", None, 5,
                    x, x, None, x, None)
    call = p.plan(send).bind(send, 1, 2)
    assert call.desc.name == "send" and call.channel_base == 64 + 5
    assert call.steps[0][0].step.send_to == (1,)
