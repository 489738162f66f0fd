"""The checker runs CollNet's virtual ranks (the switches) like any other rank."""

from __future__ import annotations

import dataclasses

import pytest

from ringtree.ir.check import CheckError, check_programs, with_virtual
from ringtree.schedules import Options, generate_all


def _programs(algo: str, n: int, ppn: int, fanin: int, channels: int = 1):
    opts = Options(channels=channels, nodes=tuple(r // ppn for r in range(n)),
                   params=(("collnet_fanin", fanin),))
    return with_virtual(generate_all("all_reduce", algo, n, opts))


@pytest.mark.parametrize("algo", ["collnet_direct", "collnet_chain"])
@pytest.mark.parametrize("n,ppn,fanin,channels", [(4, 1, 0, 1), (8, 2, 0, 2), (8, 2, 2, 1),
                                                  (12, 3, 2, 2), (16, 1, 4, 1)])
def test_virtual_ranks_are_proven(algo, n, ppn, fanin, channels):
    progs = _programs(algo, n, ppn, fanin, channels)
    assert len(progs) > n, "expected switch programs"
    for in_place in (False, True):
        rep = check_programs(progs, in_place=in_place)
        assert rep.nranks == n


def _drop_member(progs, n):
    """A root switch that forgets one of its children."""
    v = progs[-1]
    ch = list(v.channels)
    i = max(k for k, c in enumerate(ch) if c)
    s = ch[i][0]
    ch[i] = (dataclasses.replace(s, recv_from=s.recv_from[1:], reduce=len(s.recv_from) > 2),
             ) + ch[i][1:]
    return progs[:-1] + [dataclasses.replace(v, channels=tuple(ch))]


def test_a_switch_that_misses_a_member_is_caught():
    progs = _programs("collnet_direct", 8, 2, 0)
    with pytest.raises(CheckError):
        check_programs(_drop_member(progs, 8))


def test_a_program_beyond_the_ranks_must_be_virtual():
    progs = _programs("collnet_direct", 4, 1, 0)
    fake = dataclasses.replace(progs[-1], meta={})
    with pytest.raises(CheckError, match="not a virtual rank"):
        check_programs(progs[:-1] + [fake])


def test_the_tuner_charges_a_switch_like_a_port():
    from ringtree.ir.program import Collective
    from ringtree.schedules.stats import host_stats

    opts = Options(nodes=(0, 1, 2, 3))
    cn = host_stats(Collective.ALL_REDUCE, "collnet_direct", 4, opts)
    ring = host_stats(Collective.ALL_REDUCE, "ring", 4, opts)
    assert cn.host_out == cn.host_in == 1.0       # M up, M down through the switch
    assert ring.host_out == ring.host_in == 1.5   # 2(n-1)/n M for a ring of 4 hosts
    assert cn.inter_depth == 2                    # host -> switch -> host


@pytest.mark.parametrize("coll", ["broadcast", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n,ppn,channels,root", [(4, 1, 1, 0), (4, 1, 2, 3), (6, 2, 1, 1),
                                                 (5, 1, 1, 2), (3, 3, 1, 0)])
def test_multicast_and_reduce_scatter_switches_are_proven(coll, n, ppn, channels, root):
    opts = Options(channels=channels, nodes=tuple(r // ppn for r in range(n)), root=root)
    progs = with_virtual(generate_all(coll, "collnet_direct", n, opts))
    assert (len(progs) > n) == (ppn < n), "switch programs exactly when hosts differ"
    for in_place in (False, True):
        assert check_programs(progs, in_place=in_place).nranks == n


@pytest.mark.parametrize("coll", ["broadcast", "all_gather", "reduce_scatter"])
def test_the_tuner_charges_multicast_switches_like_ports(coll):
    from ringtree.schedules.stats import host_stats

    cn = host_stats(coll, "collnet_direct", 4, Options(nodes=(0, 1, 2, 3)))
    assert cn.inter_depth == 2                    # host -> switch -> host, for any p
