"""MSCCL-IR files run: every proven public file on real ranks of this machine, the
planner choosing files from the folders before its own algorithms, files written for LL
on LL, across testbed hosts, and in the simulator.

The public corpus is read from ``RINGTREE_MSCCL_CORPUS`` or the reference material's
folder beside the checkout (see test_msccl.py); those tests skip, saying so, where it is
absent."""

from __future__ import annotations

import pytest
from test_msccl import CORPUS, FILES, GOOD, REJECTED, corpus

from ringtree import msccl
from ringtree.testing import run_msccl_files, run_ranks


def _proven(n: int) -> list[str]:
    return [str(p) for p in FILES if p.name not in REJECTED and msccl.read(str(p))[0].ngpus == n]


@corpus
@pytest.mark.parametrize("n", [4, 8])
def test_every_proven_public_file_gives_exact_results_on_real_ranks(n):
    """Every proven 4- and 8-GPU file, in each mode it declares, in one job: every
    element exact on every rank, on LL where the file says proto="LL" (its rounds through
    the shared segment), on Simple otherwise."""
    files = _proven(n)
    assert files
    want = ["exact (LL)" if msccl.read(f)[0].proto == "LL" else "exact (Simple)"
            for f in files]
    for r, got in enumerate(run_ranks(run_msccl_files, n, files, timeout=600)):
        assert not isinstance(got, BaseException), f"rank {r}: {got!r}"
        assert dict(zip(files, got)) == dict(zip(files, want)), f"rank {r}"


def _ll_and_simple(comm, path: str) -> tuple:
    """An LL file on random floats, on LL and (inside a group) on Simple: the bits of
    both, and of rank 0's LL result."""
    import numpy as np

    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(2 * 24 * 3).astype(np.float32)
    on_ll, on_simple = x.copy(), x.copy()      # the file runs in place
    comm.all_reduce(on_ll, algo=f"msccl:{path}")
    proto = comm.planner._last.protocol
    with comm.group():
        comm.all_reduce(on_simple, algo=f"msccl:{path}")
    first = comm.broadcast(on_ll.copy(), root=0)
    return proto, on_ll.tobytes() == on_simple.tobytes(), on_ll.tobytes() == first.tobytes()


@corpus
def test_ll_gives_the_bits_simple_gives():
    """Random float32 inputs (sums that round): the LL rounds of a file written for LL
    and the same file on Simple give the same bits, on every rank."""
    got = run_ranks(_ll_and_simple, 4, str(CORPUS / "ar_tree_12_LL.xml"), timeout=120)
    assert got == [("ll", True, True)] * 4


def _calls(comm) -> list[tuple]:
    """(algorithm, protocol, exact) of calls that name no algorithm."""
    import numpy as np

    from ringtree.ops import ReduceOp

    got = []
    for count, op in ((64, ReduceOp.SUM), (1024, ReduceOp.SUM), (7, ReduceOp.SUM),
                      (64, ReduceOp.AVG)):
        x = np.arange(count, dtype=np.float32) * 2 + comm.rank
        x = comm.all_reduce(x, op, out=np.empty_like(x))  # exported files: out of place
        want = sum(np.arange(count, dtype=np.float32) * 2 + r for r in range(comm.size))
        if op is ReduceOp.AVG:
            want = want / np.float32(comm.size)
        got.append((comm.planner._last.algo, comm.planner._last.protocol,
                    bool(np.array_equal(x, want))))
    for in_place in (True, False):
        y = np.empty(8, np.float32)
        x = y[comm.rank * 4:comm.rank * 4 + 4] if in_place else np.empty(4, np.float32)
        x[...] = np.arange(4) + 10 * comm.rank
        comm.all_gather(x, out=y)
        got.append((comm.planner._last.algo, comm.planner._last.protocol,
                    bool(np.array_equal(y, np.concatenate([np.arange(4) + 10 * r
                                                           for r in range(2)])))))
    return got


def test_the_planner_chooses_files_from_the_folders_before_its_own(tmp_path):
    """MSCCL_ALGO_DIR first, then RINGTREE_MSCCL_ALGOS, each in file name order: the
    first file whose collective, ranks, mode, size window and chunks fit serves the call
    (a file written for LL on LL); a refused file is passed over; otherwise, and for AVG,
    ringtree's own algorithm runs."""
    from test_msccl_errors import double_counting

    from ringtree.tools.algo import main

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "0_wrong.xml").write_text(double_counting())   # refused: never run
    assert main(["export", "ring", "all_reduce", "-n", "2", "--proto", "LL",
                 "-o", str(tmp_path / "ll.xml")]) == 0
    (first / "a_small.xml").write_text((tmp_path / "ll.xml").read_text()
                                       .replace('maxBytes="0"', 'maxBytes="1024"'))
    assert main(["export", "ring", "all_reduce", "-n", "2", "-o", str(second / "b_any.xml")
                 ]) == 0
    (second / "gather.xml").write_text(GOOD)
    env = {"MSCCL_ALGO_DIR": str(first), "RINGTREE_MSCCL_ALGOS": str(second)}
    for r, got in enumerate(run_ranks(_calls, 2, env=env, timeout=120)):
        assert not isinstance(got, BaseException), f"rank {r}: {got!r}"
        assert [g[2] for g in got] == [True] * 6, got
        assert [g[:2] for g in got[:2]] == [("msccl:a_small", "ll"),
                                            ("msccl:b_any", "simple")]
        assert not got[2][0].startswith("msccl:")   # 7 elements: not in 2 equal chunks
        assert not got[3][0].startswith("msccl:")   # AVG: the executors give it no file
        assert got[4][0] == "msccl:gather"          # in place, as the file says
        assert not got[5][0].startswith("msccl:")   # out of place: not this file


@corpus
def test_public_files_run_across_testbed_hosts():
    """The 4-GPU files on 2 hosts x 2 ranks (shared memory within a host, TCP between):
    exact on every rank (on Simple: LL needs every rank on one host)."""
    from ringtree.testbed import Testbed, available
    from ringtree.testbed.pool import run_hosts

    ok, why = available()
    if not ok:
        pytest.skip(why)
    files = _proven(4)
    with Testbed(2, rate="1gbit") as tb:
        results = run_hosts(tb, [2, 2], run_msccl_files, files, timeout=300)
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), f"rank {r}: {got!r}"
        assert got == ["exact (Simple)"] * len(files), f"rank {r}"


@corpus
def test_sim_runs_imported_files_on_the_presets(capsys):
    from ringtree.sim.cli import main

    f4, f8 = CORPUS / "ar_hier_12_Simple.xml", CORPUS / "allgather-8n-0-8kb.xml"
    assert main(["all_reduce", "-t", "ring", "-N", "4", "--algo", f"msccl:{f4},ring",
                 "-b", "1K", "-e", "64K", "-f", "8"]) == 0
    out = capsys.readouterr().out
    assert "# algo: msccl:ar_hier_12_simple" in out and "skipped" not in out
    assert main(["all_gather", "-t", "dgx_a100", "-N", "1", "--algo", f"msccl:{f8}",
                 "-b", "8K", "-e", "8K"]) == 0
    assert "# algo: msccl:allgather-8n-0-8kb" in capsys.readouterr().out
    from ringtree.tools.algo import main as algo_main

    assert algo_main(["show", f"msccl:{CORPUS / 'ag_hier_4_LL.xml'}", "all_gather",
                      "-n", "4"]) == 0                # drawn like a native schedule
    drawn = capsys.readouterr().out
    assert "msccl:ag_hier_4_ll all_gather  n=4" in drawn and "-- channel 3" in drawn
    # a file for other ranks or another collective is refused by name
    assert main(["all_reduce", "-t", "ring", "-N", "4", "--algo", f"msccl:{f8}"]) == 2
    assert "is an MSCCL-IR all_gather, not all_reduce" in capsys.readouterr().err
