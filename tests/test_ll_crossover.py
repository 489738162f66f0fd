"""The single-copy all-reduce's, all-gather's and broadcast's crossover measured on the
communicator
(``runtime/protocols/ll_crossover.py``): once per octave inside the band, the same
choice on every rank, the rank-order bits whichever path runs, off with
``RINGTREE_TUNE=model`` and ``RINGTREE_CMA_MIN``; the rule's margin; a peer dead during
the measuring named."""

from __future__ import annotations

import errno
import os
import signal
import time

import numpy as np
from hot_entry_cases import KILL_ENV, assert_killed_named

import ringtree
from ringtree.runtime.protocols import ll_direct_entry, ll_direct_fold, ll_timing
from ringtree.runtime.protocols.ll_crossover import BAND, BCAST_BAND, GATHER_BAND, GATHER_OWN
from ringtree.runtime.protocols.ll_direct_entry import Compiled
from ringtree.runtime.protocols.ll_timing import calls_per_sample, choose
from ringtree.testing import run_ranks
from ringtree.transports import shm_cma as cma

MIB = 1 << 20


def _exact(rank: int, count: int) -> np.ndarray:
    """float32 values whose sums over a few ranks are exact in any order."""
    return ((np.arange(count) * (rank + 3)) % 1024).astype(np.float32)


def in_band(comm) -> dict:
    """float32 sums at 1 MiB, 1.5 MiB (the same octave) and 2 MiB, in place and not."""
    ok = []
    for count in (MIB // 4, 3 * MIB // 8, MIB // 2):
        x = _exact(comm.rank, count)
        want = sum(_exact(r, count) for r in range(comm.size))
        got = comm.all_reduce(x, out=np.empty_like(x))
        comm.all_reduce(x)
        ok.append(got.tobytes() == want.tobytes() == x.tobytes())
    log = comm.ll.crossover.log
    return {"ok": ok, "bytes": [m.nbytes for m in log],
            "chosen": [m.chose_first for m in log],
            "times": all(m.first > 0 and m.second > 0 and m.ratios[0] <= m.ratios[1]
                         for m in log),
            "measured": dict(comm.ll.direct.measured)}


def test_measured_once_per_octave_and_alike_on_every_rank():
    res = run_ranks(in_band, 2, timeout=120)
    for r in res:
        assert r["ok"] == [True] * 3, r
        assert r["bytes"] == [MIB, 2 * MIB] and r["times"], r
        assert r["measured"] == {MIB.bit_length(): r["chosen"][0],
                                 (2 * MIB).bit_length(): r["chosen"][1]}, r
    assert res[0]["chosen"] == res[1]["chosen"]


def three_ranks(comm) -> tuple[bool, list[int]]:
    x = _exact(comm.rank, MIB)  # 4 MiB: in the band of more than 2 ranks
    want = sum(_exact(r, MIB) for r in range(comm.size))
    comm.all_reduce(x)
    return x.tobytes() == want.tobytes(), [m.nbytes for m in comm.ll.crossover.log]


def test_more_ranks_measure_from_their_band():
    assert BAND[True][0] <= 4 * MIB < BAND[True][1]
    for r in run_ranks(three_ranks, 3, timeout=120):
        assert r == (True, [4 * MIB]), r


def gathers(comm) -> dict:
    """All-gathers of 8, 12 (the same octave) and 16 MiB of output, then the 8 MiB one
    again (now planned): every block in place, measured once per octave."""
    ok = []
    for mib in (8, 12, 16, 8):
        count = (mib * MIB) // 4 // comm.size
        out = np.empty(count * comm.size, np.float32)
        comm.all_gather(_exact(comm.rank, count), out=out)
        want = np.concatenate([_exact(r, count) for r in range(comm.size)])
        ok.append(out.tobytes() == want.tobytes())
    log = comm.ll.crossover.log
    return {"ok": ok, "bytes": [m.nbytes for m in log], "chosen": [m.chose_first for m in log],
            "measured": dict(comm.ll.direct.measured_gather),
            "modes": len(comm.ll.crossover.modes)}


def test_the_all_gather_is_measured_once_per_octave_and_alike_on_every_rank():
    assert GATHER_BAND[False][0] <= 8 * MIB < 16 * MIB < GATHER_BAND[False][1]
    res = run_ranks(gathers, 2, timeout=120)
    for r in res:
        assert r["ok"] == [True] * 4, r
        assert r["bytes"] == [8 * MIB, 16 * MIB], r
        assert r["measured"] == {(8 * MIB).bit_length(): r["chosen"][0],
                                 (16 * MIB).bit_length(): r["chosen"][1]}, r
    assert res[0]["chosen"] == res[1]["chosen"]


def broadcasts(comm) -> dict:
    """Broadcasts of 64 KiB, 96 KiB (the same octave) and 128 KiB from rank 1, then the
    64 KiB one again (now planned): the root's bytes on every rank, measured once per
    octave, the choice taken (the op that runs is the single copy where it was)."""
    ok, ran = [], []
    for kib in (64, 96, 128, 64):
        count = kib * 1024 // 4
        x = _exact(comm.rank, count)
        comm.broadcast(x, 1)
        ok.append(x.tobytes() == _exact(1, count).tobytes())
        plan = comm.planner._last
        ran.append(type(plan.ll_op).__name__ if plan is not None else None)
    log = comm.ll.crossover.log
    return {"ok": ok, "bytes": [m.nbytes for m in log], "chosen": [m.chose_first for m in log],
            "measured": dict(comm.ll.direct.measured_bcast), "ran": ran}


def test_the_broadcast_is_measured_once_per_octave_and_alike_on_every_rank():
    assert BCAST_BAND[False][0] <= 64 * 1024 < 128 * 1024 < BCAST_BAND[False][1]
    res = run_ranks(broadcasts, 2, timeout=120)
    for r in res:
        assert r["ok"] == [True] * 4, r
        assert r["bytes"] == [64 * 1024, 128 * 1024], r
        assert r["measured"] == {(64 * 1024).bit_length(): r["chosen"][0],
                                 (128 * 1024).bit_length(): r["chosen"][1]}, r
        kinds = ["BroadcastOp" if c else "LLOp" for c in r["chosen"]]
        assert r["ran"][:3] == [kinds[0], kinds[0], kinds[1]], r
    assert res[0]["chosen"] == res[1]["chosen"]


def gather_modes(comm) -> dict:
    """An all-gather of 32 MiB a rank (its own buffers measured: the read mode, then the
    path), then its octave forced onto the other read mode: every block exact both
    times, the input untouched."""
    count = GATHER_OWN // 4
    x = _exact(comm.rank, count)
    want = np.concatenate([_exact(r, count) for r in range(comm.size)])
    out = np.empty(count * comm.size, np.float32)
    comm.all_gather(x, out=out)
    ok = [out.tobytes() == want.tobytes()]
    d, k = comm.ll.direct, (count * comm.size * 4).bit_length()
    table = dict(d.straight_gather)
    d.measured_gather[k] = True  # the single copy, in the mode not chosen
    d.straight_gather[k] = not d.straight_gather[k]
    comm.planner.relayout(comm.planner.nodes)
    out[...] = 0
    comm.all_gather(x, out=out)
    ok.append(out.tobytes() == want.tobytes())
    ok.append(x.tobytes() == _exact(comm.rank, count).tobytes())
    modes = comm.ll.crossover.modes
    return {"ok": ok, "modes": [(m.nbytes, m.chose_first) for m in modes], "table": table,
            "k": k}


def test_the_all_gather_measures_its_read_mode_on_its_own_buffers():
    """From GATHER_OWN bytes a rank the single copy's read mode (shared pieces or
    straight reads) is measured once, alike on every rank, before the path; below it,
    never (the octaves measured on scratch keep the pieces)."""
    res = run_ranks(gather_modes, 2, timeout=180)
    for r in res:
        assert r["ok"] == [True] * 3, r
        (nbytes, shared), = r["modes"]
        assert nbytes == 2 * GATHER_OWN, r
        assert r["table"] == {r["k"]: not shared}, r
    assert res[0]["modes"] == res[1]["modes"]
    for r in run_ranks(gathers, 2, timeout=120):  # 8-16 MiB of output: scratch
        assert r["ok"] == [True] * 4 and r["modes"] == 0, r


def straight_offsets(comm, offsets_matter: bool) -> list:
    """Straight reads forced on an 8 MiB all-gather's octave, into an output at the
    peer's input's offset in a cache line and at 4 bytes from it, with the kernel's copy
    taken as slowed by offsets or not: whether each read bounced, and every block
    exact."""
    cma._offsets[:] = [offsets_matter]
    count = MIB  # 4 MiB a rank: 8 MiB of float32 output on 2 ranks (STREAM_MIN)
    d, k = comm.ll.direct, (count * comm.size * 4).bit_length()
    d.measured_gather[k] = d.straight_gather[k] = True
    d.push_large = False  # the reads, not the push above LL's range
    bounced: list = []
    real = d.read

    def read(q, spans, write=False, bounce=False):
        bounced.append(bounce)
        return real(q, spans, write, bounce)

    d.read = read
    x = _exact(comm.rank, count)
    want = np.concatenate([_exact(r, count) for r in range(comm.size)])
    # the peer's input's offset in a cache line (each process's allocator places its own)
    peer = int(comm.all_gather(np.array([x.ctypes.data % 64]))[1 - comm.rank, 0])
    got = []
    for shift in (0, 1):  # floats from the peer's input's offset in a cache line
        raw = np.zeros(count * comm.size + 32, np.float32)
        at = ((peer - raw.ctypes.data) % 64) // 4 + shift
        out = raw[at:at + count * comm.size]
        bounced.clear()
        comm.all_gather(x, out=out)
        got.append((out.tobytes() == want.tobytes(), list(bounced)))
    return got


def test_straight_reads_bounce_where_the_offsets_in_a_cache_line_differ():
    for r in run_ranks(straight_offsets, 2, True, timeout=60):
        assert r == [(True, [False]), (True, [True])], r
    for r in run_ranks(straight_offsets, 2, False, timeout=60):  # a host where they cost
        assert r == [(True, [False]), (True, [False])], r         # nothing: never


def agreed_push(comm, matters: list[bool]) -> dict:
    """An 8 MiB all-gather on 2 ranks (above LL's range), rank r taking offsets in a
    cache line as mattering per ``matters[r]``: what the ranks agreed, how each moved
    the peer's block (write or read), every block exact, the input untouched."""
    cma._offsets[:] = [matters[comm.rank]]
    count = MIB
    x = _exact(comm.rank, count)
    want = np.concatenate([_exact(r, count) for r in range(comm.size)])
    d, moves = comm.ll.direct, []
    real = d.read

    def read(q, spans, write=False, bounce=False):
        moves.append(write)
        return real(q, spans, write, bounce)
    d.read = read
    after = ll_direct_entry.Compiled.after  # the C entry's calls: their mode
    ll_direct_entry.Compiled.after = lambda self, *a: moves.append(("C", self.mode)) or \
        after(self, *a)
    out = np.empty(count * comm.size, np.float32)
    comm.all_gather(x, out=out)
    for _ in range(3):  # the hot path: the C entry, whose moves d.read does not see
        out[...] = 0
        comm.all_gather(x, out=out)
    return {"push": d.push_large, "moves": moves, "ok": out.tobytes() == want.tobytes()
            and x.tobytes() == _exact(comm.rank, count).tobytes()}


def test_two_ranks_push_above_lls_range_where_both_agree():
    """Where no rank finds offsets in a cache line slowing the kernel's copy, a 2-rank
    all-gather above LL's range pushes on both; where one does, both read."""
    for matters, push in (([False, False], True), ([False, True], False)):
        for r in run_ranks(agreed_push, 2, matters, timeout=60):
            assert r["push"] is push and r["ok"], r
            # Python's moves: writes (True) or reads (False); the C entry's: its mode
            want = {True, ("C", ll_direct_entry.PUSH)} if push else {False}
            assert r["moves"] and set(r["moves"]) <= want, r


def test_the_offsets_are_measured_once_and_a_failed_read_counts_them():
    saved, measure, read = list(cma._offsets), cma._measure_offsets, cma.read_spans
    calls = []
    try:
        cma._offsets.clear()
        cma._measure_offsets = lambda: calls.append(1) or measure()
        assert cma.offsets_matter() in (True, False)
        assert cma.offsets_matter() is cma._offsets[0] and calls == [1]

        def refused(*_a, **_k):
            raise OSError(errno.EPERM, "refused")
        cma.read_spans = refused
        assert measure() is True
    finally:
        cma._offsets[:], cma._measure_offsets, cma.read_spans = saved, measure, read


def pushes(comm) -> dict:
    """A 1 MiB all-gather (2 ranks: measured against the segment; more: below their
    band, the segment), then its octave forced onto the single copy, out of place and in
    place: every block exact, the input untouched, and how the single copy moved the
    blocks (one write a peer, no read)."""
    count = MIB // 4 // comm.size
    d, k = comm.ll.direct, (count * comm.size * 4).bit_length()
    x = _exact(comm.rank, count)
    want = np.concatenate([_exact(r, count) for r in range(comm.size)])
    out = np.empty(count * comm.size, np.float32)
    comm.all_gather(x, out=out)
    ok, measured = [out.tobytes() == want.tobytes()], dict(d.measured_gather)
    moves: list = []
    real = d.read

    def read(q, spans, write=False, bounce=False):
        moves.append((q, write, spans[0][2]))
        return real(q, spans, write, bounce)

    # calls the C entry made (its moves are not d.read's, but for a call it handed back
    # before the moves: a peer late, which with ranks on a shared core happens)
    entries: list = []
    handed: list = []
    real_after, real_rest = Compiled.after, Compiled._rest

    def after(self, *a):
        entries.append(self.mode)
        return real_after(self, *a)

    def rest(self, *a):
        handed.append(1)
        return real_rest(self, *a)

    d.read, Compiled.after, Compiled._rest = read, after, rest
    d.measured_gather[k] = True
    comm.planner.relayout(comm.planner.nodes)
    out[...] = 0
    comm.all_gather(x, out=out)
    inplace = np.zeros(count * comm.size, np.float32)
    mine = inplace[comm.rank * count:(comm.rank + 1) * count]
    mine[...] = x
    comm.all_gather(mine, out=inplace)
    ok += [out.tobytes() == want.tobytes(), inplace.tobytes() == want.tobytes(),
           x.tobytes() == _exact(comm.rank, count).tobytes()]
    Compiled.after, Compiled._rest = real_after, real_rest
    return {"ok": ok, "measured": measured, "k": k, "moves": sorted(moves),
            "entries": entries, "in_python": len(handed)}


def test_below_lls_range_the_single_copy_pushes_where_measured():
    """On 2 ranks a 1 MiB all-gather (below LL's 4 MiB) is measured against the segment,
    alike on every rank; on 3 it is not (their band starts above LL's range). Where the
    single copy runs there, each rank writes its input into every peer's output: in the
    C entry (where it is built), out of place and in place."""
    assert GATHER_BAND[False][0] <= MIB < GATHER_BAND[True][0]
    compiled = ll_direct_entry.available()
    for n in (2, 3):
        res = run_ranks(pushes, n, timeout=60)
        for me, r in enumerate(res):
            assert r["ok"] == [True] * 4, r
            peers = sorted((me + j) % n for j in range(1, n))
            writes = [(q, True, MIB // 4 // n * 4) for q in peers]
            assert r["moves"] == sorted(writes * (r["in_python"] if compiled else 2)), r
            assert r["entries"] == ([ll_direct_entry.PUSH] * 2 if compiled else []), r
            assert r["measured"] == ({r["k"]: res[0]["measured"][r["k"]]} if n == 2
                                     else {}), r


def gather_on(comm) -> bytes:
    count = 3 * MIB // comm.size
    x = np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32)
    return comm.all_gather(x).tobytes()


def test_the_all_gather_gives_the_same_bytes_on_both_paths():
    """The two paths the measuring picks between, each forced: the single copy (from 1
    byte) and the segment's streamed gather (LL, the single copy off), 3 ranks."""
    single = run_ranks(gather_on, 3, timeout=60, env={"RINGTREE_CMA_MIN": "1"})
    segment = run_ranks(gather_on, 3, timeout=60,
                        env={"RINGTREE_CMA": "0", "RINGTREE_PROTO": "allgather:LL"})
    assert len(set(single + segment)) == 1


def random_sum(comm) -> bytes:
    """Inexact float32 sums (the order of the adds shows in the bits)."""
    x = np.random.default_rng(comm.rank).standard_normal(3 * MIB // 8).astype(np.float32)
    return comm.all_reduce(x, out=np.empty_like(x)).tobytes()


def test_both_paths_give_the_same_bits():
    """What the measuring chooses between: the single copy (forced from 1 byte) and the
    split (the single copy off) on the same inexact inputs."""
    single = run_ranks(random_sum, 2, timeout=60, env={"RINGTREE_CMA_MIN": "1"})
    split = run_ranks(random_sum, 2, timeout=60, env={"RINGTREE_CMA": "0"})
    assert single[0] == single[1] == split[0] == split[1]


def untuned(comm) -> tuple[bool, bool]:
    x = _exact(comm.rank, 3 * MIB // 8)
    comm.all_reduce(x)
    comm.all_gather(_exact(comm.rank, 2 * MIB))  # 16 MiB of output on 2 ranks
    return comm.ll.crossover is None, comm.ll.direct.measured == {} and \
        comm.ll.direct.measured_gather == {}


def test_off_with_the_model_or_a_threshold():
    for env in ({"RINGTREE_TUNE": "model"}, {"RINGTREE_CMA_MIN": str(4 * MIB)}):
        assert run_ranks(untuned, 2, timeout=60, env=env) == [(True, True)] * 2, env


def test_the_rule():
    """The default (ll_direct_fold.MIN_BYTES) stands unless the other path was faster
    by more than the margin on every rank (ll_timing.choose; the single copy the first
    arm); samples of the same calls on every rank."""
    m = ll_timing.MARGIN
    assert choose(True, 1.0, 1.0) and not choose(False, 1.0, 1.0)  # a tie: the default
    assert choose(False, 0.5, 1 - m - 0.01)            # the single copy faster everywhere
    assert not choose(False, 0.5, 1.0)                 # ... but not on one rank
    assert not choose(True, 1 / (1 - m) + 0.01, 3.0)   # the split faster everywhere
    assert choose(True, 1.0, 3.0)
    assert calls_per_sample(1) == 64 and calls_per_sample(1 << 40) == 1
    assert calls_per_sample(MIB) == ll_timing.SAMPLE_BYTES // MIB
    lo, hi = BAND[False]
    assert lo <= ll_direct_fold.MIN_BYTES[False] < hi
    assert BAND[True][0] <= ll_direct_fold.MIN_BYTES[True] < BAND[True][1]


def dies_first(comm):
    """Rank 1 dies before its first all-reduce; the others' first one (4 MiB, in the
    band) measures, and waits on rank 1 in its first scratch call."""
    if comm.rank == 1:
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(_exact(comm.rank, MIB), timeout=30)
    except ringtree.RingtreeError as e:
        return getattr(e, "peer", None), str(e)
    return None, "no error"


def test_a_peer_dead_during_the_measuring_is_named():
    assert_killed_named(run_ranks(dies_first, 3, timeout=60, env=KILL_ENV))
