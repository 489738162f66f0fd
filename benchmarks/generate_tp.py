"""Tensor-parallel decode (``ringtree generate --tp 2``'s engine) with its all-reduce done by
ringtree, torch gloo or DeepSpeed's CPU shared-memory kernel, and tp 1 as the reference
without communication.

    python benchmarks/generate_tp.py [--rounds 5] [--requests 16] [--new-tokens 64] \\
        [--deepspeed-python VENV/bin/python --torch-ext DIR] [--vllm-so FILE] [--json OUT]

The script starts 2 ranks itself (pinned one per core when ranks <= cores, ``--no-pin``
turns that off), under ``--deepspeed-python`` when given (an interpreter with DeepSpeed and
the same torch; this checkout is put on its ``PYTHONPATH``), else under this interpreter.
Both ranks hold every backend at once and run the same serving job (the same model, prompts
and greedy decode, :func:`ringtree.apps.serve.runner.serve`) once per backend per round,
alternating the backends round by round (A B C A B C ...), so a slow phase of a shared
machine hits every column alike. Only the all-reduce differs between columns: the step
plan's broadcast is ringtree's in every column. Per backend: decode tokens/s (rank 0's
decode steps), the all-reduce's µs per call and per token (rank 0's time inside it, which
includes waiting for the other rank), medians over rounds, the raw rounds, and ratios.

Bits: each backend's greedy tokens are compared with ringtree's, and each backend's
all-reduce of random (inexact) float32 data with the rank-order fold ``x0 + x1`` computed
locally: with 2 ranks there is one addition per element, so any library that adds the two
values (in either order: IEEE addition is commutative) gives the same bits. A difference
is reported with where it is.

vLLM's CPU shm kernel lives in ``_C_AVX512.abi3.so``: ``--vllm-so`` loads it in a child
process first (it is built for AVX-512; a CPU without it gets SIGILL) and, where it
loads, runs it as the ``vllm`` backend (:mod:`tp_peers`); else it reports why not.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import tp_peers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("ringtree", "torch", "gloo", "deepspeed", "vllm")
RANKS = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: counts >= 1, known backends, existing files."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=16, help="prompts decoded together")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="DeepSpeed's kernel takes float32, bfloat16 and float16 only")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--deepspeed-python", help="an interpreter whose environment has "
                    "DeepSpeed (with the shm op built) and torch")
    ap.add_argument("--torch-ext", help="TORCH_EXTENSIONS_DIR holding DeepSpeed's built op")
    ap.add_argument("--vllm-so", help="vLLM's _C_AVX512.abi3.so (its shm all-reduce)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin ranks to cores")
    ap.add_argument("--profile", action="store_true", help="one more ringtree run under "
                    "torch.profiler: rank 0's time per token in matmuls, other torch ops, "
                    "the all-reduce and the rest (Python)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    ap.add_argument("--json", dest="json_out", help="write the results here")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ports", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for name in ("rounds", "requests", "new_tokens", "prompt_tokens", "layers", "heads",
                 "embd"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.embd % a.heads or a.heads % RANKS:
        ap.error(f"--heads {a.heads} must divide --embd {a.embd} and be a multiple of "
                 f"{RANKS} (the tp degree)")
    a.backends = [b for b in a.backends.split(",") if b]
    bad = [b for b in a.backends if b not in BACKENDS]
    if bad or not a.backends:
        ap.error(f"unknown backend {bad[0] if bad else '(none)'}; choose from "
                 f"{', '.join(BACKENDS)}")
    for opt in ("deepspeed_python", "torch_ext", "vllm_so"):
        path = getattr(a, opt)
        if path is not None and not os.path.exists(path):
            ap.error(f"--{opt.replace('_', '-')} {path!r} does not exist")
    return a


def skipped(a: argparse.Namespace) -> dict[str, str]:
    """Backends that cannot run, with the reason (before any rank starts)."""
    out = {}
    if "deepspeed" in a.backends:
        if a.deepspeed_python is None:
            out["deepspeed"] = "not given (--deepspeed-python VENV/bin/python)"
        elif a.dtype != "float32":
            out["deepspeed"] = f"its fp kernel takes float32, not {a.dtype}"
    if "vllm" in a.backends:
        if a.dtype != "float32":
            out["vllm"] = f"its kernel takes float32, bfloat16 and float16, not {a.dtype}"
        else:
            loads, why = tp_peers.vllm_loads(a.vllm_so, a.deepspeed_python or sys.executable)
            if not loads:
                out["vllm"] = why
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _cell(x: float, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if x != x else f"{x:{width}.{digits}f}"


def table(res: dict) -> str:
    """The report: medians, ratios to ringtree, raw rounds, bits and skips."""
    rows, base = res["backends"], res["backends"].get("ringtree")
    ref = median(base["tokens_per_s"]) if base else float("nan")
    lines = [f"{'backend':<10} {'decode tok/s':>12} {'÷ ringtree':>10} {'AR µs/call':>10} "
             f"{'AR µs/token':>11} {'AR alone µs':>11} {'tokens == ringtree':>18}  "
             "rounds (tok/s)"]
    for name, r in rows.items():
        tps = median(r["tokens_per_s"])
        same = "-" if name == "ringtree" or base is None else \
            ("yes" if r["tokens"] == base["tokens"] else "NO: " + r.get("diff", ""))
        lines.append(f"{name:<10} {_cell(tps, 12, 0)} {_cell(tps / ref, 10, 2)} "
                     f"{_cell(median(r.get('ar_us_call', [])), 10, 1)} "
                     f"{_cell(median(r.get('ar_us_token', [])), 11, 1)} "
                     f"{_cell(median(r.get('ar_alone_us', [])), 11, 1)} {same:>18}  "
                     + " ".join(f"{x:.0f}" for x in r["tokens_per_s"]))
    for name, msg in res.get("bits", {}).items():
        lines.append(f"bits {name}: {msg}")
    prof = res.get("profile")
    if prof:
        lines.append(f"profile (ringtree, rank 0, under torch.profiler): "
                     f"{prof['all_reduces_per_step']:.0f} all-reduces per step; µs per token: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in prof["us_per_token"].items()))
    for name, why in res.get("skipped", {}).items():
        lines.append(f"skipped {name}: {why}")
    return "\n".join(lines)


def first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    """Where two runs' greedy tokens first differ ("" when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return f"request {i} token {j}: {p} vs {q}"
        if len(x) != len(y):
            return f"request {i}: {len(x)} vs {len(y)} tokens"
    return "" if len(a) == len(b) else f"{len(a)} vs {len(b)} requests"


# ---- the ranks --------------------------------------------------------------------------


def _timed(comm):
    """Wrap ``comm.all_reduce`` to add its time (ns) and calls to ``comm.clock``."""
    inner = comm.all_reduce
    comm.clock = [0, 0]

    def all_reduce(t):
        t0 = time.perf_counter_ns()
        inner(t)
        comm.clock[0] += time.perf_counter_ns() - t0
        comm.clock[1] += 1
    comm.all_reduce = all_reduce
    return comm


def _backends(a, rank: int, world, ds: bool) -> dict:
    """Every backend's TPComm on this rank; the plan broadcast is ringtree's in all."""
    import torch
    import torch.distributed as dist

    from ringtree.apps.serve.tpcomm import Buffers, RingtreeTP

    class Other(Buffers):
        def __init__(self, name: str, reduce) -> None:
            self.name, self.rank, self.size, self.reduce = name, rank, RANKS, reduce
            self.plan = RingtreeTP(world)

        def all_reduce(self, t) -> None:
            self.reduce(t)

        def broadcast_ints(self, words):
            return self.plan.broadcast_ints(words)

    out = {"ringtree": RingtreeTP(world)}
    if "torch" in a.backends:    # dist.all_reduce on a ringtree process group: its fast path
        import ringtree.torch  # noqa: F401 - registers the backend

        group = dist.new_group(backend="ringtree")
        out["torch"] = Other("torch", lambda t: dist.all_reduce(t, group=group))
    if "gloo" in a.backends:
        out["gloo"] = Other("gloo", lambda t: dist.all_reduce(t))
    if ds:
        out["deepspeed"] = Other("deepspeed", torch.ops.deepspeed.inference_all_reduce_)
    if "vllm" in a.backends and "vllm" not in a.skipped:
        out["vllm"] = Other("vllm", tp_peers.vllm_join(torch, dist, a.vllm_so,
                                                       f"rt-tp-{os.environ['MASTER_PORT']}"))
    return {k: _timed(v) for k, v in out.items() if k in a.backends}


def _bits(comms: dict, world, dtype) -> dict[str, str]:
    """Each backend's all-reduce of random data against the local rank-order fold."""
    import numpy as np
    import torch

    rng = np.random.default_rng(7 + world.rank)
    mine = rng.standard_normal(4099).astype(dtype)
    both = world.all_gather(mine)
    fold = both[0] + both[1]
    out = {}
    for name, c in comms.items():
        t = torch.from_numpy(mine.copy())
        c.all_reduce(t)
        u = f"u{mine.itemsize}"
        bad = np.flatnonzero(t.numpy().view(u) != fold.view(u))
        out[name] = "same bits as x0 + x1 on 4099 random values" if bad.size == 0 else \
            f"{bad.size} of 4099 differ from x0 + x1, first at {bad[0]}"
    return out


def _job(a):
    from ringtree.apps.models.gpt import GPTConfig, init_state_dict
    from ringtree.apps.serve.runner import CacheOptions
    from ringtree.apps.serve.scheduler import Request

    cfg = GPTConfig(block_size=a.prompt_tokens + a.new_tokens + 8, n_layer=a.layers,
                    n_head=a.heads, n_embd=a.embd)
    prompts = [[(7 * i + 3 * j + j * j) % cfg.vocab_size for j in range(a.prompt_tokens + i % 5)]
               for i in range(a.requests)]
    bs = 16
    blocks = a.requests * (-(-cfg.block_size // bs)) + 8
    opts = CacheOptions(num_blocks=blocks, block_size=bs, max_batch=a.requests,
                        max_prefill_tokens=1 << 20)
    return cfg, init_state_dict(cfg, 0), prompts, opts, lambda: [
        Request(i, p, a.new_tokens) for i, p in enumerate(prompts)]


def _run_one(cfg, sd, comm, reqs, opts, dtype, around=None):
    """Serve the job once on ``comm``: (rank 0's result, µs in the all-reduce, calls,
    wall µs of serve). ``around``, a context manager, encloses serve alone."""
    import contextlib

    from ringtree.apps.serve.engine import TPEngine
    from ringtree.apps.serve.runner import serve

    eng = TPEngine(cfg, sd, comm, opts.num_blocks, opts.block_size, dtype)
    comm.clock[:] = [0, 0]
    with around if around is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        res = serve(eng, comm, reqs if comm.rank == 0 else None, opts)
        wall = (time.perf_counter() - t0) * 1e6
    return res, comm.clock[0] / 1e3, comm.clock[1], wall


def _alone(comm, world, rows: int, cols: int, dtype, calls: int = 200) -> float:
    """µs per call of ``calls`` back-to-back all-reduces of the decode step's shape, after a
    barrier: the collective without the model's compute between calls."""
    t = comm.buffer(rows, cols, dtype).zero_()
    world.barrier()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        comm.all_reduce(t)
    return (time.perf_counter_ns() - t0) / calls / 1e3


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def _profile(run) -> dict:
    """µs per generated token of one run under torch.profiler (which slows every op a
    little): matmuls (their self time), the all-reduce (its wrapper's clock), every
    other torch op (self time), and the rest of the wall time: Python."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    r, ar_us, calls, wall = run(prof)
    if r is None:
        return {}
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    mm = sum(v for k, v in ops.items() if k in MATMULS)
    torch_ops = sum(v for k, v in ops.items() if k.startswith("aten::")) - mm
    n = r.generated
    return {"tokens": n, "all_reduces_per_step": calls / r.steps, "steps": r.steps,
            "us_per_token": {"matmul": mm / n, "other torch ops": torch_ops / n,
                             "all-reduce": ar_us / n,
                             "python and the rest": (wall - mm - torch_ops - ar_us) / n}}


def worker(a) -> None:
    """One rank: every backend, alternated round by round; rank 0 prints the results."""
    import torch

    rank = a.worker
    cores = sorted(os.sched_getaffinity(0))
    if not a.no_pin and RANKS <= len(cores):
        os.sched_setaffinity(0, {cores[rank]})
    torch.set_num_threads(1)
    import ringtree
    from ringtree.apps.serve.tpcomm import SoloTP

    p_rt, _ = (int(p) for p in a.ports.split(","))
    world = ringtree.init(rank, RANKS, "127.0.0.1", p_rt, timeout=120)
    ds_wanted = "deepspeed" in a.backends and "deepspeed" not in a.skipped
    ds, why = tp_peers.init_torch(ds_wanted)
    comms = _backends(a, rank, world, ds)
    dtype = getattr(torch, a.dtype)
    cfg, sd, prompts, opts, reqs = _job(a)
    res: dict = {"backends": {k: {"tokens_per_s": [], "ar_us_call": [], "ar_us_token": [],
                                  "ar_alone_us": []}
                              for k in [*comms, "tp1"]},
                 "skipped": a.skipped | ({"deepspeed": why} if why else {}),
                 "bits": _bits(comms, world, a.dtype)}
    for rnd in range(a.rounds + 1):              # round 0 warms every backend up
        for name in [*comms, "tp1"]:
            world.barrier()
            if name == "tp1" and rank != 0:
                continue
            if name != "tp1" and rnd:
                alone = _alone(comms[name], world, a.requests, a.embd, dtype)
                if rank == 0:
                    res["backends"][name]["ar_alone_us"].append(alone)
            comm = _timed(SoloTP()) if name == "tp1" else comms[name]
            r, ar_us, calls, _ = _run_one(cfg, sd, comm, reqs(), opts, dtype)
            if rank != 0 or rnd == 0:
                continue
            row = res["backends"][name]
            row["tokens_per_s"].append(r.decode_tokens / r.decode_s)
            row["tokens"] = [r.outputs[i] for i in range(len(prompts))]
            if name != "tp1":
                row["ar_us_call"].append(ar_us / calls)
                row["ar_us_token"].append(ar_us / r.generated)
                row["calls_per_step"], row["steps"] = calls / r.steps, r.steps
    if a.profile and "ringtree" in comms:
        world.barrier()
        res["profile"] = _profile(lambda p: _run_one(cfg, sd, comms["ringtree"], reqs(), opts,
                                                      dtype, p))
    world.barrier()
    if rank == 0:
        base = res["backends"]["ringtree"]["tokens"] if "ringtree" in comms else None
        for row in res["backends"].values():
            if base is not None and row["tokens"] != base:
                row["diff"] = first_difference(row["tokens"], base)
        if "diff" in res["backends"]["tp1"]:
            res["backends"]["tp1"]["diff"] += " (tp 1 sums each row-parallel product in " \
                "one pass, tp 2 adds two half sums: not the same rounding)"
        res["model"] = dict(layers=a.layers, heads=a.heads, embd=a.embd, dtype=a.dtype,
                            requests=a.requests, new_tokens=a.new_tokens,
                            all_reduce_bytes=a.requests * a.embd * dtype.itemsize)
        print("RESULT " + json.dumps(res), flush=True)
    world.close()
    import torch.distributed as dist

    dist.destroy_process_group()


def launch(a, argv: list[str]) -> dict:
    """Start the ranks, collect rank 0's result, remove DeepSpeed's leftover segments."""
    from ringtree.testing import free_port

    python = a.deepspeed_python or sys.executable
    ports = [free_port()]
    while len(ports) < 2:
        ports += [p for p in [free_port()] if p != ports[0]]
    env = dict(os.environ, WORLD_SIZE=str(RANKS), LOCAL_SIZE=str(RANKS),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[1]), OMP_NUM_THREADS="1",
               RT_TP_SKIPPED=json.dumps(a.skipped),
               DS_ACCELERATOR="cpu", PYTHONPATH=os.pathsep.join(
                   [REPO, *filter(None, [os.environ.get("PYTHONPATH")])]))
    if a.torch_ext:
        env["TORCH_EXTENSIONS_DIR"] = a.torch_ext
    procs = [subprocess.Popen(
        [python, os.path.abspath(__file__), *argv, "--worker", str(r),
         "--ports", ",".join(map(str, ports))], cwd="/", stdout=subprocess.PIPE,
        env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), text=True) for r in range(RANKS)]
    try:
        outs = [p.communicate(timeout=a.timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        raise SystemExit(f"the ranks did not finish within --timeout {a.timeout:g} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{ports[1]}_*"):
            os.unlink(f)
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    line = [x for x in outs[0].splitlines() if x.startswith("RESULT ")]
    return json.loads(line[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.worker is not None:  # what the launcher found unable to run
        a.skipped = json.loads(os.environ["RT_TP_SKIPPED"])
        worker(a)
        return
    a.skipped = skipped(a)
    res = launch(a, argv)
    res["load_average"] = os.getloadavg()
    m = res["model"]
    print(f"{RANKS} ranks, tp {RANKS}: GPT {m['layers']} layers x {m['embd']} wide, "
          f"{m['heads']} heads, {m['dtype']}; {m['requests']} requests decoded together, "
          f"{m['new_tokens']} new tokens; all-reduce of {m['all_reduce_bytes']} B per call; "
          f"{a.rounds} rounds; load average {res['load_average'][0]:.1f}")
    print(table(res))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
