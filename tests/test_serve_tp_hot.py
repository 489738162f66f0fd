"""tp 2 decode's all-reduces: the communicator's hot path, the rank-order fold's bits, the
same greedy tokens over ringtree and gloo; and ``benchmarks/generate_tp.py``'s pure parts
and one tiny run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from ringtree.apps.models.gpt import GPTConfig, init_state_dict  # noqa: E402
from ringtree.apps.serve.tpcomm import BUFFERS, SoloTP  # noqa: E402
from ringtree.testing import free_port  # noqa: E402
from ringtree.torch.testing import TorchRankPool  # noqa: E402

CFG = GPTConfig(block_size=96, n_layer=2, n_head=4, n_embd=64)
BENCH_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "generate_tp.py")


def _bench():
    here = os.path.dirname(os.path.abspath(BENCH_PATH))  # its sibling tp_peers, as a script
    if here not in sys.path:                             # run from there finds it
        sys.path.append(here)
    spec = importlib.util.spec_from_file_location("generate_tp_bench", BENCH_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _decode(comm, dtype):
    from ringtree.apps.serve.engine import TPEngine
    from ringtree.apps.serve.runner import CacheOptions, serve
    from ringtree.apps.serve.scheduler import Request

    prompts = [[(5 * i + j * j) % 96 for j in range(9 + 3 * i)] for i in range(5)]
    opts = CacheOptions(num_blocks=40, block_size=8, max_batch=3)   # batches change shape
    eng = TPEngine(CFG, init_state_dict(CFG, 4), comm, 40, 8, dtype)
    reqs = [Request(i, p, 10) for i, p in enumerate(prompts)] if comm.rank == 0 else None
    res = serve(eng, comm, reqs, opts)
    return (None if res is None else [res.outputs[i] for i in range(5)]), eng.all_reduces


def _on_ranks(ctx, port):
    import os

    import numpy as np

    import ringtree
    from ringtree.apps.serve.tpcomm import GlooTP, RingtreeTP

    torch.set_num_threads(1)
    # the generic calls counted are the decode's: no measuring calls (ll_stores' barriers)
    os.environ["RINGTREE_TUNE"] = "model"
    world = ringtree.init(master_port=port, timeout=60)
    try:
        assert world.ll is not None
        misses: list[int] = []
        general_calls: list = []
        now = world.ll._now

        def counted(comm, x, *args):
            misses.append(x.size)
            return now(comm, x, *args)
        world.ll._now = counted
        run = world._run

        def general(spec, *args):          # the generic path (async, algo=, ...)
            general_calls.append((spec.coll, spec.count))
            return run(spec, *args)
        world._run = general
        rt, gl = RingtreeTP(world), GlooTP(None, 0, world.rank, 2)
        # the rank-order fold's bits on inexact data, through a reused buffer and a fresh one
        rng = np.random.default_rng(11 + world.rank)
        bits = []
        for rows in (3, 7, 3):
            mine = rng.standard_normal((rows, CFG.n_embd)).astype(np.float32)
            both = world.all_gather(mine)
            for comm in (rt, gl):
                t = comm.buffer(rows, CFG.n_embd, torch.float32)
                t.copy_(torch.from_numpy(mine))
                comm.all_reduce(t)
                bits.append(t.numpy().tobytes() == (both[0] + both[1]).tobytes())
        del misses[:], general_calls[:]
        rt_tokens, reduces = _decode(rt, torch.float32)
        hot_misses = len(misses)
        # the generic path plans a new shape once; a shape seen before never goes there
        twice = {c for c in general_calls if general_calls.count(c) > 1}
        assert not twice, f"calls of an already planned shape took the generic path: {twice}"
        gl_tokens, _ = _decode(gl, torch.float32)
        solo = _decode(SoloTP(), torch.float32)[0] if world.rank == 0 else None
        return dict(bits=bits, rt=rt_tokens, gl=gl_tokens, solo=solo, reduces=reduces,
                    misses=hot_misses, shapes=len(set(misses)))
    finally:
        world.close()


def test_tp2_all_reduces_take_the_hot_path_with_the_folds_bits():
    pool = TorchRankPool(2, backend="gloo", gloo=False, timeout=150)
    try:
        res = pool.run_ok(_on_ranks, free_port())
    finally:
        pool.close()
    for r in res:
        assert all(r["bits"]), r["bits"]
        # a call misses the hot path only where its row count changes (at most twice per
        # shape: plan it, then make it the hot shape); every other all-reduce is one C call
        assert r["misses"] <= 2 * r["shapes"] + 2 * 2 and r["reduces"] >= 5 * r["misses"], r
    # with 2 ranks each sum is one addition: ringtree's and gloo's decodes are bitwise alike
    assert res[0]["rt"] == res[0]["gl"] and res[0]["rt"] is not None
    assert len(res[0]["solo"]) == 5 and all(len(t) == 10 for t in res[0]["rt"])


def test_buffers_are_reused_per_shape_and_bounded():
    c = SoloTP()
    a = c.buffer(4, 8, torch.float32)
    assert c.buffer(4, 8, torch.float32) is a and c.buffer(4, 8, torch.float64) is not a
    assert c._numpy(a) is c._numpy(a)                  # the kept view
    other = torch.zeros(4, 8)
    assert c._numpy(other).ctypes.data == other.data_ptr()
    for rows in range(1, BUFFERS + 3):
        c.buffer(rows, 8, torch.float32)
    assert len(c._bufs) <= BUFFERS and len(c._views) == len(c._bufs)


def test_bench_arguments_are_checked(capsys):
    b = _bench()
    a = b.parse_args(["--rounds", "2", "--backends", "ringtree,gloo"])
    assert a.backends == ["ringtree", "gloo"] and a.rounds == 2
    for bad, msg in ((["--rounds", "0"], "--rounds must be >= 1"),
                     (["--backends", "ringtree,mpi"], "unknown backend mpi"),
                     (["--heads", "3", "--embd", "96"], "multiple of 2"),
                     (["--vllm-so", "/nonexistent/x.so"], "--vllm-so '/nonexistent/x.so' does")):
        with pytest.raises(SystemExit):
            b.parse_args(bad)
        assert msg in capsys.readouterr().err
    skip = b.skipped(b.parse_args([]))
    assert "not given" in skip["deepspeed"] and "not given" in skip["vllm"]
    assert b.skipped(b.parse_args(["--backends", "ringtree"])) == {}
    assert "float32" in b.skipped(b.parse_args(["--backends", "vllm", "--dtype",
                                                 "float64"]))["vllm"]


def test_bench_says_why_a_kernel_library_does_not_load(tmp_path):
    so = tmp_path / "_C_AVX512.abi3.so"
    so.write_bytes(b"not an ELF file")
    loads, msg = _bench().tp_peers.vllm_loads(str(so), sys.executable)
    assert not loads and msg.startswith("does not load: OSError") and "avx512f" in msg, msg


def test_bench_table_and_differences():
    b = _bench()
    assert b.first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == "request 1 token 1: 4 vs 5"
    assert b.first_difference([[1]], [[1]]) == ""
    res = {"backends": {
        "ringtree": {"tokens_per_s": [100.0, 300.0, 200.0], "ar_us_call": [5.0],
                     "ar_us_token": [10.0], "tokens": [[1]]},
        "gloo": {"tokens_per_s": [50.0, 50.0], "ar_us_call": [40.0], "ar_us_token": [80.0],
                 "tokens": [[2]], "diff": "request 0 token 0: 2 vs 1"},
        "tp1": {"tokens_per_s": [400.0], "tokens": [[1]]}},
        "skipped": {"deepspeed": "not given", "vllm": "does not load: x"}}
    lines = b.table(res).splitlines()
    assert lines[1].split()[:3] == ["ringtree", "200", "1.00"]
    assert lines[2].split()[:4] == ["gloo", "50", "0.25", "40.0"] and "NO: request 0" in lines[2]
    assert lines[3].split()[:6] == ["tp1", "400", "2.00", "-", "-", "-"] and "yes" in lines[3]
    assert "skipped deepspeed: not given" in lines and lines[-1] == \
        "skipped vllm: does not load: x"


def test_bench_tiny_run(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, BENCH_PATH, "--rounds", "1", "--requests", "2",
                        "--new-tokens", "3", "--layers", "1", "--embd", "32",
                        "--backends", "ringtree,torch,gloo", "--json", str(out), "--timeout", "200"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = res["backends"]
    assert set(rows) == {"ringtree", "torch", "gloo", "tp1"}
    for name in ("torch", "gloo"):
        assert "diff" not in rows[name] and rows[name]["tokens"] == rows["ringtree"]["tokens"]
        assert len(rows[name]["ar_alone_us"]) == 1
    assert all(v.startswith("same bits") for v in res["bits"].values()), res["bits"]
    assert "deepspeed" not in res["skipped"] and "skipped" not in r.stdout
