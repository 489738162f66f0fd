"""Symmetry folding and shared Programs: same answers as simulating every rank's own
Program, refused whenever the symmetry does not hold, and memory that does not grow with
the ranks folded away."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from ringtree.ir.program import Collective
from ringtree.schedules import Options, algorithms, generate
from ringtree.sim import count_for, simulate
from ringtree.sim.cli import main as sim_main
from ringtree.sim.compile import symbolic
from ringtree.sim.fold import choice, symmetry
from ringtree.sim.machine import cluster as T
from ringtree.sim.machine import presets

MiB = 1 << 20


def _slow_link(topo: T.Topology) -> T.Topology:
    """One NIC-to-leaf link (or the first link, 0 → 1) at half bandwidth: no symmetry."""
    links = list(topo.links)
    k = next((i for i, lk in enumerate(links) if topo.devices[lk.src].kind == "nic"),
             0)
    links[k] = replace(links[k], bandwidth=links[k].bandwidth / 2)
    return replace(topo, links=tuple(links), name=topo.name + "-slow")


def _slow_gpu(topo: T.Topology) -> T.Topology:
    """The last rank's device reduces at half speed."""
    devs = list(topo.devices)
    d = topo.ranks[-1]
    devs[d] = replace(devs[d], reduce_gbps=devs[d].reduce_gbps / 2 or 10.0)
    return replace(topo, devices=tuple(devs), name=topo.name + "-slowgpu")


SYMMETRIC = [lambda: presets.get("dgx_h100", 4), lambda: presets.get("dgx_a100_sharp", 2),
             lambda: presets.get("nvswitch", 8), lambda: presets.get("fat_tree2", 16),
             lambda: presets.get("fat_tree3", 64),
             lambda: presets.get("dgx_a100", 6, gpus_per_node=2, nics_per_node=2,
                                 leaf_ports=2),
             lambda: T.ring(8, 50, 500), lambda: presets.get("torus", 16),
             lambda: presets.get("switch", 6), lambda: presets.get("local", 8)]
ASYMMETRIC = [lambda: _slow_link(presets.get("dgx_h100", 4)),
              lambda: _slow_link(T.ring(8, 50, 500)),
              lambda: _slow_gpu(presets.get("fat_tree2", 16))]


def _both(coll, algo, topo, nbytes, model):
    folded = simulate(coll, algo, topo, nbytes, model=model)
    whole = simulate(coll, algo, topo, nbytes, model=model, symmetry=False)
    assert folded.time_ns == whole.time_ns, (coll, algo, topo.name, nbytes, model)
    assert whole.simulated == topo.nranks
    return folded


@pytest.mark.parametrize("make", SYMMETRIC)
def test_folding_equals_unfolded(make):
    topo = make()
    folded = 0
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for nbytes in (8, 3 * MiB + 12):
            for model in ("aware", "unaware"):
                r = _both(coll, "ring", topo, nbytes, model)
                folded += r.simulated < topo.nranks
    for algo in ("tree", "recursive_doubling", "direct"):       # no template: concrete
        _both("all_reduce", algo, topo, 2 * MiB, "aware")
    assert folded or symmetry.node_period(topo) in (0, topo.nranks)    # one node: no fold


@pytest.mark.parametrize("make", ASYMMETRIC)
def test_folding_refuses_asymmetric_runs(make):
    topo = make()
    opts = choice.options(topo)
    count = count_for(Collective.ALL_REDUCE, 3 * MiB, topo.nranks)
    t = symbolic.template("all_reduce", "ring", topo.nranks, opts)
    assert t is not None
    for aware in (True, False):
        assert symmetry.template_period(t, topo, list(topo.ranks), count, aware) == 0
        progs = choice.programs_for(Collective.ALL_REDUCE, "ring", topo, opts)
        assert symmetry.period(progs, topo, list(topo.ranks), count, aware) == 0
    for model in ("aware", "unaware"):
        r = _both("all_reduce", "ring", topo, 3 * MiB, model)
        assert r.simulated == topo.nranks           # nothing folded


def test_template_is_every_rank():
    """A template instantiated at any rank is that rank's generated Program; schedules
    that branch on the rank have none."""
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for algo in algorithms(coll):
            for n in (5, 8):
                opts = Options(channels=3)
                t = symbolic.template(coll, algo, n, opts)
                if t is None:
                    continue
                for r in range(n):
                    p = generate(coll, algo, n, r, opts)
                    assert symbolic.instantiate(t, r).channels == p.channels, \
                        (coll, algo, n, r)
                    # the field-by-field check agrees, also on a Program it misreads
                    q = replace(generate(coll, algo, n, (r + 1) % n, opts), rank=r)
                    assert symbolic.reads(t, p) and symbolic.reads(t, q) == \
                        (q.channels == p.channels), (coll, algo, n, r)
    assert symbolic.template("all_reduce", "ring", 8, Options(channels=2)) is not None
    assert symbolic.template("broadcast", "ring", 8, Options(root=3)) is None
    assert symbolic.template("all_reduce", "tree", 8, Options()) is None


def test_symbolic_rank_refuses_comparisons():
    r = symbolic.Sym()
    assert ((r + 3) % 8).at(6) == 1 and (2 * ((r - 1) % 8) + 5).at(0) == 19
    for bad in (lambda: r == 1, lambda: bool(r), lambda: range(r), lambda: hash(r),
                lambda: r // 2, lambda: {r: 1}):
        with pytest.raises(symbolic.NotSymmetric):
            bad()


def _table(argv, capsys) -> str:
    assert sim_main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["all_reduce", "-t", "dgx_h100", "-N", "4", "--algo", "ring,tree", "-b", "8", "-e", "8M",
     "-f", "8"],
    ["all_gather", "-t", "fat_tree3", "-N", "64", "--algo", "ring", "-b", "1K", "-e", "4M",
     "-f", "64", "--model", "fast"],
    ["reduce_scatter", "-t", "torus", "-N", "16", "--algo", "ring", "-b", "64", "-e", "1M",
     "-f", "128", "--model", "unaware"]])
def test_shared_programs_give_identical_tables(argv, capsys):
    """Shared and folded Programs print byte for byte what every rank's own Program does."""
    assert _table(argv, capsys) == _table(argv + ["--no-fold"], capsys)


_RSS = """
import json, resource, sys
from ringtree.sim import simulate
from ringtree.sim.machine import presets
topo = presets.get("dgx_h100", int(sys.argv[1]))
algo, size = sys.argv[2], int(sys.argv[3])
simulate("all_reduce", algo, topo, 8 << 20, model="aware")      # warm imports and caches
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run = simulate("all_reduce", algo, topo, size, model="aware")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kib": peak - base, "peak_kib": peak, "time": run.time_ns}))
"""


@pytest.mark.parametrize("algo,size", [("ring", 1 << 30), ("tree", 8)])
def test_memory_grows_at_most_linearly(algo, size):
    """RSS of an all-reduce at 256 vs 1,024 ranks (default channels and model): at most
    4× the growth, plus slack for the allocator's granularity. The ring runs on the
    shared template, the tree on every rank's own Program (generated when read)."""
    got = {}
    for nodes in (32, 128):
        out = subprocess.run([sys.executable, "-c", _RSS, str(nodes), algo, str(size)],
                             capture_output=True, text=True, check=True,
                             timeout=600).stdout
        got[nodes] = json.loads(out.strip().splitlines()[-1])
    small, big = got[32]["peak_kib"], got[128]["peak_kib"]
    assert big <= 4 * small + 64 * 1024, got
    assert got[128]["grew_kib"] <= 4 * got[32]["grew_kib"] + 64 * 1024, got


def _exact(algo, topo, nbytes, model="aware", coll="all_reduce"):
    """Folded vs every rank simulated: the time, every simulated step's start and end,
    every rank's finish (rank r finishes with its representative r mod g) and the events
    (the folded run's, once per block)."""
    f = simulate(coll, algo, topo, nbytes, model=model, max_work=0)
    w = simulate(coll, algo, topo, nbytes, model=model, symmetry=False, max_work=0)
    assert f.time_ns == w.time_ns, (algo, topo.name, nbytes, model)
    g, n = f.simulated, topo.nranks
    if f.result is not None:
        fr, wr = f.result, w.result
        k = len(fr.step_done)
        assert fr.step_done == wr.step_done[:k] and fr.step_start == wr.step_start[:k]
        assert [fr.rank_done[r % g] for r in range(n)] == wr.rank_done
        assert f.events * (n // g) == w.events
    return g


BUTTERFLY = [lambda: presets.get("dgx_h100", 4),
             lambda: presets.get("dgx_h100", 8, leaf_ports=2),     # 4 leaf groups, spines
             lambda: presets.get("dgx_a100", 8, leaf_ports=4, gpus_per_node=2,
                                 nics_per_node=2),
             lambda: presets.get("fat_tree2", 32),                 # 2 leaves
             lambda: presets.get("fat_tree3", 64),                 # 2 pods, cores
             lambda: presets.get("torus", 16)]


@pytest.mark.parametrize("make", BUTTERFLY)
def test_xor_folding_equals_unfolded(make):
    """Butterflies (partner r XOR 2^k) fold under XOR of blocks of ranks, with links
    shared between blocks simulated through their orbits' representatives."""
    topo = make()
    g0 = symmetry.node_period(topo)
    smallest = topo.nranks
    for algo in ("rabenseifner", "recursive_doubling"):
        for nbytes in (8, 64 << 10, 3 * MiB + 12):
            for model in ("aware", "unaware"):
                smallest = min(smallest, _exact(algo, topo, nbytes, model))
    if topo.name.startswith(("dgx", "fat")):
        assert smallest == g0                    # onto one node
    f = symmetry.find(choice.Lazy(Collective.ALL_REDUCE, "rabenseifner", topo.nranks,
                                choice.options(topo)), topo, list(topo.ranks),
                      count_for(Collective.ALL_REDUCE, 64 << 10, topo.nranks), True)
    if topo.name.startswith(("dgx", "fat")):
        assert f is not None and f.xor and f.g == g0


# Sizes where a rank's sends to different peers reach its GPU's shared uplink at one
# instant. Engines serve them by message id; numbered by receiver, XOR of blocks did not
# keep that order (rank 1 sends to 3, 5, 9; its image 9 to 11, 13, 1) and these folds
# were off the unfolded run. Message ids now follow the order a sender first sends on
# each connection (``pairing.issue_order``), which every fold keeps (docs/design-notes.md,
# "the tie rule").
TIES = [("dgx_h100", 4, {}, 1 * MiB), ("dgx_h100", 4, {}, 2 * MiB),
        ("dgx_h100", 4, {}, 3 * MiB),
        ("dgx_h100", 4, {}, 4 * MiB), ("dgx_h100", 8, {"leaf_ports": 2}, 1 * MiB)]


@pytest.mark.parametrize("name,nodes,kw,nbytes", TIES)
def test_xor_fold_with_sender_ties(name, nodes, kw, nbytes):
    _exact("rabenseifner", presets.get(name, nodes, **kw), nbytes)


@pytest.mark.parametrize("make", [lambda: _slow_link(presets.get("dgx_h100", 8, leaf_ports=2)),
                                  lambda: _slow_gpu(presets.get("fat_tree2", 32)),
                                  lambda: presets.get("dgx_h100", 8, leaf_ports=2,
                                                      uplinks="hash")])
def test_xor_folding_refuses_asymmetric_runs(make):
    """A slow link, a slow GPU or ECMP-hashed uplinks break the symmetry: the butterflies
    then fold less or not at all, and still give the unfolded answer."""
    topo = make()
    for algo in ("rabenseifner", "recursive_doubling"):
        g = _exact(algo, topo, 64 << 10)
        assert g > symmetry.node_period(topo), (algo, topo.name, g)


def test_folds_other_collectives_exactly():
    topo = presets.get("dgx_h100", 8, leaf_ports=2)
    for coll in ("all_gather", "reduce_scatter"):
        for algo in algorithms(coll):
            if algo.startswith(("collnet", "nvls")):
                continue
            _exact(algo, topo, 3 * MiB, coll=coll)
    for algo in ("ring", "tree", "hierarchical", "direct"):
        _exact(algo, topo, 3 * MiB)
