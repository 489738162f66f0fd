"""The single-copy all-reduce on plain buffers (``runtime/protocols/ll_direct_fold.py``):
the bits of the rank-order fold for NumPy dtypes and ops and bfloat16 torch tensors, odd
counts, several fold pieces, in place and not (the own row first, second and later in
the fold; ranks in place and not in one call), 2-4 ranks, through ctypes too; both sides
of the crossover and ``RINGTREE_CMA=0``; where it applies; a killed peer named; a failed
read or write raised on every rank, out of place with the inputs untouched."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hot_entry_cases import KILL_ENV, assert_killed_named, killed_peer
from test_ll_direct import post_unmapped
from test_ll_native import _input
from test_ll_split import _want

from ringtree.dtypes import DType
from ringtree.errors import RingtreeError
from ringtree.ir.program import Collective
from ringtree.ops import ReduceOp, resolve
from ringtree.runtime.protocols import ll_direct, ll_direct_entry, ll_direct_fold
from ringtree.runtime.protocols.ll_direct_entry import Compiled
from ringtree.runtime.protocols.ll_direct_fold import AllReduceOp
from ringtree.testing import run_ranks

ALL_DIRECT = {"RINGTREE_CMA_MIN": "1"}
CASES = [("float32", "sum"), ("float64", "max"), ("int32", "prod"), ("float16", "sum"),
         ("uint8", "bxor"), ("int64", "min"), ("float32", "avg"), ("int32", "avg")]


def _calls() -> int:
    """All-reduces run on the single-copy path so far in this process: published from
    Python, or completed after the C entry (``Compiled.after``, ``entries`` counts
    those)."""
    if "_counted" not in vars(AllReduceOp):
        real, real_after = AllReduceOp._publish_both, Compiled.after

        def counted(self, x, out, timeout):
            AllReduceOp._counted += 1
            return real(self, x, out, timeout)

        def after(self, *a):
            if isinstance(self.op, AllReduceOp):
                AllReduceOp._counted += 1
                AllReduceOp._entries += 1
            return real_after(self, *a)
        AllReduceOp._publish_both, AllReduceOp._counted = counted, 0
        Compiled.after, AllReduceOp._entries = after, 0
    return AllReduceOp._counted


def _reference(n: int, count: int, dname: str, op: str) -> bytes:
    dt = DType(dname)
    want = _want(n, count, dt, "sum" if op == "avg" else op)
    if op == "avg":
        resolve("avg", dt).postdivide(want, n)
    return want.tobytes()


def every_case(comm, counts: list[int]) -> list[str]:
    """Each (dtype, op, count, in place) against the rank-order fold; what differs, did
    not run directly, or changed an input."""
    bad = []
    # this process only: several pieces a block, cheaply (the Python loop's and the
    # compiled one's)
    piece = ll_direct_fold.PIECE = ll_direct_fold.NATIVE_PIECE = 4096
    for dname, op in CASES:
        item = np.dtype(dname).itemsize
        for count in counts + [comm.size * 3 * piece // item + 5]:
            x = _input(comm.rank, count, DType(dname), "sum" if op == "avg" else op)
            want = _reference(comm.size, count, dname, op)
            for in_place in (False, True):
                y, before = x.copy(), _calls()
                got = comm.all_reduce(y, op) if in_place else \
                    comm.all_reduce(y, op, out=np.empty_like(y))
                what = f"{dname} {op} count={count} in_place={in_place}"
                if got.tobytes() != want:
                    bad.append(f"{what}: differs")
                if _calls() == before:
                    bad.append(f"{what}: not direct")
                if not in_place and y.tobytes() != x.tobytes():
                    bad.append(f"{what}: the input changed")
    return bad


def native_runs(comm, counts: list[int], native: bool) -> list[str]:
    """:func:`every_case`, and whether the compiled loop ran where it should (every case
    but AVG and float16 with the kernel; none without)."""
    calls = [0]
    real = ll_direct_fold.native.fold_push

    def counted(*a):
        calls[0] += 1
        return real(*a)
    ll_direct_fold.native.fold_push = counted
    bad = every_case(comm, counts)
    calls[0] += AllReduceOp._entries  # the loop in the C entry
    if (calls[0] > 0) != native:
        bad.append(f"the compiled loop ran {calls[0]} times")
    return bad


@pytest.mark.parametrize("n,native", [(2, True), (3, True), (4, True), (2, False),
                                      (3, False)])
def test_direct_all_reduce_gives_the_rank_order_bits(n, native):
    if native and not ll_direct_fold.native.pushes():
        pytest.skip("no compiled _llc")
    counts = [1, 7, 1001] if n < 4 else [5]
    env = ALL_DIRECT if native else {**ALL_DIRECT, "RINGTREE_LL_NATIVE": "0"}
    for r, bad in enumerate(run_ranks(native_runs, n, counts, native, timeout=90, env=env)):
        assert bad == [], f"rank {r}: {bad}"


def shrunk_pieces(comm) -> list[str]:
    """The compiled loop at its default piece on more ranks than the scratch holds at
    full size (NATIVE_SCRATCH ÷ (n - 1) bytes a peer, whole pages): blocks of several
    such pieces and a partial one, float32 sum and float64 max, in place; the pieces the
    loop was handed are the shrunk ones."""
    bad, pieces = [], []
    real, real_piece = ll_direct_fold.native.fold_push, ll_direct_entry.native_piece

    def spy(*a):
        pieces.append(a[10])
        return real(*a)

    def prepared(n: int, item: int) -> int:  # the C entry's loop, set up once a shape
        pieces.append(real_piece(n, item))
        return pieces[-1]
    ll_direct_fold.native.fold_push, ll_direct_entry.native_piece = spy, prepared
    for dname, op in (("float32", "sum"), ("float64", "max")):
        item = np.dtype(dname).itemsize
        per = ll_direct_fold.native_piece(comm.size, item)
        if not (per < ll_direct_fold.NATIVE_PIECE and per % 4096 == 0 and
                (comm.size - 1) * per <= ll_direct_fold.NATIVE_SCRATCH):
            bad.append(f"{dname}: piece {per} is not a shrunk whole page count")
        count = comm.size * (2 * per + 4096 + 24) // item + 3
        x = _input(comm.rank, count, DType(dname), op)
        del pieces[:]
        if comm.all_reduce(x, op).tobytes() != _reference(comm.size, count, dname, op):
            bad.append(f"{dname} {op}: differs")
        if not pieces or set(pieces) != {per}:  # (a call handed back: Python's loop too)
            bad.append(f"{dname} {op}: the compiled loop ran with pieces {pieces}, not {per}")
    return bad


def test_more_ranks_fold_smaller_pieces():
    if not ll_direct_fold.native.pushes():
        pytest.skip("no compiled _llc")
    # RINGTREE_TUNE=model: no measuring calls (ll_stores) beside the one counted
    env = {**ALL_DIRECT, "RINGTREE_TUNE": "model"}
    for r, bad in enumerate(run_ranks(shrunk_pieces, 5, timeout=90, env=env)):
        assert bad == [], f"rank {r}: {bad}"


def mixed_in_place(comm) -> list[str]:
    """Even ranks in place, odd ranks into a separate ``out`` (each rank's own choice)."""
    ll_direct_fold.PIECE = ll_direct_fold.NATIVE_PIECE = 4096
    bad = []
    for count in (7, 3 * 4096 + 5):
        x = _input(comm.rank, count, DType.FLOAT32, "sum")
        y, before = x.copy(), _calls()
        got = comm.all_reduce(y) if comm.rank % 2 == 0 else \
            comm.all_reduce(y, out=np.empty_like(y))
        if got.tobytes() != _want(comm.size, count, DType.FLOAT32, "sum").tobytes() or \
                _calls() == before:
            bad.append(f"count={count}")
    return bad


def test_ranks_in_place_and_not_in_one_call():
    for r, bad in enumerate(run_ranks(mixed_in_place, 3, timeout=60, env=ALL_DIRECT)):
        assert bad == [], f"rank {r}: {bad}"


def through_ctypes(comm) -> list[str]:
    """:func:`every_case` with the reads and writes made through ctypes (no ``_cma``)."""
    ll_direct.cma._cma = None
    return every_case(comm, [7])


def test_through_ctypes():
    env = {**ALL_DIRECT, "RINGTREE_LL_NATIVE": "0"}  # (the compiled loop moves in C)
    for r, bad in enumerate(run_ranks(through_ctypes, 2, timeout=60, env=env)):
        assert bad == [], f"rank {r}: {bad}"


def torch_tensors(comm) -> list[str]:
    """bfloat16 and float32 torch tensors, in place: direct against Simple's ``direct``
    Program, bit for bit."""
    import torch

    bad = []
    for dt in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(comm.rank)
        x = (torch.randn(3 * 1003, generator=g) * 100).to(dt)
        want = x.clone()
        comm.all_reduce(want, algo="direct")
        before = _calls()
        comm.all_reduce(x)
        if _calls() == before or not torch.equal(x.view(torch.uint8), want.view(torch.uint8)):
            bad.append(f"{dt}: {'differs' if _calls() > before else 'not direct'}")
    return bad


def test_torch_bfloat16():
    pytest.importorskip("torch")
    for r, bad in enumerate(run_ranks(torch_tensors, 3, timeout=60, env=ALL_DIRECT)):
        assert bad == [], f"rank {r}: {bad}"


def at_crossover(comm) -> list[tuple[int, bool, bool]]:
    """float32 sums just below and at the crossover: (bytes, direct?, bits right)."""
    first = -(-ll_direct_fold.MIN_BYTES[comm.size > 2] // 4)
    res = []
    for count in (first - 1, first):
        x = _input(comm.rank, count, DType.FLOAT32, "sum")
        before = _calls()
        got = comm.all_reduce(x, out=np.empty_like(x))
        res.append((count * 4, _calls() > before,
                    got.tobytes() == _want(comm.size, count, DType.FLOAT32, "sum").tobytes()))
    return res


def test_crossover_and_switch():
    """The rule outside the measuring (ll_crossover: RINGTREE_TUNE=model turns it off)."""
    model = {"RINGTREE_TUNE": "model"}
    for r, res in enumerate(run_ranks(at_crossover, 2, timeout=60, env=model)):
        assert [(d, ok) for _, d, ok in res] == [(False, True), (True, True)], (r, res)
    for r, res in enumerate(run_ranks(at_crossover, 2, timeout=60,
                                      env={**model, "RINGTREE_CMA": "0"})):
        assert [(d, ok) for _, d, ok in res] == [(False, True), (False, True)], (r, res)


def test_where_it_applies():
    """2 ranks and more from their MIN_BYTES, or where RINGTREE_CMA_MIN says; no PREMUL_SUM;
    the other collectives as ll_direct decides."""
    def direct(n: int, least: int | None):
        return SimpleNamespace(ll=SimpleNamespace(n=n), min_bytes=least, measured={},
                               applies=lambda *a: "ll_direct's")
    ar, big, code = Collective.ALL_REDUCE, ll_direct_fold.MIN_BYTES[False] // 4, ReduceOp.SUM.code
    assert ll_direct_fold.applies(direct(2, None), ar, big, 4, code)
    assert not ll_direct_fold.applies(direct(2, None), ar, big - 1, 4, code)
    more = ll_direct_fold.MIN_BYTES[True] // 4
    assert more > big
    assert ll_direct_fold.applies(direct(4, None), ar, more, 4, code)
    assert not ll_direct_fold.applies(direct(4, None), ar, more - 1, 4, code)
    assert not ll_direct_fold.applies(direct(3, None), ar, big, 4, code)
    assert ll_direct_fold.applies(direct(4, 1), ar, 1, 4, code)
    assert not ll_direct_fold.applies(direct(2, 1), ar, big, 4, ReduceOp.PREMUL_SUM.code)
    assert not ll_direct_fold.applies(None, ar, big, 4, code)
    measured = direct(2, None)  # an octave measured on the communicator (ll_crossover)
    measured.measured[(big * 4).bit_length()] = False
    assert not ll_direct_fold.applies(measured, ar, big, 4, code)
    assert ll_direct_fold.applies(direct(2, None), Collective.ALL_GATHER, 1, 4, 0) == \
        "ll_direct's"


def _killed(comm):
    x = np.ones(3001, np.float32)
    return killed_peer(comm, lambda: comm.all_reduce(x, out=np.empty_like(x)))


def test_a_killed_peer_is_named():
    assert_killed_named(run_ranks(_killed, 3, timeout=60, env={**ALL_DIRECT, **KILL_ENV}))


def rank_1_cannot(comm, move: str, in_place: bool) -> tuple[str, bool]:
    """Rank 1's reads (or writes) of rank 0's buffers fail (EFAULT: rank 0 posts an
    address it has not mapped, so the kernel refuses the move, in C or in Python): the
    error, and whether the rank's input kept its values."""
    x = np.arange(10001, dtype=np.float32) + comm.rank
    keep = x.copy()
    out = x if in_place else np.empty_like(x)
    if comm.rank == 0:
        post_unmapped(ll_direct_fold, {"read": x, "write": out}[move])
    try:
        comm.all_reduce(x, out=out)
    except RingtreeError as e:
        return str(e), np.array_equal(x, keep)
    return "no error", np.array_equal(x, keep)


@pytest.mark.parametrize("move,in_place,native", [
    ("read", False, "1"), ("write", False, "1"), ("read", True, "1"), ("read", False, "0"),
    ("write", False, "0")])
def test_a_failed_read_or_write_is_raised_on_every_rank(move, in_place, native):
    verb = "read" if move == "read" else "write into"
    env = {**ALL_DIRECT, "RINGTREE_LL_NATIVE": native}
    for msg, kept in run_ranks(rank_1_cannot, 2, move, in_place, timeout=60, env=env):
        assert f"rank 1 could not {verb} rank 0's buffer" in msg, msg
        # out of place no input is written (in place a rank's output is its input)
        assert kept or in_place, msg


def test_fold_push_refuses_bad_arguments():
    """The compiled loop names what is wrong before it moves anything."""
    if not ll_direct_fold.native.pushes():
        pytest.skip("no compiled _llc")
    own, dst, s = np.ones(8, np.float32), np.zeros(8, np.float32), np.empty(64, np.uint8)
    f32, add = DType.FLOAT32.code, ReduceOp.SUM.code
    push = ll_direct_fold.native.fold_push
    cases = [((0, 0), (0, 0), None, (0, 5), "out of range"),
             ((0,), (0, 0), None, (0, 1), "pids: expected 2"),
             ((0, 0), (0, 0), (0, 0), (0,), "2 to 256 ranks")]
    for pids, ins, outs, order, msg in cases:
        with pytest.raises(ValueError, match=msg):
            push(pids, ins, outs, order, 0, own, dst, 0, f32, add, 16, s)
    with pytest.raises(ValueError, match="scratch"):
        push((0, 0), (0, 0), None, (0, 1), 0, own, dst, 0, f32, add, 128, s)
    with pytest.raises(ValueError, match="whole items"):
        push((0, 0), (0, 0), None, (0, 1), 0, own, dst, 0, f32, add, 6, s)
    assert not dst.any()  # nothing moved
