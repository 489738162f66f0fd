"""The collective matrix, compact, under each transport: shm forced, tcp forced, and a mixed
job where fake host identities put half the ranks on each of two "hosts" (shm inside a
host, TCP between them, both at once in one collective); the reductions and the 16 MiB
cases also with shm's direct reads (cross-memory attach) for every message ≥ 4 KiB.

Each rank process builds one communicator per mode by splitting the world after setting
``RINGTREE_TRANSPORT`` / ``RINGTREE_HOST_ID`` (read when a communicator is made), so one
pool of processes per N serves every mode. Results are bitwise against NumPy with exact
inputs (the helpers of ``test_collectives.py``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from collective_cases import make_input, reference_reduce, same_bits, sizes_for
from test_collectives import _one_movement, _one_reduction

from ringtree.dtypes import DType
from ringtree.testing import RankPool
from ringtree.transports import shm_cma as cma

MODES = ["shm", "tcp", "mixed"]
NRANKS = [2, 3, 4, 8]
BIG = (16 << 20) // 4 + 3  # > 16 MiB of float32, not divisible by any N here
REDUCTIONS = [("float32", ["sum", "max", "avg", "premul_sum"]), ("int32", ["sum", "prod", "bxor"]),
              ("bfloat16", ["sum"]), ("float64", ["min"])]

_COMMS: dict = {}  # in each rank process: mode -> communicator


def _mode_comm(comm, mode: str):
    sub = _COMMS.get(mode)
    if sub is None:
        keys = ("RINGTREE_TRANSPORT", "RINGTREE_HOST_ID", "RINGTREE_SHM_DIRECT_MIN")
        saved = {k: os.environ.get(k) for k in keys}
        os.environ["RINGTREE_TRANSPORT"] = {"mixed": "auto", "direct": "shm"}.get(mode, mode)
        os.environ["RINGTREE_HOST_ID"] = f"h{comm.rank * 2 // comm.size}" if mode == "mixed" \
            else "one-host"
        os.environ["RINGTREE_SHM_DIRECT_MIN"] = "4096" if mode == "direct" else "0"
        try:
            sub = _COMMS[mode] = comm.split(0)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return sub


def transports(comm, mode):
    return sorted({t.name for t in _mode_comm(comm, mode).fabric.transports})


def reductions(comm, mode, colls, sizes, cases):
    c = _mode_comm(comm, mode)
    n = c.size
    failures: list[str] = []
    for coll in colls:
        for dname, ops in cases:
            dt = DType(dname)
            for op in ops:
                for count in sizes:
                    for in_place in (False, True):
                        root = (count + len(op)) % n
                        label = f"[{mode}] {coll} {dname} {op} count={count} " \
                                f"in_place={in_place} root={root}"
                        try:
                            _one_reduction(c, coll, dt, op, count, in_place, root, None,
                                           failures, label)
                        except Exception as e:  # noqa: BLE001 - report per case
                            return failures + [f"{label}: {type(e).__name__}: {e}"]
    return failures


def movements(comm, mode, colls, dtypes, sizes):
    c = _mode_comm(comm, mode)
    failures: list[str] = []
    for coll in colls:
        for dname in dtypes:
            for count in sizes:
                root = count % c.size
                label = f"[{mode}] {coll} {dname} count={count} root={root}"
                try:
                    _one_movement(c, coll, DType(dname), count, root, None, failures, label)
                except Exception as e:  # noqa: BLE001
                    return failures + [f"{label}: {type(e).__name__}: {e}"]
    return failures


def big(comm, mode):
    """> 16 MiB all-reduce and broadcast: many slices, many slots, the zero-copy path."""
    c = _mode_comm(comm, mode)
    x = make_input(c.rank, BIG, DType.FLOAT32, "sum")
    want = reference_reduce([make_input(q, BIG, DType.FLOAT32, "sum") for q in range(c.size)],
                            DType.FLOAT32, "sum")
    c.all_reduce(x)
    ok = [same_bits(x, want)]
    y = make_input(7, BIG, DType.FLOAT32, "move") if c.rank == 1 else \
        np.zeros(BIG, np.float32)
    c.broadcast(y, root=1)
    ok.append(same_bits(y, make_input(7, BIG, DType.FLOAT32, "move")))
    return ok


@pytest.fixture(scope="module", params=NRANKS, ids=lambda n: f"n{n}")
def pool(request):
    with RankPool(request.param) as p:
        yield p


def _assert_clean(results):
    for r, fails in enumerate(results):
        assert not isinstance(fails, BaseException), f"rank {r}: {fails!r}"
        assert not fails, f"rank {r}: " + "\n".join(fails[:10])


@pytest.mark.parametrize("mode", MODES)
def test_modes_use_the_transports_they_say(pool, mode):
    want = {"shm": ["shm"], "tcp": ["tcp"],
            "mixed": ["tcp"] if pool.nranks == 2 else ["shm", "tcp"]}[mode]
    for r, kinds in enumerate(pool.run_ok(transports, mode)):
        if mode == "mixed" and pool.nranks == 3 and r == 2:
            assert kinds == ["tcp"]  # alone on its host
        else:
            assert kinds == want, f"rank {r}: {kinds}"


@pytest.mark.parametrize("mode", [*MODES, "direct"])
def test_reductions(pool, mode):
    n = pool.nranks
    _assert_clean(pool.run(reductions, mode, ["all_reduce", "reduce_scatter", "reduce"],
                           sizes_for(n)[:4], REDUCTIONS))
    _assert_clean(pool.run(reductions, mode, ["all_reduce", "reduce_scatter"],
                           [sizes_for(n)[-1]], [("float32", ["sum"])]))


@pytest.mark.parametrize("mode", MODES)
def test_data_movement(pool, mode):
    _assert_clean(pool.run(movements, mode, ["all_gather", "broadcast", "gather", "scatter",
                                             "all_to_all", "send_recv", "barrier"],
                           ["int8", "float64"], sizes_for(pool.nranks)))


@pytest.mark.parametrize("mode", [*MODES, "direct"])
def test_16mib(pool, mode):
    if mode == "direct" and not cma.supported():
        pytest.skip("no process_vm_readv here")
    if pool.nranks == 8 and mode != "mixed":
        pytest.skip("16 MiB on 8 ranks: the mixed job covers it")
    for r, ok in enumerate(pool.run_ok(big, mode)):
        assert all(ok), f"rank {r}: {ok}"
