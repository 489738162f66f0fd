"""The tie rule: a link serves simultaneous arrivals in the order their senders issued
them. Message ids (the engines' tie-break) number senders by rank and one sender's
connections in the order its Program first sends on them, in every path that numbers
messages, and a XOR renaming of ranks keeps that order where numbering by receiver did
not."""

from __future__ import annotations

import pytest

from ringtree.sim import count_for, programs_for, simulate
from ringtree.sim.compile.compiled import compile_programs
from ringtree.sim.compile.pairing import issue_order
from ringtree.sim.machine import presets

MiB = 1 << 20


def _first_sends(progs) -> list[tuple[int, int, int]]:
    """Every rank's connections in the order its Program first sends on them (channel by
    channel, step by step, position by position), ranks in order: the rule, read off the
    Programs without the compiler."""
    out: list[tuple[int, int, int]] = []
    for p in progs:
        seen: set[tuple[int, int, int]] = set()
        for c, steps in enumerate(p.channels):
            for s in steps:
                for q in s.send_to:
                    if (p.rank, q, c) not in seen:
                        seen.add((p.rank, q, c))
                        out.append((p.rank, q, c))
    return out


@pytest.mark.parametrize("algo", ["rabenseifner", "tree", "collnet_direct", "hierarchical"])
def test_connections_are_numbered_in_issue_order(algo):
    topo = presets.get("dgx_h100_sharp" if algo == "collnet_direct" else "dgx_h100", 2)
    progs = programs_for("all_reduce", algo, topo)
    cp = compile_programs(progs, count_for(progs[0].collective, 4 * MiB, topo.nranks), 4,
                          1 << 18)
    every = _first_sends(progs)
    assert cp.conns == [c for c in every if c in set(cp.conns)]
    assert cp.conns != sorted(cp.conns)          # numbering by receiver would differ
    conn = cp.msg_conn                           # each connection's messages contiguous
    assert all(a <= b for a, b in zip(conn, conn[1:]))


def test_issue_order_puts_never_sent_connections_last():
    first = {(0, 5, 0): (3, 0), (0, 2, 0): (7, 1), (1, 0, 0): (0, 0)}
    got = issue_order([(1, 0, 0), (0, 2, 0), (0, 9, 1), (0, 5, 0), (0, 1, 1)], first.get)
    assert got == [(0, 5, 0), (0, 2, 0), (0, 1, 1), (0, 9, 1), (1, 0, 0)]


def test_xor_renaming_keeps_the_tie_order():
    """Rabenseifner on four DGX H100 nodes at 1 MiB: rank 1's sends to 3, 5 and 9 reach
    its GPU's uplink at one instant, and its XOR image 9's to 11, 13 and 1. Every node
    now finishes at the same time, as the symmetry says it must (numbered by receiver,
    nodes 1 and 3 finished 68 ns after nodes 0 and 2)."""
    topo = presets.get("dgx_h100", 4)
    w = simulate("all_reduce", "rabenseifner", topo, MiB, model="aware", symmetry=False,
                 max_work=0)
    per_node = [max(w.result.rank_done[8 * k:8 * k + 8]) for k in range(4)]
    assert len(set(per_node)) == 1, per_node
