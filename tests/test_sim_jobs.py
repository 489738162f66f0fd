"""``ringtree sim -j``: algorithms simulated in worker processes print what one process
prints, byte for byte (tables, skipped algorithms, their order), whatever finishes first."""

from __future__ import annotations

from ringtree.sim import jobs
from ringtree.sim.cli import main as sim_main


def _out(capsys, *extra: str) -> str:
    argv = ["all_reduce", "--topology", "dgx_h100", "--nodes", "2", "--algo",
            "collnet_direct,ring,tree,direct2,hierarchical", "-b", "8", "-e", "4M", "-f", "8",
            *extra]
    assert sim_main(argv) == 0
    return capsys.readouterr().out


def test_workers_print_what_one_process_prints(capsys):
    one = _out(capsys, "-j", "1")
    assert "# collnet_direct: skipped" in one and "# algo: hierarchical" in one
    assert _out(capsys, "-j", "3") == one
    assert _out(capsys) == one                   # the default: one worker per core


def test_run_all_keeps_the_algorithms_order_and_reports_every_size():
    seen: list[tuple[str, int]] = []

    def one(algo, each):
        for k in range(len(algo)):               # a size per letter
            each(k)
        return ("ok", [algo] * len(algo), 0.0) if algo != "bad" else ("skipped", "no", 0)

    names = ["tree", "bad", "ring", "a", "direct2"]
    got = jobs.run_all(names, one, 3, lambda a, ev: seen.append((a, ev)))
    assert list(got) == names
    assert got["ring"] == ("ok", ["ring"] * 4, 0.0) and got["bad"][0] == "skipped"
    assert sorted(seen) == sorted((a, k) for a in names for k in range(len(a)))
    assert jobs.default_jobs(1) == 1 and jobs.default_jobs(100) >= 1
