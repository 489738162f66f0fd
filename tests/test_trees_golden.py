"""NCCL's trees, against the shapes NCCL publishes (reference: nccl.md §2).

- ``ncclGetBtree`` for 14 ranks, the illustration in ``src/graph/trees.cc``;
- ``ncclGetDtree`` for 8 ranks, the up/children table, verbatim;
- the tree patterns of ``ncclTopoPreset`` + ``connectTrees`` on 4 nodes × 3 ranks;
- structural properties for every n and node layout.
"""

from __future__ import annotations

import random
import re

import pytest

from ringtree.schedules.tree_wiring import (
    Pattern,
    btree,
    dtree,
    nccl_trees,
    node_groups,
    rooted_btree,
    tree_root,
)

# nccl.md §2.2, verbatim.
N8_TABLE = """
rank 0: t0 up=-1 down=[4]   t1 up=1 down=[]       rank 4: t0 up=0 down=[2,6] t1 up=5 down=[]
rank 1: t0 up=2 down=[]     t1 up=3 down=[2,0]    rank 5: t0 up=6 down=[]    t1 up=3 down=[6,4]
rank 2: t0 up=4 down=[1,3]  t1 up=1 down=[]       rank 6: t0 up=4 down=[5,7] t1 up=5 down=[]
rank 3: t0 up=2 down=[]     t1 up=7 down=[5,1]    rank 7: t0 up=6 down=[]    t1 up=-1 down=[3]
"""

ENTRY = re.compile(r"rank (\d+): t0 up=(-?\d+) down=\[([\d,]*)\]\s+t1 up=(-?\d+) down=\[([\d,]*)\]")


def _parse_table(text: str) -> dict[int, tuple[tuple[int, list[int]], tuple[int, list[int]]]]:
    def ints(s: str) -> list[int]:
        return [int(x) for x in s.split(",") if x]

    out = {}
    for m in ENTRY.finditer(text):
        out[int(m[1])] = ((int(m[2]), ints(m[3])), (int(m[4]), ints(m[5])))
    return out


def _down(links: tuple[int, int, int]) -> list[int]:
    return [d for d in links[1:] if d != -1]


def test_dtree_n8_table_verbatim():
    table = _parse_table(N8_TABLE)
    assert sorted(table) == list(range(8))
    for r, (t0, t1) in table.items():
        got0, got1 = dtree(8, r)
        assert (got0[0], _down(got0)) == t0, f"rank {r} tree 0"
        assert (got1[0], _down(got1)) == t1, f"rank {r} tree 1"


def test_btree_14_rank_illustration():
    # "0 → 8; 8 → 4,12; 4 → 2,6; 12 → 10,13; 2 → 1,3; …" and "Odd ranks are leaves."
    shown = {0: [8], 8: [4, 12], 4: [2, 6], 12: [10, 13], 2: [1, 3]}
    for r, children in shown.items():
        assert _down(btree(14, r)) == children, r
    for r in range(1, 14, 2):
        assert _down(btree(14, r)) == [], f"odd rank {r} is a leaf"
    assert btree(14, 0) == (-1, -1, 8)      # the root has one child, its down1
    # the rest of the tree follows from the same rule
    assert _down(btree(14, 6)) == [5, 7] and _down(btree(14, 10)) == [9, 11]
    ups = {r: btree(14, r)[0] for r in range(14)}
    assert ups == {0: -1, 1: 2, 2: 4, 3: 2, 4: 8, 5: 6, 6: 4, 7: 6, 8: 0, 9: 10, 10: 12,
                   11: 10, 12: 8, 13: 12}


def test_dtree_odd_shift():
    # nccl.md: "For n = 7, rank 0 is the root of tree0 and interior in tree1 (up = 5,
    # down = [6])."
    t0, t1 = dtree(7, 0)
    assert t0[0] == -1
    assert t1[0] == 5 and _down(t1) == [6]
    for r in range(7):   # tree 1 is tree 0 shifted by one rank
        u, d0, d1 = btree(7, (r - 1) % 7)
        assert dtree(7, r)[1] == tuple(-1 if x == -1 else (x + 1) % 7 for x in (u, d0, d1))


@pytest.mark.parametrize("n", [2, 4, 6, 8, 10, 12, 16, 30, 64])
def test_dtree_even_each_rank_interior_in_at_most_one_tree(n):
    for r in range(n):
        t0, t1 = dtree(n, r)
        assert not (_down(t0) and _down(t1)), f"n={n} rank {r} interior in both trees"


def _check_spanning(tree, n):
    root = tree_root(tree)
    for r, t in enumerate(tree):
        if t.up != -1:
            assert r in tree[t.up].down, f"{r} not a child of its parent {t.up}"
        for d in t.down:
            assert tree[d].up == r
        assert len(set(t.down)) == len(t.down) and r not in t.down
    seen, stack = set(), [root]
    while stack:
        r = stack.pop()
        assert r not in seen, "cycle"
        seen.add(r)
        stack.extend(tree[r].down)
    assert seen == set(range(n))


def _layouts(n: int):
    rng = random.Random(n)
    yield None
    yield tuple(range(n))
    for ppn in (2, 3, 4):
        yield tuple(r // ppn for r in range(n))
    yield tuple(r % 3 for r in range(n))
    yield tuple(rng.randrange(5) for _ in range(n))


@pytest.mark.parametrize("pattern", list(Pattern))
def test_nccl_trees_are_spanning_trees(pattern):
    for n in range(1, 41):
        for nodes in _layouts(n):
            groups = node_groups(n, nodes)
            t0, t1 = nccl_trees(n, nodes, pattern)
            for tree in (t0, t1):
                _check_spanning(tree, n)
                # intra-node: a chain in rank order; inter-node: nodes − 1 edges
                for g in groups:
                    for a, b in zip(g, g[1:]):
                        assert tree[b].up == a
                cross = sum(1 for r, t in enumerate(tree)
                            if t.up != -1 and nodes is not None and nodes[t.up] != nodes[r])
                assert cross == len(groups) - 1


def test_single_node_is_a_chain():
    for tree in nccl_trees(5, None):
        assert [(t.up, t.down) for t in tree] == [(-1, (1,)), (0, (2,)), (1, (3,)), (2, (4,)),
                                                  (3, ())]


def test_one_rank_per_node_is_the_dtree():
    for n in range(1, 20):
        t0, t1 = nccl_trees(n, tuple(range(n)), "split_tree")   # pattern is moot
        for r in range(n):
            d0, d1 = dtree(n, r)
            assert (t0[r].up, list(t0[r].down)) == (d0[0], _down(d0))
            assert (t1[r].up, list(t1[r].down)) == (d1[0], _down(d1))


# 4 nodes × 3 ranks: node k holds ranks 3k..3k+2. Inter-node tree 0 over nodes is
# btree(4): node 0 → node 2 (its only child, a "second" child); node 2 → nodes 1, 3.
NODES_4x3 = tuple(r // 3 for r in range(12))


@pytest.mark.parametrize("pattern,expect", [
    # TREE: parent and both children on local rank 0
    ("tree", {0: (-1, (1, 6)), 1: (0, (2,)), 6: (0, (7, 3, 9)), 7: (6, (8,)),
              3: (6, (4,)), 9: (6, (10,))}),
    # SPLIT_TREE: parent on local rank 0, children on local rank 1
    ("split_tree", {0: (-1, (1,)), 1: (0, (2, 6)), 6: (1, (7,)), 7: (6, (8, 3, 9)),
                    3: (7, (4,)), 9: (7, (10,))}),
    # BALANCED_TREE: parent and child 1 on local rank 0, child 0 on local rank 1
    ("balanced_tree", {0: (-1, (1, 6)), 1: (0, (2,)), 6: (0, (7, 9)), 7: (6, (8, 3)),
                       3: (7, (4,)), 9: (6, (10,))}),
])
def test_tree_patterns(pattern, expect):
    t0, _ = nccl_trees(12, NODES_4x3, pattern)
    for r, (up, down) in expect.items():
        assert (t0[r].up, t0[r].down) == (up, down), f"{pattern}: rank {r}"


def test_pattern_parse():
    assert Pattern.parse("SPLIT-TREE") is Pattern.SPLIT_TREE
    assert Pattern.parse(1) is Pattern.BALANCED_TREE    # NCCL_TOPO_PATTERN ids
    with pytest.raises(ValueError):
        Pattern.parse("ring")


def test_rooted_btree():
    for n in range(1, 30):
        for root in {0, n // 2, n - 1}:
            tree = rooted_btree(n, root)
            assert tree_root(tree) == root
            _check_spanning(tree, n)
            assert len(tree[root].down) <= 1        # NCCL's root has a single child


def test_btree_rejects_bad_rank():
    with pytest.raises(ValueError):
        btree(4, 4)
