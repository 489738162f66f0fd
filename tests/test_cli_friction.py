"""Small CLI rough edges: doctor's default and several directories, algo show -n 0,
distinct perf plot labels, a closed pipe, flight-recorder dump retention."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ringtree.perf import format as fmt
from ringtree.perf import plot
from ringtree.perf.flags import Options
from ringtree.prof import flight

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "ringtree.cli", *args], capture_output=True,
                          text=True, timeout=60, env=e, **kw)


@pytest.mark.parametrize("n", ["0", "-3"])
def test_algo_show_rejects_a_bad_rank_count(n):
    p = cli("algo", "show", "ring", "all_reduce", "-n", n)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "rank count must be >= 1" in p.stderr


def _fr(directory: Path, size: int = 2) -> None:
    directory.mkdir(parents=True)
    for r in range(size):
        st = {"rank": r, "size": size, "comm": "rt/world", "state": "idle", "current": None,
              "waiting": [], "where": "x.py:1", "last_enqueued": 3, "last_completed": 3,
              "time_ns": 0}
        (directory / f"fr_rank{r}.json").write_text(json.dumps({"comms": [st]}))


def test_doctor_takes_several_directories_and_defaults_to_the_newest(tmp_path):
    a, b = tmp_path / "ringtree-fr-aaaa", tmp_path / "ringtree-fr-bbbb"
    _fr(a)
    _fr(b)
    os.utime(a, (time.time() - 100, time.time() - 100))
    p = cli("doctor", str(a), str(b))
    assert p.returncode == 0, p.stderr
    assert f"== {a}" in p.stdout and f"== {b}" in p.stdout
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = cli("doctor", env=env)
    assert p.returncode == 0, p.stderr
    assert "ringtree doctor: communicator 'rt/world'" in p.stdout
    p = cli("doctor", str(tmp_path / "nope"), env=env)
    assert p.returncode == 2 and "no such directory" in p.stderr and str(b) in p.stderr


def test_perf_plot_labels_files_apart(tmp_path, monkeypatch):
    def doc(transport: str | None) -> str:
        rep = fmt.JsonReport(args=[], env=[f"RINGTREE_TRANSPORT={transport}"] if transport
                             else [], library=0, cfg=Options(), devices=[],
                             extra_config={"backend": "ringtree", "collective": "all_reduce"})
        rep.begin_row(8, 2, "float", "sum", -1)
        rep.body(False, 10.0, 1.0, 1.0, 0)
        rep.body(True, 10.0, 1.0, 1.0, 0)
        rep.end_row(20)
        return rep.render(0, 1.0)

    seen = []
    monkeypatch.setattr(plot, "plot_docs", lambda docs, path: seen.append(docs))
    files = {"shm.json": "shm", "tcp.json": "tcp", "x.json": None, "y.json": None}
    for name, transport in files.items():
        (tmp_path / name).write_text(doc(transport))
    assert plot.main([str(tmp_path / n) for n in ("shm.json", "tcp.json")]) == 0
    labels = [s.label for lab, d in seen[-1] for s in plot.series_of(d, lab)]
    assert labels == ["ringtree all_reduce [transport shm] (float, sum)",
                      "ringtree all_reduce [transport tcp] (float, sum)"]
    assert plot.main([str(tmp_path / n) for n in ("x.json", "y.json")]) == 0
    labels = [s.label for lab, d in seen[-1] for s in plot.series_of(d, lab)]
    assert labels == ["ringtree all_reduce [x.json] (float, sum)",
                      "ringtree all_reduce [y.json] (float, sum)"]


def test_a_closed_pipe_is_not_a_traceback():
    proc = subprocess.Popen(
        f"{sys.executable} -m ringtree.cli algo show ring all_reduce -n 64 | head -1",
        shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    out, err = proc.communicate(timeout=60)
    assert out.strip() and "Traceback" not in err and "BrokenPipe" not in err, err


def test_prof_cli_closed_pipe(tmp_path):
    from ringtree import cli as rcli

    def noisy(argv):
        raise BrokenPipeError

    r, w = os.pipe()
    saved = os.dup(1)
    try:
        os.dup2(w, 1)
        import types

        sys.modules["ringtree._noisy_test_cmd"] = types.SimpleNamespace(main=noisy)
        rcli.SUBCOMMANDS["noisy"] = ("ringtree._noisy_test_cmd", "")
        assert rcli.main(["noisy"]) == 141
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(r)
        os.close(w)
        rcli.SUBCOMMANDS.pop("noisy", None)
        sys.modules.pop("ringtree._noisy_test_cmd", None)


def test_flight_dump_directories_have_a_retention_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RINGTREE_FR_KEEP", "3")
    now = time.time()
    dirs = []
    for i in range(6):  # two hours old and older, oldest last
        d = tmp_path / f"ringtree-fr-old{i}"
        d.mkdir()
        os.utime(d, (now - 7200 - 60 * i, now - 7200 - 60 * i))
        dirs.append(d)
    fresh = tmp_path / "ringtree-fr-fresh"  # another job may be using this one
    fresh.mkdir()
    ancient = tmp_path / "ringtree-fr-ancient"
    ancient.mkdir()
    os.utime(ancient, (now - 30 * 86400, now - 30 * 86400))
    new = tmp_path / "ringtree-fr-new"
    new.mkdir()
    flight.prune_dumps(keep=str(new), now=now)
    left = sorted(p.name for p in tmp_path.iterdir())
    # three kept in all: the new one, the one in use, the newest old one
    assert left == sorted(["ringtree-fr-new", "ringtree-fr-fresh", "ringtree-fr-old0"]), left
