"""One rank's collectives in one C entry (``Round.alone``, docs/design-notes.md, "One
rank in one C entry"): every collective the hot paths take (all-reduce, reduce,
broadcast, all-gather, reduce-scatter) × dtype × op, in place and into ``out``, gives
the bytes of the rank's own contribution (NaN payloads, -0.0 and infinities kept; AVG is
x / 1; PREMUL_SUM the bytes of ``Reducer.premultiply``), with the kernel and without it
(``RINGTREE_LL_NATIVE=0``: the general path); the flight recorder's entries are written
from C with the kernel, numbered in order; buffers the entry must not take get the
general path's errors (a read-only broadcast buffer is the root's: read, never written,
as on more ranks); an async call is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hot_entry_cases import assert_recorded, errors_of, recorded

import ringtree
from ringtree.dtypes import DType
from ringtree.ops import resolve

INTS = ("int8", "uint8", "int32", "uint32", "int64", "uint64")
FLOATS = ("float16", "float32", "float64")


def _ops(dtype: str) -> list:
    ops = ["sum", "prod", "min", "max", "avg", ringtree.premul_sum(3.0)]
    return ops + ["band", "bor", "bxor"] if dtype in INTS else ops


def _input(dtype: str, count: int, k: int) -> np.ndarray:
    """Values of every bit pattern (floats: NaNs with payloads, -0.0, infinities)."""
    rng = np.random.default_rng(31 * k + count)
    raw = rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8)
    x = raw.view(dtype).copy()
    if dtype in FLOATS and count > 3:
        x[:3] = (-0.0, np.inf, -np.inf)
    return x


def _want(dtype: str, op, x: np.ndarray) -> bytes:
    if isinstance(op, ringtree.PremulSum):
        want = np.empty_like(x)
        with np.errstate(all="ignore"):
            resolve(op, DType(dtype)).premultiply(x, want)
        return want.tobytes()
    return x.tobytes()


def _calls(comm, dtype: str, op, x: np.ndarray, out: np.ndarray):
    """(name, call, what it returns) of every collective with ``op``, in place and out."""
    calls = [("all_reduce", lambda: comm.all_reduce(x, op), x),
             ("all_reduce out", lambda: comm.all_reduce(x, op, out=out), out),
             ("reduce", lambda: comm.reduce(x, 0, op), x),
             ("reduce out", lambda: comm.reduce(x, 0, op, out=out), out),
             ("reduce_scatter", lambda: comm.reduce_scatter(x, op, out=out), out)]
    if op == "sum":
        calls += [("broadcast", lambda: comm.broadcast(x, 0), x),
                  ("all_gather", lambda: comm.all_gather(x, out=out), out)]
    return calls


def alone(comm) -> dict:
    wrong, calls, native = [], 0, set()  # native: calls whose entry C wrote
    made = comm.flight.native
    with np.errstate(all="ignore"):
        for dtype in INTS + FLOATS:
            for op in _ops(dtype):
                for count in (1, 5, 1001):
                    for name, call, res in _calls(comm, dtype, op, x := _input(dtype, count, 0),
                                                  out := np.zeros(count, dtype)):
                        before = int(made[0])
                        for k in range(3):  # the general path learns the shape, then C
                            x[...] = _input(dtype, count, k)
                            keep = x.tobytes()
                            want = x.tobytes() if name in ("broadcast", "all_gather") \
                                else _want(dtype, op, x)
                            got = call()
                            calls += 1
                            if got is not res or res.tobytes() != want or \
                                    res is out and x.tobytes() != keep:
                                wrong.append((dtype, str(op), count, name, k))
                        if made[0] > before:
                            native.add((dtype, str(op), name))
    for dtype in ("int8", "float64"):  # larger than a cell: streamed on more ranks
        x, out = _input(dtype, (1 << 20) + 3, 0), np.zeros((1 << 20) + 3, dtype)
        for name, call, res in _calls(comm, dtype, "sum", x, out):
            for _ in range(3):
                keep = x.tobytes()
                if call() is not res or res.tobytes() != keep or x.tobytes() != keep:
                    wrong.append((dtype, "sum", x.size, name))
    x = np.arange(64, dtype=np.float32)
    work = comm.all_reduce(x, async_op=True)
    asynced = work.wait() is not None and x.tolist() == list(range(64))
    readonly = np.arange(8, dtype=np.float32)
    readonly.flags.writeable = False
    comm.all_reduce(np.zeros(8, np.float32))  # the warm shapes
    comm.all_reduce(np.zeros(8, np.float32), out=np.zeros(8, np.float32))
    errors = errors_of(lambda xx, bad: comm.all_reduce(xx, out=bad), (
        (readonly, None),                                  # read-only, in place
        (np.zeros(8, np.float32), np.zeros(8, np.float64)),  # out of another dtype
        (np.zeros(8, np.float32), np.zeros(9, np.float32))))  # out of another size
    errors += errors_of(lambda xx, bad: comm.all_gather(xx, out=bad), (
        (np.zeros(8, np.float32), np.zeros(9, np.float32)),))
    errors += errors_of(lambda xx, bad: comm.reduce_scatter(xx, out=bad), (
        (np.zeros(8, np.float32), np.zeros(4, np.float32)),))
    errors += errors_of(lambda xx, bad: comm.broadcast(xx, 0), ((readonly, None),))  # the root
    comm.all_reduce(np.zeros(8, np.float32))
    comm.all_reduce(np.zeros(8, np.float32))
    cases = {(d, str(op), name) for d in INTS + FLOATS for op in _ops(d)
             for name, _, _ in _calls(comm, d, op, None, None)}
    general = sorted(cases - native)  # with the kernel: PREMUL_SUM of float16 only
    return {"wrong": wrong, "calls": calls, "async": asynced, "errors": errors,
            "general": general, "native": len(native),
            **recorded(comm, 2)}


@pytest.mark.parametrize("env", [{}, {"RINGTREE_LL_NATIVE": "0"}], ids=["kernel", "python"])
def test_one_rank_collectives_bits_records_and_refusals(env):
    from ringtree.testing import run_ranks

    got = run_ranks(alone, 1, timeout=120, env=env)[0]
    assert not isinstance(got, BaseException), got
    assert got["wrong"] == [] and got["calls"] > 1000 and got["async"], got
    assert got["errors"] == ["ValueError", "TypeError", "ValueError", "ValueError",
                             "ValueError", "no error"], got
    assert_recorded(0, got, 2, not env, 100)
    if env:
        assert got["native"] == 0, got
    else:
        assert {(d, op) for d, op, _ in got["general"]} == {("float16", "PremulSum(scalar=3.0)")}, got


def after_simple(comm) -> dict:
    """Hot all-reduces, one on Simple (``algo``), then hot ones again: a rank alone has
    no peer to wait for, so the calls after the Simple one take the C entry again."""
    from ringtree.prof.flight import Entry

    x = np.arange(8, dtype=np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    comm.all_reduce(x, algo="ring")
    ring = comm.flight.ring
    before = sum(type(e) is not Entry for e in ring if e is not None)
    for _ in range(5):
        comm.all_reduce(x)
    return {"new_from_c": sum(type(e) is not Entry for e in ring if e is not None) - before,
            "same": x.tolist() == list(range(8)), **recorded(comm, 5)}


def test_one_rank_hot_path_after_a_simple_call():
    pytest.importorskip("ringtree.transports._llc")
    from ringtree.testing import run_ranks

    got = run_ranks(after_simple, 1, timeout=60)[0]
    assert not isinstance(got, BaseException), got
    assert got["same"] and got["new_from_c"] == 5, got
    assert_recorded(0, got, 5, True, 5)
