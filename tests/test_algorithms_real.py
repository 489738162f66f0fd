"""The algorithm library run for real: every (collective, algorithm) of trees, halving-
doubling, Bruck, direct and hierarchical on N ∈ {2, 3, 4, 5, 7, 8} real processes.

Inputs are nccl-tests style (exact in any reduction order, see ``collective_cases``) and
results are compared bit for bit with NumPy. Sizes: 0, 1, odd, not divisible by N, and
about 1 MiB (several executor slices). Every dtype × op runs at one size per algorithm.
Determinism: with inexact float inputs, two runs give identical bits and all ranks agree.

Node layouts are faked by overriding the communicator's host-derived ``nodes`` (one host
here), so the tree patterns and the hierarchical algorithms see 2-rank and round-robin
"nodes"; ``tree`` on one node is NCCL's chain.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager

import numpy as np
import pytest
from collective_cases import ALL_DTYPES, make_input, op_arg, ops_for, reference_reduce, same_bits

from ringtree.dtypes import DType
from ringtree.testing import RankPool

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 NumPy arrays need ml_dtypes")

NRANKS = [2, 3, 4, 5, 7, 8]
MIB_F32 = (1 << 20) // 4 + 3          # ~1 MiB of float32, not divisible by any N here
ALGOS = {
    "all_reduce": ["tree", "tree_updown", "recursive_doubling", "rabenseifner", "direct",
                   "direct2", "hierarchical"],
    "all_gather": ["recursive_doubling", "bruck", "direct", "hierarchical"],
    "reduce_scatter": ["halving", "direct", "hierarchical"],
    "broadcast": ["tree", "hierarchical"],
    "reduce": ["tree"],
    "all_to_all": ["bruck"],
}
CASES = [(c, a) for c, algos in ALGOS.items() for a in algos]
LAYOUTS = ["host", "ppn2", "round_robin"]


def _sizes(n: int) -> list[int]:
    return [0, 1, 17, 3 * n + 1]


@contextmanager
def fake_nodes(comm, layout: str):
    """Pretend the ranks sit on several hosts (the algorithms read ``comm.nodes``)."""
    saved = comm.nodes
    n = comm.size
    if layout == "ppn2":
        comm.nodes = tuple(r // 2 for r in range(n))
    elif layout == "round_robin":
        comm.nodes = tuple(r % 2 for r in range(n))
    comm.planner.relayout(comm.nodes)  # the planner keeps its own copy
    try:
        yield
    finally:
        comm.nodes = saved
        comm.planner.relayout(saved)


def _u(a: np.ndarray, dt: DType) -> np.ndarray:
    return a.view(ml_dtypes.bfloat16) if dt is DType.BFLOAT16 else a


def one_case(comm, coll: str, algo: str, dt: DType, op: str, count: int, in_place: bool,
             root: int) -> str | None:
    """Run one call; a description of what went wrong, or None."""
    n, r = comm.size, comm.rank
    label = f"{algo} {coll} {dt.value} {op} count={count} in_place={in_place} root={root}"
    if coll in ("all_reduce", "reduce"):
        inputs = [make_input(q, count, dt, op) for q in range(n)]
        want = reference_reduce(inputs, dt, op)
        x = inputs[r].copy()
        out = None if in_place else np.empty_like(x)
        o = None if out is None else _u(out, dt)
        if coll == "all_reduce":
            comm.all_reduce(_u(x, dt), op_arg(op), out=o, algo=algo)
            got = x if in_place else out
        else:
            comm.reduce(_u(x, dt), root, op_arg(op), out=o, algo=algo)
            if r != root:
                return None if same_bits(x, inputs[r]) else f"{label}: input changed"
            got = x if in_place else out
    elif coll == "reduce_scatter":
        inputs = [make_input(q, count * n, dt, op) for q in range(n)]
        want = reference_reduce(inputs, dt, op)[r * count:(r + 1) * count]
        x = inputs[r].copy()
        got = x[r * count:(r + 1) * count] if in_place else np.empty(count, dt.storage)
        comm.reduce_scatter(_u(x, dt), op_arg(op), out=_u(got, dt), algo=algo)
    elif coll == "all_gather":
        blocks = [make_input(q, count, dt, "move") for q in range(n)]
        want = np.concatenate(blocks)
        got = np.zeros((n, count), dt.storage)
        if in_place:
            got[r] = blocks[r]
            comm.all_gather(_u(got[r], dt), out=_u(got, dt), algo=algo)
        else:
            comm.all_gather(_u(blocks[r].copy(), dt), out=_u(got, dt), algo=algo)
        got = got.reshape(-1)
    elif coll == "broadcast":
        data = make_input(root, count, dt, "move")
        got = data.copy() if r == root else np.zeros(count, dt.storage)
        comm.broadcast(_u(got, dt), root, algo=algo)
        want = data
    elif coll == "all_to_all":
        x = np.concatenate([make_input(100 * r + q, count, dt, "move") for q in range(n)])
        want = np.concatenate([make_input(100 * q + r, count, dt, "move") for q in range(n)])
        got = x if in_place else np.empty_like(x)
        comm.all_to_all(_u(x, dt), out=_u(got, dt), algo=algo)
    else:
        raise ValueError(coll)
    if not same_bits(got, want):
        bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
        return f"{label}: {len(bad)} wrong bytes (first at {bad[:3]})"
    return None


def batch(comm, coll: str, algo: str, layout: str, cases: list[tuple]) -> list[str]:
    fails: list[str] = []
    with fake_nodes(comm, layout):
        for case in cases:
            try:
                msg = one_case(comm, coll, algo, *case)
            except Exception as e:  # noqa: BLE001 - report per case, keep ranks in step
                return fails + [f"{algo} {coll} {case}: {type(e).__name__}: {e}"]
            if msg:
                fails.append(f"[{layout}] {msg}")
    return fails


def _rooted(coll: str) -> bool:
    return coll in ("broadcast", "reduce")


def _size_cases(coll: str, n: int) -> list[tuple]:
    out = []
    for i, count in enumerate(_sizes(n)):
        for in_place in (False, True):
            root = (count + i) % n if _rooted(coll) else 0
            out.append((DType.FLOAT32, "sum" if coll != "all_gather" else "move", count,
                        in_place, root))
    big = MIB_F32 if coll in ("all_reduce", "reduce", "broadcast") else MIB_F32 // n + 1
    out.append((DType.FLOAT32, "sum", big, False, n - 1))
    out.append((DType.INT32, "max", big, True, 0))
    return out


def _dtype_op_cases(coll: str, n: int) -> list[tuple]:
    out = []
    for dt in ALL_DTYPES:
        ops = ops_for(dt) if coll in ("all_reduce", "reduce", "reduce_scatter") else ["move"]
        for j, op in enumerate(ops):
            out.append((dt, op, 17, bool(j % 2), (j + 1) % n))
    return out


def _assert_clean(results):
    for r, fails in enumerate(results):
        assert not isinstance(fails, BaseException), f"rank {r}: {fails!r}"
        assert not fails, f"rank {r}:\n" + "\n".join(fails[:10])


@pytest.fixture(scope="module", params=NRANKS, ids=lambda n: f"n{n}")
def pool(request):
    with RankPool(request.param) as p:
        yield p


@pytest.mark.parametrize("coll,algo", CASES, ids=[f"{a}-{c}" for c, a in CASES])
def test_sizes(pool, coll, algo):
    layouts = LAYOUTS if algo in ("tree", "tree_updown", "hierarchical") else ["host"]
    for layout in layouts:
        _assert_clean(pool.run(batch, coll, algo, layout, _size_cases(coll, pool.nranks)))


@pytest.mark.parametrize("coll,algo", CASES, ids=[f"{a}-{c}" for c, a in CASES])
def test_every_dtype_and_op(pool, coll, algo):
    if pool.nranks not in (3, 8):
        pytest.skip("every dtype × op runs at N = 3 and 8")
    layout = "ppn2" if algo in ("tree", "hierarchical") else "host"
    _assert_clean(pool.run(batch, coll, algo, layout, _dtype_op_cases(coll, pool.nranks)))


def deterministic(comm, algo: str, layout: str) -> tuple[str, str]:
    """Inexact float inputs: the hash of two runs' results."""
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(10_007).astype(np.float32)
    digests = []
    with fake_nodes(comm, layout):
        for _ in range(2):
            y = x.copy()
            comm.all_reduce(y, algo=algo)
            digests.append(hashlib.sha256(y.tobytes()).hexdigest())
    return digests[0], digests[1]


@pytest.mark.parametrize("algo", ALGOS["all_reduce"])
def test_all_reduce_deterministic(pool, algo):
    layout = "ppn2" if algo in ("tree", "tree_updown", "hierarchical") else "host"
    results = pool.run_ok(deterministic, algo, layout)
    first = results[0][0]
    for r, (a, b) in enumerate(results):
        assert a == b, f"rank {r}: two runs of {algo} differ"
        assert a == first, f"rank {r} and rank 0 disagree after {algo}"
