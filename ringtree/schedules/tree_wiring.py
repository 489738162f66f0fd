"""NCCL's trees: the binary tree, the double binary tree, and how ranks are wired to them.

Pure functions, no IR. ``btree`` and ``dtree`` are line-for-line ``ncclGetBtree`` /
``ncclGetDtree`` (``src/graph/trees.cc``): a tree vertex is a *node* (a host) in NCCL, and
``-1`` means "none". :func:`nccl_trees` is the wiring of ``src/graph/connect.cc``
(``ncclTopoPreset`` + ``connectTrees``): the ranks of a node form a chain, and the node is
attached to the inter-node double binary tree through one or two of its local ranks, chosen
by the tree pattern (``NCCL_TOPO_PATTERN_*`` in ``src/include/graph.h``):

- ``TREE``: parent and both children on local rank 0 ("all NIC traffic to/from one GPU");
- ``SPLIT_TREE``: parent on local rank 0, both children on local rank 1;
- ``BALANCED_TREE``: parent and child 1 on local rank 0, child 0 on local rank 1
  (NCCL's first choice at init).

A node with a single rank uses ``TREE`` whatever the pattern (as NCCL does for one GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

Links = tuple[int, int, int]  # (up, down0, down1); -1 = none


def btree(n: int, rank: int) -> Links:
    """``ncclGetBtree``: the binary tree rooted at 0 built from the lowest set bit.

    The root has one child (``down1``); odd ranks are leaves. Returns (up, down0, down1).
    """
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for {n} ranks")
    bit = 1
    while bit < n:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return (-1, -1, (bit >> 1) if n > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= n:
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return (up, down0, down1)


def parent_child_type(n: int, rank: int) -> int:
    """0 if ``rank`` is its parent's first child (smaller than the parent), 1 if second,
    -1 for the root (``parentChildType`` of ``ncclGetBtree``)."""
    up = btree(n, rank)[0]
    return -1 if up == -1 else (0 if rank < up else 1)


def dtree(n: int, rank: int) -> tuple[Links, Links]:
    """``ncclGetDtree``: tree 0 is :func:`btree`; tree 1 is its mirror (``x → n−1−x``) when
    ``n`` is even, or the btree shifted by one rank (``x → x+1 mod n``) when ``n`` is odd."""
    t0 = btree(n, rank)
    if n % 2 == 1:
        u, d0, d1 = btree(n, (rank - 1 + n) % n)
        t1 = tuple(-1 if x == -1 else (x + 1) % n for x in (u, d0, d1))
    else:
        u, d0, d1 = btree(n, n - 1 - rank)
        t1 = tuple(-1 if x == -1 else n - 1 - x for x in (u, d0, d1))
    return (t0[0], t0[1], t0[2]), (t1[0], t1[1], t1[2])


def dtree_child_types(n: int, rank: int) -> tuple[int, int]:
    """``parentChildType`` of ``rank`` in each tree of :func:`dtree`."""
    t0 = parent_child_type(n, rank)
    if n % 2 == 1:
        return t0, parent_child_type(n, (rank - 1 + n) % n)
    return t0, parent_child_type(n, n - 1 - rank)


class Pattern(str, Enum):
    """How a node's local ranks attach to the inter-node tree (``NCCL_TOPO_PATTERN_*``)."""

    BALANCED_TREE = "balanced_tree"  # 1
    SPLIT_TREE = "split_tree"        # 2
    TREE = "tree"                    # 3

    @classmethod
    def parse(cls, value: object) -> Pattern:
        if isinstance(value, Pattern):
            return value
        key = str(value).strip().lower().replace("-", "_")
        aliases = {"balanced": "balanced_tree", "split": "split_tree", "1": "balanced_tree",
                   "2": "split_tree", "3": "tree"}
        try:
            return cls(aliases.get(key, key))
        except ValueError:
            raise ValueError(f"unknown tree pattern {value!r}; expected one of "
                             f"{[p.value for p in cls]}") from None


@dataclass(frozen=True)
class TreeRank:
    """One rank's place in a tree over ranks: its parent (-1 at the root) and children, in
    the order NCCL fills ``tree.down`` (intra-node chain first, then inter-node)."""

    up: int
    down: tuple[int, ...]


def node_groups(n: int, nodes: Sequence[int] | None) -> list[list[int]]:
    """Ranks of each node, nodes in order of their lowest rank, ranks ascending within a
    node. ``nodes=None`` means one node."""
    if nodes is None:
        return [list(range(n))]
    if len(nodes) != n:
        raise ValueError(f"nodes has {len(nodes)} entries for {n} ranks")
    groups: dict[object, list[int]] = {}
    for r, node in enumerate(nodes):
        groups.setdefault(node, []).append(r)
    return list(groups.values())


_RECENT: dict[tuple, tuple] = {}


def nccl_trees(n: int, nodes: Sequence[int] | None = None,
               pattern: Pattern | str = Pattern.BALANCED_TREE
               ) -> tuple[list[TreeRank], list[TreeRank]]:
    """The two trees NCCL builds over ``n`` ranks placed on ``nodes``: an intra-node chain
    per node (``ncclTopoPreset``) joined by the inter-node double binary tree
    (``connectTrees`` over ``ncclGetDtree(nNodes, node)``), attached per ``pattern``.

    Returns, for tree 0 and tree 1, the :class:`TreeRank` of every rank. Cached (every
    rank's generator asks for the same trees), so callers must not modify the result.
    The same ``nodes`` object is found without hashing its n entries again.
    """
    key = (n, id(nodes), pattern)
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is nodes:
        return hit[1]
    got = _nccl_trees(n, None if nodes is None else tuple(nodes), pattern)
    if len(_RECENT) >= 8:
        _RECENT.clear()
    _RECENT[key] = (nodes, got)          # holding nodes keeps its id from being reused
    return got


@lru_cache(maxsize=64)
def _nccl_trees(n: int, nodes: tuple[int, ...] | None, pattern: Pattern | str
                ) -> tuple[list[TreeRank], list[TreeRank]]:
    pat = Pattern.parse(pattern)
    groups = node_groups(n, nodes)
    nn = len(groups)

    def attach(g: list[int]) -> tuple[int, int, int]:
        """(treeToParent, treeToChild0, treeToChild1) of a node: ranks, not indexes."""
        c0 = 0 if pat is Pattern.TREE else 1
        c1 = 1 if pat is Pattern.SPLIT_TREE else 0
        if len(g) == 1:
            c0 = c1 = 0
        return g[0], g[c0], g[c1]

    ends = [attach(g) for g in groups]
    trees: list[list[TreeRank]] = []
    for t in range(2):
        up = [-1] * n
        down: list[list[int]] = [[] for _ in range(n)]
        for node, g in enumerate(groups):
            for i, r in enumerate(g):        # the chain: treeIntra[i-1] <- r -> treeIntra[i+1]
                up[r] = -1 if i == 0 else g[i - 1]
                if i + 1 < len(g):
                    down[r].append(g[i + 1])
            u, d0, d1 = dtree(nn, node)[t]
            ctype = dtree_child_types(nn, node)[t]
            ttp, ttc0, ttc1 = ends[node]
            if u != -1:                       # setTreeUp: parent node's child0 or child1 end
                up[ttp] = ends[u][1] if ctype == 0 else ends[u][2]
            if d0 != -1:                      # setTreeDown(ttc0, ttp[d0])
                down[ttc0].append(ends[d0][0])
            if d1 != -1:                      # setTreeDown(ttc1, ttp[d1])
                down[ttc1].append(ends[d1][0])
        trees.append([TreeRank(up[r], tuple(down[r])) for r in range(n)])
    return trees[0], trees[1]


def tree_root(tree: Sequence[TreeRank]) -> int:
    """The rank with no parent."""
    roots = [r for r, t in enumerate(tree) if t.up == -1]
    if len(roots) != 1:
        raise ValueError(f"tree has {len(roots)} roots")
    return roots[0]


def rooted_btree(n: int, root: int) -> list[TreeRank]:
    """:func:`btree` over ranks, relabelled so that ``root`` is the tree's root (for the
    rooted collectives: virtual rank ``v = (r − root) mod n``)."""
    out = []
    for r in range(n):
        u, d0, d1 = btree(n, (r - root) % n)
        out.append(TreeRank(-1 if u == -1 else (u + root) % n,
                            tuple((d + root) % n for d in (d0, d1) if d != -1)))
    return out
