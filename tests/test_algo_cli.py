"""``ringtree algo list | show | check``."""

from __future__ import annotations

import sys

import pytest

from ringtree.cli import main as ringtree_main
from ringtree.ir.program import Collective
from ringtree.schedules import algorithms
from ringtree.tools import algo as algo_cli
from ringtree.tools.viz import cell, cost_of, step_table, timeline


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = algo_cli.main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_list_every_pair_with_a_cost(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for c in Collective:
        for a in algorithms(c):
            assert any(line.split()[:2] == [c.value, a] for line in out.splitlines()), (c, a)
    mine = ["tree", "tree_updown", "recursive_doubling", "rabenseifner", "direct", "direct2",
            "hierarchical"]
    for a in mine:
        assert "α" in cost_of(Collective.ALL_REDUCE, a), a
    assert "lg p" in cost_of(Collective.ALL_REDUCE, "rabenseifner")
    assert cost_of(Collective.ALL_GATHER, "bruck").startswith("⌈lg p⌉·α")
    # the ring module's bullet: "- all-reduce: 2(p−1)·α + …"
    assert cost_of(Collective.ALL_REDUCE, "ring").startswith("2(p−1)·α")
    code, out, _ = run(capsys, "list", "allgather")
    assert code == 0 and "all_reduce" not in out and "bruck" in out


def test_show_ring_is_nccls_step_order(capsys):
    # nccl.md §1.6, n = 4: rank r sends r−1, r−2, r−3, then stores r, then r−1, r−2, r+1
    code, out, _ = run(capsys, "show", "ring", "all_reduce", "-n", "4", "--width", "300")
    assert code == 0
    rows = {int(line.split("|")[0]): [c.strip() for c in line.split("|")[1:]]
            for line in out.splitlines() if line.strip()[:1].isdigit() and "|" in line}
    assert rows[0] == ["S →1 i3", "RRS ←3 →1 i2", "RRS ←3 →1 i1", "RRCS ←3 →1 io0",
                       "RCS ←3 →1 o3", "RCS ←3 →1 o2", "R ←3 o1"]
    for r in range(4):
        assert rows[r][0] == f"S →{(r + 1) % 4} i{(r - 1) % 4}"
        assert rows[r][3].endswith(f"io{r}")
        assert rows[r][6] == f"R ←{(r - 1) % 4} o{(r + 1) % 4}"
    assert "legend:" in out and "RRS=recvReduceSend" in out


def test_show_long_names_and_bands(capsys):
    code, out, _ = run(capsys, "show", "ring", "all_reduce", "-n", "4", "--long",
                       "--width", "80")
    assert code == 0
    assert "recvReduceCopySend ←3 →1 io0" in out
    assert out.count("rank |") >= 2                  # cut into bands at 80 columns
    assert max(len(line) for line in out.splitlines()[1:]) <= 120


def test_show_tree_with_nodes_and_time(capsys):
    code, out, _ = run(capsys, "show", "tree", "all_reduce", "-n", "8", "--ppn", "2",
                       "--param", "pattern=split_tree", "--time", "--width", "400")
    assert code == 0
    assert "channels=2" in out and "t 0" in out and "-- channel 1" in out
    code2, out2, _ = run(capsys, "show", "tree", "all_reduce", "-n", "8",
                         "--nodes", "0,0,1,1,2,2,3,3", "--param", "pattern=split_tree",
                         "--time", "--width", "400")
    assert code2 == 0 and out2 == out


def test_show_every_algorithm(capsys):
    for c in Collective:
        for a in algorithms(c):
            if a.startswith(("collnet", "nvls")):
                continue
            code, out, err = run(capsys, "show", a, c.value, "-n", "5", "--root", "2",
                                 "--ppn", "2")
            assert code == 0, (a, c, err)
            assert out.startswith(f"{a} {c.value}  n=5")


def test_show_errors(capsys):
    code, _, err = run(capsys, "show", "nope", "all_reduce", "-n", "4")
    assert code == 2 and "no algorithm 'nope'" in err and "ring" in err
    code, _, err = run(capsys, "show", "ring", "all_reduce", "-n", "4", "--nodes", "0,1")
    assert code == 2 and "--nodes" in err
    code, _, err = run(capsys, "show", "ring", "all_reduce")
    assert code == 2
    code, _, err = run(capsys, "show", "ring", "all_reduce", "-n", "4", "--param", "x")
    assert code == 2 and "KEY=VALUE" in err


def test_check(capsys):
    code, out, _ = run(capsys, "check", "rabenseifner", "all_reduce", "-n", "1-6")
    assert code == 0 and "12/12 checks passed" in out and "in-place" in out
    code, out, _ = run(capsys, "check", "all", "broadcast", "-n", "3,5", "--root", "-1")
    assert code == 0 and "FAIL" not in out
    code, _, err = run(capsys, "check", "bruck", "all_reduce", "-n", "4")
    assert code == 2 and "no algorithm 'bruck' for all_reduce" in err


def test_check_reports_failures(capsys, monkeypatch):
    from ringtree.ir.check import CheckError

    def broken(programs, in_place=False):
        raise CheckError("deadlocks: made up")

    monkeypatch.setattr("ringtree.ir.check.check_programs", broken)
    code, out, _ = run(capsys, "check", "ring", "all_reduce", "-n", "3")
    assert code == 1 and "FAIL ring all_reduce n=3" in out and "0/2 checks passed" in out


def test_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "tree.png"
    code, out, _ = run(capsys, "show", "tree", "all_reduce", "-n", "6", "--param", "flat=true",
                       "--png", str(path))
    assert code == 0 and f"wrote {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import fails
    code, out, err = run(capsys, "show", "ring", "all_gather", "-n", "3", "--png",
                         str(tmp_path / "x.png"))
    assert code == 1 and "matplotlib" in err and "pip install" in err
    assert "ring all_gather" in out                  # the table is still printed


def test_dispatch_through_ringtree_command(capsys):
    assert ringtree_main(["algo", "show", "direct", "all_gather", "-n", "2"]) == 0
    assert "direct all_gather  n=2" in capsys.readouterr().out


def test_timeline_and_cells():
    from ringtree.schedules import generate_all

    progs = generate_all("all_reduce", "ring", 4)
    events, messages = timeline(progs)
    assert len(events) == 28 and len(messages) == 24
    assert max(e.start for e in events) == 6             # 2(p−1) dependent steps
    assert cell(progs[0].channels[0][3]) == "RRCS ←3 →1 io0"
    assert "recvReduceCopySend" in step_table(progs, long=True, width=500)
