"""LL's compiled round (ringtree.transports._llc, shm_native) against LL's Python steps:
the same bits for every collective × dtype × op (random floats whose sums are inexact,
NaNs with payloads, infinities, signed zeros, integers that wrap), on one segment where
compiled and Python calls alternate; a package built without a compiler; a peer killed
while the others wait in the kernel; signals during the wait; 8 ranks on 2 cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hot_entry_cases import late_peer_with_signals
from test_ll import _ll, crowded

from ringtree.dtypes import DType, f32_to_bf16
from ringtree.errors import PeerError
from ringtree.ir.program import Collective
from ringtree.ops import premul_sum, resolve
from ringtree.runtime.protocols.ll import LLCollectives
from ringtree.testing import run_ranks
from ringtree.transports import shm_native

ROOT = Path(__file__).resolve().parents[1]
needs_kernel = pytest.mark.skipif(not shm_native.available(),
                                  reason="ringtree.transports._llc not built (no C compiler)")
CELL = 8192
OPS = ["sum", "prod", "min", "max", "avg", "premul_sum"]
BIT_OPS = ["band", "bor", "bxor"]


def _input(rank: int, count: int, dt: DType, op: str) -> np.ndarray:
    """Random bits of the dtype: inexact float sums, NaNs and infinities, wrapping ints."""
    rng = np.random.default_rng(7919 * rank + 31 * count + len(op))
    if not dt.is_float:
        return rng.integers(0, 256, count * dt.itemsize, dtype=np.uint8).view(dt.storage)
    v = rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)
    if op in ("min", "max") and count > 8:  # ties and signed zeros: which operand wins
        v[:4] = [0.0, -0.0, 1.5, -1.5]
    x = f32_to_bf16(v.astype(np.float32)) if dt is DType.BFLOAT16 else v.astype(dt.storage)
    if count > 8:
        bits = x.view(f"u{dt.itemsize}")
        top = {2: 0x7C00 if dt is DType.FLOAT16 else 0x7F80, 4: 0x7F800000,
               8: 0x7FF0000000000000}[dt.itemsize]
        bits[5] = top | (1 + rank)               # NaNs whose payload names the rank
        bits[6] = top                            # +inf
        bits[7] = top | (1 << (8 * dt.itemsize - 1))  # -inf
    return x


def _op(name: str, dt: DType):
    if name == "premul_sum":
        return resolve(premul_sum(0.375 if dt.is_float else 3), dt)
    return resolve(name, dt)


def _call(c, coll: str, x: np.ndarray, dt: DType, red, root: int) -> bytes:
    n, r = c.ll.n, c.ll.rank
    if coll == "all_reduce":
        return c.all_reduce(x.copy(), dt, red).tobytes()
    if coll == "reduce":
        y = x.copy()
        c.reduce(y, dt, red, root)
        return y.tobytes()
    if coll == "reduce_scatter":
        return c.reduce_scatter(x, dt, red).tobytes()
    if coll == "all_gather":
        return c.all_gather(x, dt).tobytes()
    y = x.copy() if r == root else np.zeros_like(x)
    return c.broadcast(y, dt, root).tobytes() + bytes([n])


def both(comm, name: str, dtypes: list[str]) -> tuple[list[str], list[bytes], int]:
    """Every case once through the kernel and once through Python, alternating on one
    segment; the differences, a digest of every result (ranks compare them), and how
    many calls the kernel ran."""
    native = _ll(comm, name, cell=CELL)
    python = LLCollectives(native.ll, native.timeout)
    n, r = comm.size, comm.rank
    bad, digests, compiled = [], [], 0
    try:
        for dname in dtypes:
            dt = DType(dname)
            cell = CELL // dt.itemsize
            for coll in ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast"):
                ops = (OPS + ([] if dt.is_float else BIT_OPS)) if coll in (
                    "all_reduce", "reduce", "reduce_scatter") else ["move"]
                per = n if coll in ("reduce_scatter",) else 1
                counts = [1, 3, 96 // dt.itemsize // per + 1, cell // per] + \
                    ([cell * 2 + cell // 2 + 1] if coll in ("all_reduce", "all_gather") else [])
                for op in ops:
                    red = None if op == "move" else _op(op, dt)
                    for count in counts:
                        x = _input(r, count * per, dt, op)
                        root = count % n
                        got = []
                        for c, on in ((native, "1"), (python, "0")):
                            os.environ["RINGTREE_LL_NATIVE"] = on
                            got.append(_call(c, coll, x, dt, red, root))
                        key = (Collective(coll), dt, count, red.code if red else 0,
                               root if coll in ("reduce", "broadcast") else -1)
                        # the kernel folds every dtype but float16 (a reduce's
                        # non-root only writes)
                        want_k = dt is not DType.FLOAT16 or op == "move" or \
                            coll == "reduce" and r != root
                        if (native.ops[key].k is not None) != want_k or \
                                python.ops[key].k is not None:
                            bad.append(f"{coll} {dname} {op}: kernel where not meant")
                        compiled += native.ops[key].k is not None
                        if got[0] != got[1]:
                            bad.append(f"{coll} {dname} {op} count={count}")
                        if coll in ("all_reduce", "all_gather", "broadcast"):
                            digests.append(got[0])
    finally:
        os.environ.pop("RINGTREE_LL_NATIVE", None)
        native.ll.close()
    return bad, digests, compiled


@needs_kernel
@pytest.mark.parametrize("nranks", [2, 3])
def test_kernel_and_python_give_the_same_bits(nranks):
    dtypes = [d.value for d in DType]
    res = run_ranks(both, nranks, f"b{nranks}", dtypes, timeout=120)
    for r, v in enumerate(res):
        assert not isinstance(v, BaseException), f"rank {r}: {v!r}"
        bad, digests, compiled = v
        assert not bad, f"rank {r}: " + "; ".join(bad[:8])
        assert compiled > 0
        assert digests == res[0][1], f"rank {r} holds other bits than rank 0"


def test_the_package_builds_and_imports_without_a_compiler(tmp_path):
    """``CC=/bin/false``: the optional extensions fail to build, the install does not,
    and LL runs its Python steps (``available()`` is False)."""
    for f in ("setup.py", "pyproject.toml", "README.md"):
        (tmp_path / f).write_bytes((ROOT / f).read_bytes())
    (tmp_path / "ringtree").symlink_to(ROOT / "ringtree")
    env = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"}
    out = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib",
                          str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not list((tmp_path / "lib").rglob("_llc*")), "built with CC=/bin/false?"
    probe = ("import sys; sys.modules['ringtree.transports._llc'] = None\n"
             "from ringtree.transports import shm_native as n\n"
             "assert not n.available() and not n.enabled() and not n.folds(8, 0)\n"
             "assert 'not built' in n.describe()\n")
    run = subprocess.run([sys.executable, "-c", probe], env={**os.environ,
                         "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]


def killed_in_kernel(comm):
    c = _ll(comm, "kk", spin=0.0, yield_us=20000.0)  # the survivors wait in the kernel
    x = np.ones(2, np.float32)
    red = resolve("sum", DType.FLOAT32)
    for _ in range(20):
        c.all_reduce(x, DType.FLOAT32, red)
    assert c.op(Collective.ALL_REDUCE, DType.FLOAT32, 2, red).k is not None
    return rank_1_dies(comm, c, x, red)


def rank_1_dies(comm, c, x: np.ndarray, red) -> tuple[int | None, str]:
    """Rank 1 SIGKILLs itself; the others all-reduce ``x`` on ``c`` once more: (the peer
    their error names, its text)."""
    if comm.rank == 1:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        c.all_reduce(x, DType.FLOAT32, red)
    except PeerError as e:
        return e.peer, str(e)
    return None, "no error"


@needs_kernel
def test_a_peer_killed_during_the_kernel_wait_is_named():
    res = run_ranks(killed_in_kernel, 3, timeout=60)
    assert isinstance(res[1], BaseException)
    for r in (0, 2):
        peer, msg = res[r]
        assert peer == 1 and "rank 1" in msg and "died" in msg, msg


def signalled(comm) -> tuple[int, bool]:
    """:func:`hot_entry_cases.late_peer_with_signals` on a bare LL all-reduce (spinning 5
    µs, then yielding 2 ms): the handler runs and the calls complete."""
    c = _ll(comm, "sig", spin=5.0, yield_us=2000.0)
    red = resolve("sum", DType.INT64)
    try:
        return late_peer_with_signals(comm, lambda x: c.all_reduce(x, DType.INT64, red))
    finally:
        c.ll.close()


@needs_kernel
def test_signals_during_the_kernel_wait():
    res = run_ranks(signalled, 2, timeout=60)
    assert res[0][1] and res[1][1], res
    assert res[0][0] > 10, res  # the handler ran while rank 0 waited


@needs_kernel
def test_eight_ranks_on_two_cores_in_the_kernel():
    assert run_ranks(crowded, 8, 2000, True, timeout=120) == [0] * 8


def crowded_gathers(comm, calls: int) -> tuple[int, int]:
    """``calls`` all-gathers streamed through two cells each and reduce-scatters, with no
    spinning and a short yield, so peers are often asleep or late and the kernel hands
    the placing (the fold) back to Python: (wrong results, parts Python placed)."""
    from ringtree.runtime.protocols import ll_gather

    c = _ll(comm, "crowd_ag", cell=CELL, spin=0.0, yield_us=20.0)
    n, r, count = comm.size, comm.rank, CELL // 4 + 5
    red = resolve("sum", DType.INT32)
    placed, place = [0], ll_gather.place
    ll_gather.place = lambda *a: placed.__setitem__(0, placed[0] + 1) or place(*a)
    bad = 0
    try:
        for k in range(calls):
            x = np.arange(count, dtype=np.int32) + 1000 * r + k
            got = c.all_gather(x, DType.INT32).reshape(n, count)
            bad += int((got != np.arange(count) + 1000 * np.arange(n)[:, None] + k).any())
            rs = c.reduce_scatter(np.repeat(np.arange(n, dtype=np.int32), 5) + r + k,
                                  DType.INT32, red)
            bad += int((rs != n * (r + k) + n * (n - 1) // 2).any())
        bad += c.op(Collective.ALL_GATHER, DType.INT32, count, None).k is None
        bad += c.op(Collective.REDUCE_SCATTER, DType.INT32, 5, red).k is None
    finally:
        ll_gather.place = place
        c.ll.close()
    return bad, placed[0]


@needs_kernel
def test_streamed_all_gathers_and_reduce_scatters_on_four_ranks_of_two_cores():
    res = run_ranks(crowded_gathers, 4, 300, timeout=120)
    assert [b for b, _ in res] == [0] * 4, res


def large_gather(comm) -> list[str]:
    """An all-gather whose output is past the kernel's streaming-store size, at odd byte
    offsets: the kernel and Python place the same bytes."""
    c = _ll(comm, "big_ag", cell=1 << 20)
    count, r = (1 << 21) + 3, comm.rank
    x = (np.arange(count) % 4093 + 4096 * r).astype(np.float32)
    got = []
    try:
        for on in ("1", "0"):
            os.environ["RINGTREE_LL_NATIVE"] = on
            c.ops.clear()
            got.append(c.all_gather(x, DType.FLOAT32).tobytes())
    finally:
        os.environ.pop("RINGTREE_LL_NATIVE", None)
        c.ll.close()
    want = np.concatenate([(np.arange(count) % 4093 + 4096 * q).astype(np.float32)
                           for q in range(comm.size)]).tobytes()
    return [f"native={on}" for on, g in zip("10", got) if g != want]


@needs_kernel
def test_a_large_all_gather_streams_its_stores_to_the_same_bytes():
    assert run_ranks(large_gather, 2, timeout=60) == [[], []]


def out_of_place(comm) -> list[str]:
    """The communicator's hot path takes out-of-place all-reduces too (the second call of
    a shape); an ``out`` that may share memory with the input goes the general way."""
    n, r = comm.size, comm.rank
    bad = []
    for _ in range(3):
        x = np.arange(4, dtype=np.float32) + r
        y = np.full(4, -1, np.float32)
        got = comm.all_reduce(x, out=y)
        bad += [] if got is y and (y == n * np.arange(4) + n * (n - 1) / 2).all() \
            and (x == np.arange(4) + r).all() else ["out-of-place"]
    if not any(key[3] is False for key in comm.planner.ready):
        bad.append("out-of-place calls are not on the hot path")
    buf = np.ones(8, np.float32)
    comm.all_reduce(buf[:4], out=buf[:4])                 # the same memory: in place
    bad += [] if (buf[:4] == n).all() and (buf[4:] == 1).all() else ["view in place"]
    try:
        comm.all_reduce(buf[:4], out=buf[2:6])
        bad.append("partial overlap accepted")
    except ValueError:
        pass
    return bad


def test_out_of_place_all_reduce_on_the_hot_path():
    assert run_ranks(out_of_place, 2, timeout=60) == [[], []]


def mixed(comm) -> list[str]:
    """Rank 0 runs the kernel, the others LL's Python steps (a process without the
    extension, or with RINGTREE_LL_NATIVE=0): the protocol is the same, so are the bits."""
    os.environ["RINGTREE_LL_NATIVE"] = "1" if comm.rank == 0 else "0"
    c = _ll(comm, "mixed", cell=CELL)
    n, r = comm.size, comm.rank
    bad = []
    try:
        for dt, count in ((DType.FLOAT32, 3), (DType.INT64, 700), (DType.FLOAT64, 4 * CELL)):
            red = resolve("sum", dt)
            x = _input(r, count, dt, "sum")
            got = c.all_reduce(x.copy(), dt, red)
            want = _input(0, count, dt, "sum").copy()
            for q in range(1, n):
                want = np.add(want, _input(q, count, dt, "sum"))
            if got.tobytes() != want.tobytes():
                bad.append(f"{dt.value} count={count}")
            if (c.ops[(Collective.ALL_REDUCE, dt, count, red.code, -1)].k is not None) != \
                    (r == 0):
                bad.append("kernel where not meant")
        g = c.all_gather(np.array([r], np.int64), DType.INT64)
        bad += [] if g.tolist() == list(range(n)) else ["all_gather"]
    finally:
        os.environ.pop("RINGTREE_LL_NATIVE", None)
        c.ll.close()
    return bad


@needs_kernel
def test_kernel_and_python_ranks_in_one_job():
    assert run_ranks(mixed, 3, timeout=60) == [[], [], []]
