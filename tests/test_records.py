"""An algorithm is one record (:class:`ringtree.schedules.Algorithm`): the planner builds
its Programs with :func:`ringtree.schedules.build`, the function the simulator calls, and
the tuner prices each candidate with the options it would run with. Nothing above
``schedules/`` names an algorithm."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ringtree.ir.program import Collective
from ringtree.runtime.planner import Planner
from ringtree.schedules import Options, algorithms, build, options_for, record
from ringtree.tuning.links import Topology
from ringtree.tuning.tuner import MODELS, estimate, host_model, ranking

ROOT = Path(__file__).resolve().parent.parent / "ringtree"

LAYOUTS = {
    "one host": (0, 0, 0, 0),
    "2x2": (0, 0, 1, 1),
    "2x4": (0,) * 4 + (1,) * 4,
    "4x1": (0, 1, 2, 3),
    "uneven": (0, 0, 0, 1, 1),
}
SIZES = (8, 4 << 10, 1 << 20, 4 << 20, 64 << 20)
KEYS = [(c, a) for c in Collective for a in algorithms(c)]


def _built(coll: Collective, algo: str, n: int, rank: int, nbytes: int, opts: Options):
    try:
        return build(coll, algo, n, rank, nbytes, opts)
    except ValueError as e:
        return str(e)


def _planned(p: Planner, coll: Collective, algo: str, root: int, nbytes: int):
    try:
        return p.program(coll, algo, root, nbytes)
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("coll,algo", KEYS, ids=[f"{c.value}-{a}" for c, a in KEYS])
def test_the_planners_program_is_builds(coll, algo, layout):
    """For every algorithm, size and node layout, every rank's Program in the planner is
    the one :func:`build` gives for (collective, algorithm, nranks, rank, bytes, options
    of root, channels and nodes): the simulator's call gets what the runtime runs."""
    nodes = LAYOUTS[layout]
    n = len(nodes)
    root = n - 1 if coll.spec.rooted else 0
    for rank in range(n):
        p = Planner(rank, n, nodes, nchannels=1, slice_bytes=1 << 20, algo_enabled={},
                    link="tcp")
        for nbytes in SIZES:
            got = _planned(p, coll, algo, root, nbytes)
            want = _built(coll, algo, n, rank, nbytes, Options(root=root, nodes=nodes))
            assert got == want, (rank, nbytes)
            if not isinstance(got, str):
                assert got.meta == want.meta, (rank, nbytes)


def test_pieces_come_from_the_record_alone():
    """The hierarchical all-reduce runs in pieces from 256 KiB per piece and host, the
    others never: the record's per-size rule, which build applies per algorithm."""
    nodes = LAYOUTS["2x2"]
    base = Options(nodes=nodes)
    ar = Collective.ALL_REDUCE
    assert options_for(ar, "hierarchical", 1 << 20, base).param("pieces") == 2
    assert options_for(ar, "ring", 1 << 20, base) is base
    big = build(ar, "hierarchical", 4, 0, 1 << 20, base)
    small = build(ar, "hierarchical", 4, 0, (1 << 20) - 1, base)
    assert len(big.channels[0]) > len(small.channels[0])


@pytest.mark.parametrize("layout", ["2x2", "2x4", "uneven"])
def test_the_tuner_prices_the_program_each_candidate_runs(layout):
    """``ranking`` gives every candidate the estimate of the options build runs it with."""
    nodes = LAYOUTS[layout]
    n = len(nodes)
    topo = Topology(nodes, alpha=90e-6, bandwidth=1e9 / 8, source="test", cpus=2,
                    machines=(0,) * n)
    hm = host_model(topo, MODELS["shm_crowded"])
    base = Options(nodes=nodes)
    for coll in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        flat = {a for a in algorithms(coll) if not record(coll, a).switch}
        for nbytes in SIZES:
            got = dict(ranking(coll, nbytes, n, flat, hm, base))
            for a, t in got.items():
                assert t == estimate(coll, a, nbytes, n, hm, options_for(coll, a, nbytes, base))


def test_every_record_has_its_cost_formula_and_switch_flag():
    """``ringtree algo list`` prints each record's cost; only CollNet's need a switch."""
    for coll, algo in KEYS:
        rec = record(coll, algo)
        assert rec.cost, (coll, algo)
        assert (rec.collective, rec.name) == (coll, algo)
        assert bool(rec.switch) == algo.startswith(("collnet", "nvls")), (coll, algo)
    with pytest.raises(ValueError, match="no algorithm 'nope' for all_reduce"):
        record(Collective.ALL_REDUCE, "nope")


def _names_an_algorithm(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in set(algorithms()) - {"ring"}:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "ringtree.schedules.") and node.module != "ringtree.schedules.registry" \
                and node.module != "ringtree.schedules.stats":
            found.append(f"{path.name}:{node.lineno}: imports {node.module}")
    return found


def test_the_planner_and_the_tuner_name_no_algorithm():
    """They read records: no algorithm's name (the online choice's fixed ring aside) and
    no algorithm module's constants."""
    files = [ROOT / "runtime" / "planner.py", *sorted((ROOT / "tuning").glob("*.py"))]
    assert [hit for f in files for hit in _names_an_algorithm(f)] == []
