"""LL runs the Program Simple would run, to the bit: for every collective LL serves, the
LL plan and the Simple plan of the same Program (``algo="direct"``, which runs on Simple)
on the same inputs give the same bytes on every rank — integers and floats whose sums
are exact, and floats whose sums are not (both fold in the Program's order). Also: the
runner builds its op from the Program and refuses one it cannot run in one round, and
the checker proves the Programs LL runs like any other."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.ir.check import check_programs
from ringtree.ir.program import Collective
from ringtree.runtime import protocols
from ringtree.runtime.protocols.ll import one_shot
from ringtree.schedules import Options, generate
from ringtree.testing import RankPool

CASES = [("int32", "exact"), ("float32", "exact"), ("float64", "exact"),
         ("float32", "inexact"), ("float64", "inexact"), ("float16", "inexact")]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"n{n}")
def pool(request):
    with RankPool(request.param, env={"RINGTREE_PROTO": "LL"}) as p:
        yield p


def _input(rank: int, count: int, dtype: str, kind: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * salt + rank)
    if kind == "exact":  # small integers: every partial sum is exact in every dtype here
        return rng.integers(-1000, 1000, count).astype(dtype)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(dtype)


def _run(comm, coll: str, x: np.ndarray, op: str, algo: str | None) -> bytes:
    n, root = comm.size, 1 % comm.size
    y = x.copy()
    if coll == "all_reduce":
        comm.all_reduce(y, op, algo=algo)
    elif coll == "reduce":
        comm.reduce(y, root, op, algo=algo)
    elif coll == "reduce_scatter":
        y = comm.reduce_scatter(x, op, algo=algo)
    elif coll == "broadcast":
        comm.broadcast(y, root, algo=algo)
    else:
        y = comm.all_gather(x[: x.size // n], algo=algo)
    return y.tobytes()


def both(comm, counts: list[int]) -> list[str]:
    """Every (collective, dtype, op, count): LL's bytes against Simple's on this rank;
    the protocols that ran, from the flight recorder."""
    bad = []
    for salt, (dtype, kind) in enumerate(CASES):
        for coll in ("all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather"):
            ops = ("sum", "avg", "max") if coll in ("all_reduce", "reduce",
                                                    "reduce_scatter") else ("sum",)
            for op in ops:
                for count in counts:
                    x = _input(comm.rank, count * comm.size, dtype, kind, salt)
                    ll = _run(comm, coll, x, op, None)
                    ran = comm.flight.entries(1)[0]
                    simple = _run(comm, coll, x, op, "direct")
                    ran2 = comm.flight.entries(1)[0]
                    what = f"{coll} {dtype} {kind} {op} count={count}"
                    if (ran["proto"], ran["algo"], ran2["proto"], ran2["algo"]) != \
                            ("LL", "direct", "Simple", "direct"):
                        bad.append(f"{what}: ran {ran['algo']}/{ran['proto']} and "
                                   f"{ran2['algo']}/{ran2['proto']}")
                    elif ll != simple:
                        bad.append(f"{what}: LL and Simple differ")
    return bad


def test_ll_and_simple_give_the_same_bits(pool):
    counts = [1, 5, 24, 1000]  # inline and cell contributions
    for r, bad in enumerate(pool.run_ok(both, counts)):
        assert not bad, f"rank {r}: " + "; ".join(bad[:6])


@pytest.mark.parametrize("coll", [Collective.ALL_REDUCE, Collective.REDUCE,
                                  Collective.REDUCE_SCATTER, Collective.BROADCAST,
                                  Collective.ALL_GATHER, Collective.BARRIER],
                         ids=lambda c: c.value)
def test_the_programs_ll_runs_are_checked_and_read(coll):
    algo = protocols.algorithm(protocols.LL, coll)
    assert algo == "direct"
    for n in range(1, 9):
        for root in range(n) if coll in (Collective.REDUCE, Collective.BROADCAST) else [0]:
            progs = [generate(coll, algo, n, r, Options(root=root)) for r in range(n)]
            check_programs(progs)
            check_programs(progs, in_place=True)
            for r, p in enumerate(progs):
                shape = one_shot(p)
                if coll.reduces and coll is not Collective.BARRIER and \
                        (coll is not Collective.REDUCE or r == root):
                    assert shape.order == tuple(range(n)), (n, r, shape)
                if coll is Collective.REDUCE_SCATTER:
                    assert shape.block == (r if n > 1 else 0)
                if coll is Collective.ALL_GATHER:
                    assert shape.placed == tuple(range(n))


@pytest.mark.parametrize("coll,algo", [("all_reduce", "ring"), ("all_reduce", "direct2"),
                                       ("broadcast", "tree"), ("reduce", "ring")])
def test_the_runner_refuses_a_program_of_more_than_one_round(coll, algo):
    prog = generate(coll, algo, 4, 0, Options())
    with pytest.raises(ValueError, match="one-round|folds|one-channel"):
        one_shot(prog)


def test_several_channels_are_refused():
    prog = generate("all_reduce", "direct", 3, 0, Options(channels=2))
    with pytest.raises(ValueError, match="one-channel"):
        one_shot(prog)
