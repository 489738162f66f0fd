"""The nccl-tests harness on real ranks (in-process communicators from ringtree.testing).

Checks the table a run prints (row count, sizes, #wrong), that a deliberately corrupted
result is counted and fails the run, and the JSON of a real run.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from ringtree.perf import format as fmt
from ringtree.perf.backends import RingtreeBackend
from ringtree.perf.bench import Harness
from ringtree.perf.flags import auto_iters, parse_args
from ringtree.testing import RankPool, raise_first


class CorruptingBackend(RingtreeBackend):
    """Flips one bit of rank 1's result after every operation completes."""

    def run(self, o, blocking):
        self._last = o
        super().run(o, True)

    def wait(self):
        super().wait()
        o = getattr(self, "_last", None)
        if self.rank == 1 and o is not None and o.recv is not None and o.recv.size:
            o.recv.view(np.uint8)[-1] ^= 1


def _run(comm, argv: list[str], corrupt: bool = False) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    cls = CorruptingBackend if corrupt else RingtreeBackend
    rc = Harness(parse_args(argv), cls(comm=comm), out, err).run()
    return rc, out.getvalue() + err.getvalue()


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def pool3():
    with RankPool(3, env={"RINGTREE_TIMEOUT": "60"}) as p:
        yield p


COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall",
         "gather", "scatter", "sendrecv"]


@pytest.mark.parametrize("coll", COLLS)
def test_every_collective_verifies(pool3, coll):
    argv = [coll, "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-r", "all"]
    results = raise_first(pool3.run(_run, argv))
    rc, text = results[0]
    assert rc == 0, text
    rows = _rows(text)
    roots = 3 if coll in ("broadcast", "reduce", "gather", "scatter") else 1
    assert len(rows) == 4 * roots  # sizes 8, 64, 512, 4096
    for r in rows:
        assert len(r) == 13, r
        assert r[8] == "0" and (r[12] == "0" or (coll == "sendrecv" and r[12] == "N/A"))
    assert "# Out of bounds values : 0 OK" in text
    assert all(t == (0, "") or t[0] == 0 for t in results[1:])  # other ranks print nothing


def test_all_types_and_ops(pool3):
    rc, text = raise_first(pool3.run(_run, ["all_reduce", "-b", "64", "-e", "64", "-n", "1",
                                            "-d", "all", "-o", "sum"]))[0]
    assert rc == 0, text
    assert [r[2] for r in _rows(text)] == ["int8", "uint8", "int32", "uint32", "int64",
                                           "uint64", "half", "float", "double", "bfloat16"]
    rc, text = raise_first(pool3.run(_run, ["reduce_scatter", "-b", "96", "-e", "96", "-n",
                                            "1", "-d", "half", "-o", "all"]))[0]
    assert rc == 0, text
    assert [r[3] for r in _rows(text)] == ["sum", "prod", "max", "min", "avg", "mulsum"]


def test_corrupted_result_is_counted(pool3):
    argv = ["all_reduce", "-b", "8", "-e", "512", "-f", "8", "-n", "1", "-w", "0"]
    rc, text = raise_first(pool3.run(_run, argv, corrupt=True))[0]
    rows = _rows(text)
    assert len(rows) == 3
    for r in rows:  # exactly the one corrupted element, out-of-place and in-place
        assert r[8] == "1" and r[12] == "1", r
    # nccl-tests counts each failing measurement on every rank: 3 rows x 2 halves x 3 ranks
    assert "# Out of bounds values : 18 FAILED" in text
    assert rc == 1


def test_no_check_prints_na(pool3):
    rc, text = raise_first(pool3.run(_run, ["all_gather", "-b", "1K", "-e", "1K", "-c", "0",
                                            "-n", "1"], corrupt=True))[0]
    assert rc == 0
    assert _rows(text)[0][8] == "N/A" and _rows(text)[0][12] == "N/A"


def test_json_of_a_run(pool3, tmp_path):
    path = str(tmp_path / "run.json")
    rc, text = raise_first(pool3.run(_run, ["broadcast", "-b", "8", "-e", "128", "-f", "4",
                                            "-n", "2", "-r", "1", "-J", path]))[0]
    assert rc == 0, text
    assert f"# Writing JSON output to {path}" in text.splitlines()[0]
    doc = fmt.load_json(path)
    rows = _rows(text)
    assert [r["size"] for r in doc["results"]] == [int(r[0]) for r in rows] == [8, 32, 128]
    for rec, row in zip(doc["results"], rows):
        assert rec["root"] == "     1" and rec["redop"] == "none" and rec["type"] == "float"
        assert rec["out_of_place"]["nwrong"] == 0.0
        assert fmt.float_str(rec["out_of_place"]["bus_bw"], 6).strip() == row[7]
    assert len(doc["config"]["devices"]) == 3
    assert doc["config"]["backend"] == "ringtree"
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(  # %lf: 6 decimals
        float(text.split("Avg bus bandwidth    :")[1].split()[0]), abs=1e-6)
    json.dumps(doc)


def test_blocking_modes_and_aggregation(pool3):
    for extra in (["-z", "1"], ["-z", "2"], ["-z", "3", "-m", "2"], ["-m", "3", "-a", "2"],
                  ["-C", "1", "-S", "1", "-N", "2", "-u", "1"]):
        rc, text = raise_first(pool3.run(_run, ["alltoall", "-b", "96", "-e", "384", "-f",
                                                "4", "-n", "2"] + extra))[0]
        assert rc == 0, (extra, text)
        assert len(_rows(text)) == (4 if "-N" in extra else 2)


def _issued(comm, issue_async: bool) -> tuple[int, set]:
    """The ``async_op`` values the harness's all-reduces were issued with."""
    seen: set = set()
    real = comm.all_reduce

    def spy(*args, **kw):
        seen.add(bool(kw.get("async_op")))
        return real(*args, **kw)

    comm.all_reduce = spy
    try:
        be = RingtreeBackend(comm=comm)
        be.issue_async = issue_async
        rc = Harness(parse_args(["all_reduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "3"]),
                     be, io.StringIO(), io.StringIO()).run()
    finally:
        del comm.all_reduce
    return rc, seen


def test_z0_issues_blocking_calls_unless_async(pool3):
    """``-z 0`` times back-to-back calls that each complete on the calling thread (a
    user's blocking call); ``--async`` issues them with ``async_op=True``."""
    assert parse_args(["all_reduce", "--async"]).issue_async
    assert not parse_args(["all_reduce"]).issue_async
    for rc, seen in raise_first(pool3.run(_issued, False)):
        assert rc == 0 and seen == {False}
    for rc, seen in raise_first(pool3.run(_issued, True)):
        assert rc == 0 and True in seen


def test_default_iterations_per_size(pool3, tmp_path):
    """``-n`` left at 0 times 1,000 calls of a small size and nccl-tests' 20 from 1.6 MB
    (a 20-call train of 2 µs calls would mostly time the ranks' skew leaving the barrier)."""
    assert (auto_iters(8), auto_iters(64 << 10), auto_iters(2 << 20)) == (1000, 512, 20)
    path = str(tmp_path / "n.json")
    rc, text = raise_first(pool3.run(_run, ["all_reduce", "-b", "8", "-e", "2M", "-f", "512",
                                            "-J", path]))[0]
    assert rc == 0, text
    assert "iters: 0 agg iters" in text and "# Iters 0: per size" in text
    doc = fmt.load_json(path)
    assert [(r["size"], r["actual_iterations"]) for r in doc["results"]] == \
        [(8, 1000), (4096, 1000), (2 << 20, 20)]
