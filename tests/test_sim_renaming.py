"""Renaming chunks by sets (:mod:`ringtree.sim.compile.renaming`): a reference mapped onto its
counterpart as a set is accepted only when a length-keeping bijection of the slots does
it, and the folds it allows (a hierarchical all-reduce's leaders' ring rotating a run of
chunks its chain steps name at once) give the unfolded run bit for bit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ringtree.ir.program import Buf, Collective, Program, Ref, Step
from ringtree.sim import simulate
from ringtree.sim.compile.renaming import by_sets
from ringtree.sim.fold import symmetry
from ringtree.sim.machine import cluster as T
from ringtree.sim.machine import presets

MiB = 1 << 20


def _prog(steps: list[tuple[Ref, Ref]], chunks: int = 4) -> Program:
    return Program(Collective.ALL_REDUCE, "test", 2, 0, chunks,
                   (tuple(Step(src=a, dst=b) for a, b in steps),))


def _regs(lengths: list[int]) -> dict:
    return {Buf.INPUT: lengths, Buf.OUTPUT: lengths, Buf.SCRATCH: []}


def test_a_rotation_inside_a_run_named_at_once_is_a_renaming():
    whole = (Ref(Buf.INPUT, 0, 4), Ref(Buf.OUTPUT, 0, 4))
    p = _prog([whole] + [(Ref(Buf.OUTPUT, j, 1), Ref(Buf.OUTPUT, j, 1)) for j in (1, 2, 3, 0)])
    q = _prog([whole] + [(Ref(Buf.OUTPUT, j, 1), Ref(Buf.OUTPUT, j, 1)) for j in (0, 1, 2, 3)])
    assert by_sets(p, q, _regs([5, 5, 5, 5]))
    assert not by_sets(p, q, _regs([5, 5, 5, 4]))        # the rotation moves a short chunk
    # a chunk the run does not name cannot stand in for one it does
    r = _prog([(Ref(Buf.INPUT, 0, 3), Ref(Buf.OUTPUT, 0, 3))]
              + [(Ref(Buf.OUTPUT, j, 1), Ref(Buf.OUTPUT, j, 1)) for j in (3, 0, 1, 2)])
    s = _prog([(Ref(Buf.INPUT, 0, 3), Ref(Buf.OUTPUT, 0, 3))]
              + [(Ref(Buf.OUTPUT, j, 1), Ref(Buf.OUTPUT, j, 1)) for j in (0, 1, 2, 3)])
    assert not by_sets(r, s, _regs([5, 5, 5, 5]))
    # two steps naming one chunk in q must name one chunk in p
    a = _prog([(Ref(Buf.OUTPUT, 0, 1), Ref(Buf.OUTPUT, 0, 1)),
               (Ref(Buf.OUTPUT, 1, 1), Ref(Buf.OUTPUT, 1, 1))], 2)
    b = _prog([(Ref(Buf.OUTPUT, 0, 1), Ref(Buf.OUTPUT, 0, 1)),
               (Ref(Buf.OUTPUT, 0, 1), Ref(Buf.OUTPUT, 0, 1))], 2)
    assert not by_sets(a, b, _regs([5, 5]))
    assert not by_sets(p, replace(q, channels=((Step(src=whole[0], dst=Ref(Buf.SCRATCH, 0, 4)),)
                                               + q.channels[0][1:],)), _regs([5] * 4))


def _exact(topo: T.Topology, nbytes: int, model: str = "aware") -> int:
    f = simulate("all_reduce", "hierarchical", topo, nbytes, model=model, max_work=0)
    w = simulate("all_reduce", "hierarchical", topo, nbytes, model=model, symmetry=False,
                 max_work=0)
    assert f.time_ns == w.time_ns, (topo.name, nbytes, model)
    g, n = f.simulated, topo.nranks
    fr, wr = f.result, w.result
    k = len(fr.step_done)
    assert fr.step_done == wr.step_done[:k] and fr.step_start == wr.step_start[:k]
    assert [fr.rank_done[r % g] for r in range(n)] == wr.rank_done
    assert f.events * (n // g) == w.events
    assert (f.result.messages * (n // g), f.result.bytes * (n // g)) == \
        (w.result.messages, w.result.bytes)
    return g


@pytest.mark.parametrize("nbytes", [64 << 10, 4 * MiB])
def test_hierarchical_folds_onto_a_leaf_group(nbytes):
    """Four leaf groups of two nodes: the leaders' ring rotates each channel's chunks by
    one node, which neither positional renaming nor a XOR mask does; by sets the run
    folds onto one leaf group (16 ranks, not the 32 of a XOR of halves)."""
    topo = presets.get("dgx_h100", 8, leaf_ports=2)
    for model in ("aware", "unaware"):
        assert _exact(topo, nbytes, model) == 16


def test_hierarchical_renaming_refuses_unequal_chunks_and_asymmetric_networks():
    topo = presets.get("dgx_h100", 8, leaf_ports=2)
    assert _exact(topo, 3 * MiB + 12) == topo.nranks    # the rotation moves short chunks
    links = list(topo.links)
    k = next(i for i, lk in enumerate(links) if topo.devices[lk.src].kind == "nic")
    links[k] = replace(links[k], bandwidth=links[k].bandwidth / 2)
    slow = replace(topo, links=tuple(links), name=topo.name + "-slow")
    assert _exact(slow, 64 << 10) > symmetry.node_period(slow) * 2
