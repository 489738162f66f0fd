"""The online choice (ringtree.tuning.autotune); its bitwise rule is proved in
``test_online_choice_bits.py``.

Without the testbed: which candidates the model hands over for measuring. On the 2×2
testbed (1 Gbit/s, the
link read from a topology file so the model, and with it every decision to measure, is
the same on every run): every rank makes the same decision from the same agreed numbers;
the caller's buffers are never touched by the measuring and the results are bitwise
those of a forced call; a reduction is measured only among candidates with its model
choice's bits, and those really give the same bits on random floats; a (collective,
size) is measured once; async calls, groups and sub-communicators; ``RINGTREE_TUNE=model``
and ``RINGTREE_ALGO``; a peer that dies while the others measure. Nothing here asserts a
time.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from ringtree.ir.program import Collective
from ringtree.testbed import available
from ringtree.tuning.autotune import MARGIN, MAX_CANDIDATES, MAX_PREDICTED, candidates
from ringtree.tuning.same_bits import same_bits

TWO_BY_TWO = (0, 0, 1, 1)
SIZES = (8, 256, 8192, 256 << 10)
COLLS = ("all_gather", "broadcast", "all_reduce", "reduce_scatter", "reduce")


# ---- the model's candidates -----------------------------------------------------------

def test_candidates_are_the_close_ones_with_the_models_choice():
    ranked = [("a", 100e-6), ("b", 120e-6), ("c", 139e-6), ("d", 141e-6), ("e", 500e-6)]
    assert [a for a, _ in candidates(ranked, "a")] == ["a", "b", "c"]
    assert MARGIN == pytest.approx(0.40) and MAX_CANDIDATES == 3
    # the model's choice (here a tie-break default, not the least estimate) stays in
    ranked = [("a", 100e-6), ("b", 101e-6), ("c", 102e-6), ("d", 103e-6)]
    assert [a for a, _ in candidates(ranked, "d")] == ["a", "b", "d"]
    # one close candidate only, or a slow best: the model decides alone
    assert candidates([("a", 100e-6), ("b", 200e-6)], "a") == []
    assert candidates([("a", 2 * MAX_PREDICTED), ("b", 2 * MAX_PREDICTED)], "a") == []
    assert candidates([], "a") == []


# ---- on the testbed ---------------------------------------------------------------------

ok, why = available()
needs_testbed = pytest.mark.skipif(not ok, reason=why or "testbed unavailable")


@pytest.fixture(scope="module")
def topo_file(tmp_path_factory):
    from ringtree.sim.machine import cluster as simtopo

    path = tmp_path_factory.mktemp("topo") / "2x2.json"
    simtopo.save(simtopo.fat_tree(2, gpus_per_node=2, nics_per_node=1, nic_gbps=1.0,
                                  name="tb"), path)
    return str(path)


@pytest.fixture(scope="module")
def bed():
    from ringtree.testbed import Testbed

    with Testbed(2, rate="1gbit") as tb:
        yield tb


@pytest.fixture(scope="module")
def pool(bed, topo_file):
    from ringtree.testbed.pool import HostPool

    with HostPool(bed, 2, env={"RINGTREE_TOPO_FILE": topo_file}, timeout=180) as p:
        yield p


def _args(coll: str, nbytes: int, n: int, rank: int, seed: int):
    """(input, kwargs) of one call: random floats (sums that depend on the order) for
    reductions, distinct integers as floats for data movement."""
    rng = np.random.default_rng(seed * 1000 + rank)
    elems = max(1, nbytes // 4)
    if coll == "all_gather":
        return np.arange(max(1, elems // n), dtype=np.float32) + 1000 * rank, {}
    if coll == "broadcast":
        return np.arange(elems, dtype=np.float32) + 1000 * rank, {"root": 1}
    if coll == "reduce_scatter":
        return rng.standard_normal(max(n, elems // n * n)).astype(np.float32), {}
    if coll == "reduce":
        return rng.standard_normal(elems).astype(np.float32), {"root": 2}
    return rng.standard_normal(elems).astype(np.float32), {}


def _call(comm, coll: str, x: np.ndarray, kw: dict, algo=None, async_op=False):
    """Run ``coll`` into fresh outputs (filled with -1). The collectives that only read
    their input get ``x`` itself; broadcast and all_reduce, which write theirs, a copy.
    Returns the result."""
    n = comm.size
    if coll == "all_gather":
        out = np.full(x.size * n, -1, np.float32)
        w = comm.all_gather(x, out=out, algo=algo, async_op=async_op)
    elif coll == "reduce_scatter":
        out = np.full(x.size // n, -1, np.float32)
        w = comm.reduce_scatter(x, out=out, algo=algo, async_op=async_op)
    elif coll == "reduce":
        out = np.full(x.size, -1, np.float32)
        w = comm.reduce(x, out=out, algo=algo, async_op=async_op, **kw)
    else:
        out = x.copy()
        w = getattr(comm, coll)(out, algo=algo, async_op=async_op, **kw)
    if async_op:
        w.wait()
    return out


def _nbytes(comm, coll: str, x: np.ndarray) -> int:
    """The bytes the planner keys its choice by (every block of the bigger buffer)."""
    n = comm.size
    return x.nbytes * (n if coll == "all_gather" else 1)


def _expected_movement(comm, coll: str, n: int, nbytes: int) -> np.ndarray:
    xs = [_args(coll, nbytes, n, r, 0)[0] for r in range(n)]
    return np.concatenate(xs) if coll == "all_gather" else xs[1]


def _model_view(comm, coll: Collective, nbytes: int, root: int):
    """What the model alone says: its choice, and the candidates it hands over with
    those of them that give its choice's bits (recomputed here from the planner's own
    model and options, as every rank does)."""
    from ringtree.tuning.autotune import REDUCTIONS
    from ringtree.tuning.tuner import ranking

    p = comm.planner
    first, chosen = p._choices[(coll, nbytes)]
    enabled = {a for a in (p.algo_enabled.get(coll) or ()) if not a.startswith(("collnet", "nvls"))}
    near = [a for a, _ in candidates(ranking(coll, nbytes, comm.size, enabled, p.model(),
                                             p._options(coll, nbytes)), first)]
    if coll in REDUCTIONS:
        o = p._options(coll, nbytes, root)
        nout = coll.blocks(comm.size)[1]
        count = nbytes // 4 // (comm.size if coll is Collective.REDUCE_SCATTER else 1)
        in_place = coll is Collective.ALL_REDUCE  # _call's all_reduce runs in place
        same = [a for a in near
                if same_bits(coll, first, a, comm.size, o, (count,) * nout, in_place)]
    else:
        same = list(near)
    return first, chosen, near, same


def tune_every_size(comm, colls, sizes):
    """Each (collective, size) twice with the default choice; per call what was decided,
    how many calls it took, and whether the results were right."""
    from ringtree.ir.program import parse_collective

    n, rows = comm.size, []
    for coll in colls:
        c = parse_collective(coll)
        for nbytes in sizes:
            x, kw = _args(coll, nbytes, n, comm.rank, 0)
            keep = x.copy()
            seq = comm.seq
            got = _call(comm, coll, x, kw)
            first_calls = comm.seq - seq
            nb = _nbytes(comm, coll, x)
            model, chosen, near, same = _model_view(comm, c, nb, kw.get("root", 0))
            d = comm.planner.online.decisions.get((c, nb))
            seq = comm.seq
            again = _call(comm, coll, x, kw)
            second_calls = comm.seq - seq
            problems = []
            if not np.array_equal(x.view(np.uint32), keep.view(np.uint32)):
                problems.append("the caller's input changed")
            if coll in ("broadcast", "all_gather"):
                if not np.array_equal(got, _expected_movement(comm, coll, n, nbytes)):
                    problems.append("wrong data")
            if coll != "reduce" or comm.rank == kw["root"]:
                for algo in {model, chosen, *same}:  # every candidate with the same bits
                    forced = _call(comm, coll, x, kw, algo=algo)
                    if forced.tobytes() != got.tobytes():
                        problems.append(f"bits differ from a forced {algo} call")
            else:
                if not (got == -1).all():
                    problems.append("a non-root's out was written")
                for algo in {model, chosen, *same}:
                    _call(comm, coll, x, kw, algo=algo)  # the root needs everyone
            if again.tobytes() != got.tobytes():
                problems.append("a second call gave other bits")
            rows.append({"coll": coll, "nbytes": nb, "model": model, "chosen": chosen,
                         "near": near, "same": same, "first_calls": first_calls,
                         "second_calls": second_calls, "problems": problems,
                         "decision": None if d is None else
                         (d.candidates, d.times, d.choice, d.model, d.excluded)})
    return rows


def _ok(results):
    for r, res in enumerate(results):
        assert not isinstance(res, BaseException), f"rank {r}: {res!r}"
    return results


@needs_testbed
def test_every_rank_decides_the_same_and_results_keep_their_bits(pool):
    ranks = _ok(pool.run(tune_every_size, COLLS, SIZES))
    for r, rows in enumerate(ranks):
        assert rows == ranks[0], f"rank {r} decided otherwise than rank 0"
    kinds = set()
    for row in ranks[0]:
        what = f"{row['coll']} {row['nbytes']} B: {row}"
        assert not row["problems"], what
        assert row["second_calls"] == 1, what  # cached: a later call measures nothing
        measured = len(row["same"]) >= 2
        if measured:
            cands, times, choice, model, excluded = row["decision"]
            assert set(cands) == set(row["same"]) and row["chosen"] == choice, what
            assert choice == min(zip(times, cands))[1] and model == row["model"], what
            assert set(excluded) == set(row["near"]) - set(row["same"]), what
            assert row["first_calls"] > 1 + 2 * len(cands), what  # warm-up, rounds, agree
            kinds.add("reduction" if row["coll"] in ("all_reduce", "reduce_scatter",
                                                      "reduce") else "movement")
        else:
            assert row["decision"] is None and row["chosen"] == row["model"], what
            assert row["first_calls"] == 1, what
            if len(row["near"]) >= 2:
                kinds.add("reduction kept for its bits")
    # the 2x2 model hands close candidates of every kind over: if it stops doing so,
    # this test no longer tests what it says
    assert kinds == {"movement", "reduction", "reduction kept for its bits"}, kinds


def tune_async_group_and_split(comm):
    """Fresh sizes issued async, inside a group, and on sub-communicators of one rank
    per host: the results, and each communicator's decisions."""
    n, out = comm.size, {}
    x = np.arange(64, dtype=np.float32) + 1000 * comm.rank
    got = _call(comm, "all_gather", x, {}, async_op=True)
    want = np.concatenate([np.arange(64, dtype=np.float32) + 1000 * r for r in range(n)])
    out["async"] = bool(np.array_equal(got, want))
    y = np.arange(128, dtype=np.float32) + 1000 * comm.rank
    g = np.zeros(128 * n, np.float32)
    z = np.full(32, float(comm.rank + 1), np.float32)
    with comm.group():
        w = comm.all_gather(y, out=g, async_op=True)
        comm.all_reduce(z)
    w.wait()
    want = np.concatenate([np.arange(128, dtype=np.float32) + 1000 * r for r in range(n)])
    out["group"] = bool(np.array_equal(g, want)) and bool((z == n * (n + 1) / 2).all())
    sub = comm.split(comm.rank % 2)
    s = np.arange(40, dtype=np.float32) + 1000 * sub.rank
    got = sub.all_gather(s)
    out["split"] = bool(np.array_equal(got.reshape(-1), np.concatenate(
        [np.arange(40, dtype=np.float32) + 1000 * r for r in range(sub.size)])))
    out["split_hosts"] = sorted(set(sub.nodes))
    out["split_online"] = sub.planner.online is not None
    out["decisions"] = {f"{k[0].value}/{k[1]}": (d.candidates, d.times, d.choice)
                        for k, d in comm.planner.online.decisions.items()}
    out["split_decisions"] = {f"{k[0].value}/{k[1]}": (d.candidates, d.times, d.choice)
                              for k, d in sub.planner.online.decisions.items()}
    sub.close()
    return out


@needs_testbed
def test_async_group_and_sub_communicators_agree(pool):
    res = _ok(pool.run(tune_async_group_and_split))
    for r, o in enumerate(res):
        assert o["async"] and o["group"] and o["split"], f"rank {r}: {o}"
        assert o["split_hosts"] == [0, 1] and o["split_online"], f"rank {r}: {o}"
        assert o["decisions"] == res[0]["decisions"], f"rank {r}"
    for a, b in ((0, 2), (1, 3)):  # the two sub-communicators, one rank per host each
        assert res[a]["split_decisions"] == res[b]["split_decisions"]
    assert any(k.startswith("all_gather/") for k in res[0]["decisions"]), res[0]


def tune_one_octave(comm, per_rank: tuple[int, ...]):
    """All-gathers of ``per_rank`` floats per rank, in order: per call the calls it took,
    its decision (candidates, choice, bytes measured at, seconds) and the model's
    candidates for its size."""
    from ringtree.tuning.autotune import candidates
    from ringtree.tuning.tuner import ranking

    p, c, rows = comm.planner, Collective.ALL_GATHER, []
    enabled = {a for a in p.algo_enabled[c] if not a.startswith(("collnet", "nvls"))}
    for elems in per_rank:
        x = np.arange(elems, dtype=np.float32) + 1000 * comm.rank
        seq = comm.seq
        got = comm.all_gather(x)
        calls = comm.seq - seq
        nb = x.nbytes * comm.size
        first, _ = p._choices[(c, nb)]
        near = [a for a, _ in candidates(ranking(c, nb, comm.size, enabled, p.model(),
                                                 p._options(c, nb)), first)]
        d = p.online.decisions.get((c, nb))
        want = np.concatenate([np.arange(elems, dtype=np.float32) + 1000 * r
                               for r in range(comm.size)])
        rows.append((nb, calls, near, None if d is None else
                     (d.candidates, d.choice, d.measured_at, d.seconds > 0),
                     bool(np.array_equal(got.reshape(-1), want))))
    return rows


@needs_testbed
def test_a_size_in_a_measured_octave_takes_its_winner(pool):
    """40 KiB measured, then 48 KiB (the same octave) takes its winner without a call
    more, while 64 KiB (the next octave) is measured again; every rank agrees. (Sizes no
    other test of this pool's communicators calls.)"""
    res = _ok(pool.run(tune_one_octave, (2560, 3072, 4096)))
    assert all(r == res[0] for r in res), res
    (nb0, calls0, near0, d0, ok0), (nb1, calls1, near1, d1, ok1), \
        (nb2, calls2, near2, d2, ok2) = res[0]
    assert (nb0, nb1, nb2) == (40960, 49152, 65536) and ok0 and ok1 and ok2
    assert len(near0) >= 2 and d0 is not None and d0[2] == nb0 and d0[3], res[0]
    assert calls0 > 1, res[0]                     # measured
    assert d0[1] in near1, f"the test needs 40 KiB's winner among 48 KiB's candidates: {res[0]}"
    assert calls1 == 1 and d1 is not None and d1[1] == d0[1] and d1[2] == nb0 and not d1[3]
    if len(near2) >= 2:                           # another octave: measured afresh
        assert calls2 > 1 and d2 is not None and d2[2] == nb2 and d2[3], res[0]


def short_deadline_first(comm, sizes):
    """All-reduces first called with a short ``timeout=``, then with the default one: per
    size the close candidates, the calls each took (the second: one, nothing measured
    later), whether a measurement was recorded, the choice, and the bits against a forced
    call of the model's choice."""
    c, rows = Collective.ALL_REDUCE, []
    for nbytes in sizes:
        x, _ = _args("all_reduce", nbytes, comm.size, comm.rank, 3)
        seq = comm.seq
        got = comm.all_reduce(x.copy(), timeout=0.3)
        calls = comm.seq - seq
        model, chosen, near, _ = _model_view(comm, c, x.nbytes, 0)
        seq = comm.seq
        again = comm.all_reduce(x.copy())
        later = comm.seq - seq
        forced = comm.all_reduce(x.copy(), algo=model)
        rows.append((len(near), calls, later, (c, x.nbytes) in comm.planner.online.decisions,
                     chosen == model, got.tobytes() == forced.tobytes() == again.tobytes()))
    return rows


@needs_testbed
def test_a_short_deadline_keeps_the_models_choice(pool):
    """A first call whose ``timeout=`` leaves less than the measuring needs does not
    measure (it would fail as a timeout): the ranks agree on the least time left (one
    all-reduce), keep the model's choice for that size, and later calls take it as it
    is. (Sizes no other test of this pool's communicators calls.)"""
    res = _ok(pool.run(short_deadline_first, (24 << 10, 96 << 10)))
    assert all(r == res[0] for r in res), res
    for near, calls, later, measured, model_kept, bits in res[0]:
        assert near >= 2, f"the test needs a size the model hands over for measuring: {res[0]}"
        assert calls == 2 and later == 1 and not measured and model_kept and bits, res[0]


def tune_integer_reduce_scatter(comm, elems: int):
    """A reduce-scatter of ``elems`` int32 (wrapping sums) and then of as many float32, at
    sizes no other test calls: per call the calls it took, its decision and whether its
    bits equal forced calls of every candidate measured (and, for the integers, the
    exact sums)."""
    p, c, n, r, rows = comm.planner, Collective.REDUCE_SCATTER, comm.size, comm.rank, []
    rng = np.random.default_rng(7 + r)
    for dt, x in ((np.int32, rng.integers(-2**31, 2**31 - 1, elems, dtype=np.int32)),
                  (np.float32, rng.standard_normal(elems + 4 * n).astype(np.float32))):
        seq = comm.seq
        got = comm.reduce_scatter(x)
        calls = comm.seq - seq
        d = p.online.decisions.get((c, x.nbytes))
        forced = [comm.reduce_scatter(x, algo=a).tobytes() == got.tobytes()
                  for a in (d.candidates if d is not None else ())]
        exact = None
        if dt is np.int32:
            xs = [np.random.default_rng(7 + q).integers(-2**31, 2**31 - 1, elems,
                                                         dtype=np.int32) for q in range(n)]
            with np.errstate(over="ignore"):
                total = np.sum(xs, axis=0, dtype=np.int32)  # wraps, as every schedule
            exact = bool(np.array_equal(got, total.reshape(n, -1)[r]))
        rows.append((np.dtype(dt).name, calls, None if d is None else
                     (d.candidates, d.choice, d.excluded), forced, exact))
    return rows


@needs_testbed
def test_integer_reductions_are_measured_among_every_close_candidate(pool):
    """Halving and hierarchical reduce-scatters associate differently, so a float one is
    never measured; an integer sum is exact in any order, so it is, and every candidate
    gives the exact wrapped sums, the same bits on every rank."""
    res = _ok(pool.run(tune_integer_reduce_scatter, 512))
    for r, rows in enumerate(res):
        (name_i, calls_i, d_i, forced_i, exact_i), (name_f, calls_f, d_f, _, _) = rows
        assert name_i == "int32" and name_f == "float32"
        assert d_i is not None and len(d_i[0]) >= 2 and not d_i[2], f"rank {r}: {rows}"
        assert calls_i > 1 and all(forced_i) and exact_i, f"rank {r}: {rows}"
        assert d_f is None and calls_f == 1, f"rank {r}: {rows}"
        assert (d_i[0], d_i[1]) == (res[0][0][2][0], res[0][0][2][1]), f"rank {r} decided otherwise"


def model_only(comm, sizes):
    from ringtree.ir.program import Collective
    from ringtree.tuning.tuner import choose

    p, rows = comm.planner, []
    for nbytes in sizes:
        x = np.arange(max(1, nbytes // 4 // comm.size), dtype=np.float32)
        seq = comm.seq
        comm.all_gather(x)
        nb = x.nbytes * comm.size
        enabled = {a for a in p.algo_enabled[Collective.ALL_GATHER]
                   if not a.startswith(("collnet", "nvls"))}
        model = choose(Collective.ALL_GATHER, nb, comm.size, enabled, p.model(),
                       p._options(Collective.ALL_GATHER, nb))
        rows.append((comm.seq - seq, p._choices[(Collective.ALL_GATHER, nb)], model,
                     p.online is None, sorted(enabled)))
    return rows


@needs_testbed
def test_tune_model_gives_the_models_choice(bed, topo_file):
    from ringtree.testbed.pool import run_hosts

    res = _ok(run_hosts(bed, 2, model_only, SIZES, timeout=120,
                        env={"RINGTREE_TOPO_FILE": topo_file, "RINGTREE_TUNE": "model"}))
    for calls, (first, used), model, off, _ in res[0]:
        assert off and calls == 1 and first == used == model
    assert all(r == res[0] for r in res)


def restricted(comm, sizes):
    model_only(comm, sizes)
    return [(d.candidates, d.choice) for d in comm.planner.online.decisions.values()]


@needs_testbed
def test_algo_restriction_bounds_the_candidates(bed, topo_file):
    from ringtree.testbed.pool import run_hosts

    allowed = {"direct", "recursive_doubling", "bruck"}
    res = _ok(run_hosts(bed, 2, restricted, SIZES, timeout=120,
                        env={"RINGTREE_TOPO_FILE": topo_file,
                             "RINGTREE_ALGO": "allgather:" + ",".join(sorted(allowed))}))
    assert all(r == res[0] for r in res)
    assert res[0], "nothing was measured among the allowed all-gathers"
    for cands, choice in res[0]:
        assert set(cands) <= allowed and choice in cands


def die_or_gather(comm, nbytes: int, dead: int):
    """Rank ``dead`` exits; the others call an all-gather the model measures first."""
    if comm.rank == dead:
        os._exit(0)
    x = np.zeros(max(1, nbytes // 4 // comm.size), np.float32)
    t0 = time.monotonic()
    try:
        comm.all_gather(x, timeout=8)
    except Exception as e:  # noqa: BLE001 - the error is the result
        return type(e).__name__, str(e), time.monotonic() - t0
    return None, "finished", time.monotonic() - t0


@needs_testbed
@pytest.mark.parametrize("tune", ["online", "model"])
def test_a_dead_peer_while_measuring_raises_like_a_call(bed, topo_file, tune):
    """The peer dies before the first all-gather of a size the model hands over for
    measuring: the measuring calls fail the way the call itself does with tuning off
    (a peer error, or the abort it causes on the ranks that did not see it, naming the
    dead rank) within the call's deadline; nobody hangs."""
    from ringtree.testbed.pool import run_hosts

    res = run_hosts(bed, 2, die_or_gather, 256, 3, timeout=90,
                    env={"RINGTREE_TOPO_FILE": topo_file, "RINGTREE_TUNE": tune,
                         "RINGTREE_TIMEOUT": 8})
    for r in range(3):
        assert not isinstance(res[r], BaseException), f"rank {r}: {res[r]!r}"
        kind, msg, took = res[r]
        assert kind in ("PeerError", "CommAborted"), f"rank {r}: {kind}: {msg}"
        assert "rank 3 died" in msg, f"rank {r}: {kind}: {msg}"
        assert took < 8 + 5, f"rank {r} took {took:.1f} s"
