"""Hierarchical algorithms whose intra-host phases overlap the link: the pipelined
all-reduce (``params["pieces"]``) passes the checker on uneven and non-contiguous node
layouts, the planner gives it pieces only where ranks span hosts and share them and the
message is large, and it runs bit-exact for real (node layouts faked on one machine, as in
``test_algorithms_real``); all-gather and reduce-scatter move superblocks through the
chains in the order the leaders' link makes them final or needs them."""

from __future__ import annotations

import numpy as np
import pytest

from ringtree.ir.program import Collective
from ringtree.schedules import Options, check
from ringtree.schedules.hierarchical import MAX_PIECES, PIECE_BYTES, pieces_for
from ringtree.schedules.registry import generate
from ringtree.testing import RankPool

LAYOUTS = [(0, 0, 1, 1), (0, 0, 0, 0, 1, 1, 1, 1), (0, 1, 0, 1, 2), (0, 0, 0, 1, 1, 2),
           (1, 1, 0, 0, 0)]


@pytest.mark.parametrize("nodes", LAYOUTS, ids=lambda t: "".join(map(str, t)))
@pytest.mark.parametrize("pieces", [2, 3, 4])
@pytest.mark.parametrize("inter", ["ring", "rabenseifner", "recursive_doubling", "direct"])
def test_pieces_pass_the_checker(nodes, pieces, inter):
    for channels in (1, 2):
        opts = Options(channels=channels, nodes=nodes,
                       params=(("inter", inter), ("pieces", pieces)))
        assert check(Collective.ALL_REDUCE, "hierarchical", len(nodes), opts)


@pytest.mark.parametrize("nodes", LAYOUTS + [(0, 0, 1, 1, 2, 2)],
                         ids=lambda t: "".join(map(str, t)))
@pytest.mark.parametrize("coll,inters", [
    (Collective.ALL_GATHER, ["ring", "bruck", "recursive_doubling", "direct"]),
    (Collective.REDUCE_SCATTER, ["ring", "halving", "direct"])])
def test_block_by_block_gather_and_scatter_pass_the_checker(nodes, coll, inters):
    for inter in inters:
        for pieces in (2, 3, 4) if coll is Collective.REDUCE_SCATTER else (2,):
            opts = Options(nodes=nodes, params=(("inter", inter), ("pieces", pieces)))
            assert check(coll, "hierarchical", len(nodes), opts)


def test_a_pieced_reduce_scatter_cuts_each_block_into_pieces_in_link_order():
    """2x4 in 2 pieces: each block is two chunks; leader 0 chain-reduces first the other
    node's superblock (the one its link sends first), chunk by chunk, and sends each
    rank's result a chunk at a time, which that rank receives a chunk at a time."""
    opts = Options(nodes=(0,) * 4 + (1,) * 4, params=(("pieces", 2),))
    lead = generate(Collective.REDUCE_SCATTER, "hierarchical", 8, 0, opts)
    assert lead.chunks == 2
    names = [str(s) for s in lead.channels[0]]
    assert names[:2] == ["recvReduceCopy from 1 src=i[8] dst=s[8]",
                         "recvReduceCopy from 1 src=i[9] dst=s[9]"]
    assert names[8] == "recvReduceCopy from 1 src=i[0] dst=s[0]"
    assert names[-6:] == [f"send to {q} src=s[{16 + 2 * q + j}]" for q in (1, 2, 3)
                          for j in (0, 1)]
    last = [str(s) for s in generate(Collective.REDUCE_SCATTER, "hierarchical", 8, 3,
                                     opts).channels[0]]
    assert last[-2:] == ["recv from 0 dst=o[0]", "recv from 0 dst=o[1]"]


def test_chain_feeds_pieces_in_the_order_the_link_needs_them():
    """Leader 0 of 2x4 sends block 1 of each piece first, so the chain reduces those first,
    and the chain broadcast sends every piece once it is final, before the last one."""
    opts = Options(nodes=(0,) * 4 + (1,) * 4, params=(("pieces", 2),))
    lead = generate(Collective.ALL_REDUCE, "hierarchical", 8, 0, opts).channels[0]
    names = [str(s) for s in lead]
    assert names[:4] == [f"recvReduceCopy from 1 src=i[{j}] dst=o[{j}]" for j in (1, 3, 0, 2)]
    assert names[4:6] == ["send to 4 src=o[1]", "send to 4 src=o[3]"]
    assert names[-4:] == [f"send to 1 src=o[{j}]" for j in (0, 2, 1, 3)]
    with pytest.raises(ValueError, match="pieces=0"):
        generate(Collective.ALL_REDUCE, "hierarchical", 4, 0,
                 Options(nodes=(0, 0, 1, 1), params=(("pieces", 0),)))


def test_pieces_only_across_shared_hosts_and_for_large_messages():
    two_by_two = (0, 0, 1, 1)
    assert pieces_for(64 << 20, None) == ()
    assert pieces_for(64 << 20, (0, 0, 0, 0)) == ()           # one host
    assert pieces_for(64 << 20, (0, 1, 2, 3)) == ()           # nothing to overlap
    assert pieces_for(2 * PIECE_BYTES * 2 - 1, two_by_two) == ()
    assert pieces_for(2 * PIECE_BYTES * 2, two_by_two) == (("pieces", 2),)
    assert pieces_for(1 << 30, two_by_two) == (("pieces", MAX_PIECES),)
    assert pieces_for(4 * PIECE_BYTES * 2, two_by_two, channels=2) == (("pieces", 2),)


def _pieced_all_reduce(comm, count: int):
    p = comm.planner
    p.relayout(tuple(r // 2 for r in range(comm.size)))
    prog = p.program(Collective.ALL_REDUCE, "hierarchical", 0, count * 4)
    x = (np.arange(count, dtype=np.float32) % 251) * (comm.rank + 1)
    out = np.empty_like(x)
    comm.all_reduce(x, out=out, algo="hierarchical")
    y = x.copy()
    comm.all_reduce(y, algo="hierarchical")                # in place
    want = (np.arange(count, dtype=np.float32) % 251) * sum(range(1, comm.size + 1))
    return dict(prog.meta).get("inter"), len(prog.channels[0]), \
        bool(np.array_equal(out, want)), bool(np.array_equal(y, want))


def test_pieced_all_reduce_is_exact_for_real():
    count = (8 << 20) // 4 + 5                              # 4 pieces on 2 "hosts"
    with RankPool(4) as pool:
        res = pool.run_ok(_pieced_all_reduce, count)
    flat = generate(Collective.ALL_REDUCE, "hierarchical", 4, 0, Options(nodes=(0, 0, 1, 1)))
    for r, (inter, nsteps, oop, inplace) in enumerate(res):
        assert inter == "ring"
        assert nsteps > len(flat.channels[0]), f"rank {r}: the plan is not pieced"
        assert oop and inplace, f"rank {r}: wrong sum"


def test_superblocks_move_through_chains_in_link_order():
    """2x4: the all-gather's chain broadcasts the node's own superblock while the link
    brings the other; the reduce-scatter's chain reduces the superblock the leader sends
    first before its own."""
    opts = Options(nodes=(0,) * 4 + (1,) * 4)
    ag = [str(s) for s in generate(Collective.ALL_GATHER, "hierarchical", 8, 5, opts).channels[0]]
    assert ag[-2:] == ["recvCopySend from 4 to 6 dst=o[4:8]", "recvCopySend from 4 to 6 dst=o[0:4]"]
    rs = [str(s) for s in generate(Collective.REDUCE_SCATTER, "hierarchical", 8, 1,
                                   opts).channels[0]]
    assert rs[:2] == ["recvReduceSend from 2 to 0 src=i[4:8]",
                      "recvReduceSend from 2 to 0 src=i[0:4]"]


def _pieced_gather_and_scatter(comm, count: int):
    p = comm.planner
    p.relayout(tuple(r // 2 for r in range(comm.size)))
    n, r = comm.size, comm.rank
    steps = {c: len(p.program(c, "hierarchical", 0, count * n * 4).channels[0])
             for c in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)}
    x = (np.arange(count, dtype=np.float32) % 253) + r
    gathered = np.empty((n, count), np.float32)
    comm.all_gather(x, out=gathered, algo="hierarchical")
    ag_ok = all(np.array_equal(gathered[q], (np.arange(count, dtype=np.float32) % 253) + q)
                for q in range(n))
    big = (np.arange(count * n, dtype=np.float32) % 253) * (r + 1)
    part = np.empty(count, np.float32)
    comm.reduce_scatter(big, out=part, algo="hierarchical")
    want = (np.arange(count * n, dtype=np.float32) % 253)[r * count:(r + 1) * count] \
        * sum(range(1, n + 1))
    rs = p.program(Collective.REDUCE_SCATTER, "hierarchical", 0, count * n * 4)
    pieces = dict(p._options(Collective.REDUCE_SCATTER, count * n * 4).params)["pieces"]
    return steps, ag_ok, bool(np.array_equal(part, want)), (rs.chunks, pieces)


@pytest.mark.parametrize("count", [(2 << 20) // 4 + 3, (4 << 20) // 4 + 7],
                         ids=["2pieces", "4pieces"])
def test_block_by_block_gather_and_scatter_are_exact_for_real(count):
    """8 and 16 MiB over 4 ranks: the reduce-scatter in 2 and 4 pieces per block, counts
    that the pieces do not divide evenly."""
    with RankPool(4) as pool:
        res = pool.run_ok(_pieced_gather_and_scatter, count)
    flat = Options(nodes=(0, 0, 1, 1))
    for r, (steps, ag_ok, rs_ok, (chunks, pieces)) in enumerate(res):
        assert chunks == pieces > 1, (r, chunks, pieces)
        for c, k in steps.items():
            assert k > len(generate(c, "hierarchical", 4, r, flat).channels[0]), (r, c)
        assert ag_ok, f"rank {r}: all_gather"
        assert rs_ok, f"rank {r}: reduce_scatter"


def test_touched_runs_are_the_chunks_named():
    """``_touched`` merges reference ranges into the runs of consecutive chunks that
    listing every chunk named gives, on the channels of several inter-node programs."""
    from ringtree.ir.program import Buf, Collective
    from ringtree.schedules import Options, generate
    from ringtree.schedules.hierarchical import _touched

    for algo in ("ring", "tree", "rabenseifner", "direct"):
        for L, c in ((2, 1), (5, 2), (16, 4)):
            for ch in generate(Collective.ALL_REDUCE, algo, L, 0, Options(channels=c)).channels:
                js = sorted({j for s in ch for x in (s.src, s.dst)
                             if x is not None and x.buf is not Buf.SCRATCH for j in x.chunks()})
                runs: list[tuple[int, int]] = []
                for j in js:
                    if runs and sum(runs[-1]) == j:
                        runs[-1] = (runs[-1][0], runs[-1][1] + 1)
                    else:
                        runs.append((j, 1))
                assert _touched(ch) == runs, (algo, L, c)
