"""The link bound: what the busiest host must move over its link, per collective."""

from __future__ import annotations

import pytest

from ringtree.perf import format as fmt
from ringtree.perf.backends import Link
from ringtree.perf.linkbound import host_bytes, link_bound

S = 1 << 20
TWO_BY_TWO, FOUR_BY_ONE, TWO_BY_FOUR = (0, 0, 1, 1), (0, 1, 2, 3), (0,) * 4 + (1,) * 4
UNEVEN = (0, 0, 0, 1)  # three ranks on host 0, one on host 1


@pytest.mark.parametrize("coll, nodes, share", [
    ("all_reduce", TWO_BY_TWO, 1.0),           # 2(L-1)/L, whatever the ranks per host
    ("all_reduce", TWO_BY_FOUR, 1.0),
    ("all_reduce", FOUR_BY_ONE, 1.5),
    ("all_reduce", UNEVEN, 1.0),
    ("all_gather", TWO_BY_TWO, 0.5),           # (L-1)/L of the gathered output
    ("all_gather", FOUR_BY_ONE, 0.75),
    ("reduce_scatter", TWO_BY_FOUR, 0.5),
    ("all_gather", UNEVEN, 0.75),              # host 0 sends its 3 blocks at least once
    ("reduce_scatter", UNEVEN, 0.75),          # host 1 receives 3 blocks' contributions
    ("broadcast", FOUR_BY_ONE, 1.0),
    ("reduce", TWO_BY_FOUR, 1.0),
    ("alltoall", TWO_BY_TWO, 1.0),             # 2 ranks x 2 remote blocks of S/4 each
    ("alltoall", FOUR_BY_ONE, 0.75),
    ("alltoall", UNEVEN, 0.75),
    ("gather", UNEVEN, 0.25),                  # root's host 0 receives host 1's block
    ("scatter", TWO_BY_FOUR, 0.5),
    ("sendrecv", TWO_BY_TWO, 1.0),             # one rank per host sends across
    ("sendrecv", (0, 1, 0, 1), 2.0),           # both ranks of each host send across
])
def test_the_busiest_hosts_bytes(coll, nodes, share):
    assert host_bytes(coll, S, nodes) == pytest.approx(share * S)


def test_a_rooted_collective_is_bound_by_the_roots_host():
    assert host_bytes("gather", S, UNEVEN, root=3) == pytest.approx(0.75 * S)
    assert host_bytes("gather", S, UNEVEN, root=0) == pytest.approx(0.25 * S)


def test_one_host_has_no_link_to_bound_and_bad_input_is_named():
    assert host_bytes("all_reduce", S, (0, 0, 0)) == 0.0
    assert link_bound("all_reduce", S, TWO_BY_TWO, 125e6) == pytest.approx(S / 125e6)
    with pytest.raises(ValueError, match="bandwidth"):
        link_bound("all_reduce", S, TWO_BY_TWO, 0)
    with pytest.raises(ValueError, match="'barrier'"):
        host_bytes("barrier", S, TWO_BY_TWO)


def test_the_perf_block_shows_the_link_and_each_halfs_fraction():
    link = Link((0, 0, 1, 1), 125e6, "measured by rank 0")
    lines = fmt.link_block(link, [(S, -1, S / 125e6, [0.931, 0.94]), (8, -1, 8 / 125e6, [])])
    assert lines[1] == ("# Link bound           : 2 hosts (2, 2 ranks), inter-host link "
                        "1,000 Mbit/s each way (measured by rank 0)")
    assert lines[3].split() == ["#", str(S), "-1", "8388.6", "93.1%", "94.0%"]
    assert lines[4].split() == ["#", "8", "-1", "0.1"]
