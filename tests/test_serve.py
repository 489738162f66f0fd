"""The decode engine, scheduler, router and ``ringtree generate``.

Greedy outputs must not depend on prefix caching, eviction, preemption, the tensor-
parallel degree or the replica a request lands on; every configuration is checked
against the plain model recomputing the whole sequence for each token.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from ringtree.apps.kvcache import BlockPool, ideal_hit_tokens  # noqa: E402
from ringtree.apps.models.gpt import GPT, GPTConfig, init_state_dict  # noqa: E402
from ringtree.apps.serve.generate import generate  # noqa: E402
from ringtree.apps.serve.router import Router, route_all  # noqa: E402
from ringtree.apps.serve.runner import CacheOptions  # noqa: E402
from ringtree.apps.serve.scheduler import Plan, Request, Scheduler  # noqa: E402
from ringtree.testing import free_port  # noqa: E402
from ringtree.torch.testing import TorchRankPool  # noqa: E402

CFG = GPTConfig(block_size=256, n_layer=2, n_head=4, n_embd=64)
SEED = 3
NEW = 12


def _prompts(n: int = 8, groups: int = 1) -> list[list[int]]:
    rng = random.Random(5)
    systems = [[rng.randrange(96) for _ in range(45)] for _ in range(groups)]
    return [systems[i % groups] + [rng.randrange(96) for _ in range(rng.randrange(2, 30))]
            for i in range(n)]


def _reference(prompts: list[list[int]], new: int = NEW) -> list[list[int]]:
    model = GPT(CFG)
    model.load_state_dict(init_state_dict(CFG, SEED))
    model = model.double().eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            t = list(p)
            for _ in range(new):
                t.append(int(model(torch.tensor([t]))[0, -1].argmax()))
            out.append(t[len(p):])
    return out


# small pool: 16 blocks of 8 tokens, the longest request needs 11: evictions, preemptions
SMALL = dict(num_blocks=16, block_size=8, max_batch=4)


def _serve(world, prompts, tp, opts, **kw):
    s = generate(world, prompts, NEW, tp=tp, cfg=CFG, state_dict=init_state_dict(CFG, SEED),
                 opts=opts, **kw)
    if s is None:
        return None
    return {"outputs": s.outputs, "hit": s.cache_total("hit_tokens"),
            "evicted": s.cache_total("evicted_blocks"), "replica_of": s.replica_of,
            "preemptions": sum(r.preemptions for r in s.replicas),
            "json": s.to_json()}


def _serve_gloo(world, prompts, tp, opts):
    return _serve(world, prompts, tp, opts, backend="gloo")


def _cached_and_uncached(comm, prompts, tp, policy):
    return [_serve(comm, prompts, tp, CacheOptions(prefix_cache=c, policy=policy, **SMALL))
            for c in (True, False)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread, as every launched rank has (OMP_NUM_THREADS=1): on a busy
    host, spinning OpenMP workers make these tiny matmuls 30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def prompts():
    return _prompts()


@pytest.fixture(scope="module")
def reference(prompts):
    return _reference(prompts)


class _Solo:
    rank, size = 0, 1


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_tp1_cached_equals_uncached_equals_model(prompts, reference, policy):
    cached, plain = _cached_and_uncached(_Solo(), prompts, 1, policy)
    assert cached["outputs"] == plain["outputs"] == reference
    assert cached["hit"] > 0 and plain["hit"] == 0
    assert cached["evicted"] > 0 and cached["preemptions"] > 0 and plain["preemptions"] > 0


def _on_ranks(ctx, port, fn, *args):
    """Run ``fn(comm, *args)`` with this rank's ringtree world (made once per rank, its
    store on ``port``)."""
    import ringtree

    comm = ctx.scratch.get("comm")
    if comm is None:
        comm = ctx.scratch["comm"] = ringtree.init(master_port=port, timeout=60)
    if fn is None:
        comm.close()
        return None
    return fn(comm, *args)


class _Ranks:
    """A rank pool whose functions get a ringtree world."""

    def __init__(self, n: int):
        self.pool = TorchRankPool(n, backend=None, gloo=False, timeout=150)
        self.port = free_port()

    def run(self, fn, *args):
        return self.pool.run_ok(_on_ranks, self.port, fn, *args)

    def close(self) -> None:
        if self.pool.alive:
            self.pool.run(_on_ranks, self.port, None)
        self.pool.close()


def _pool(n):
    ranks = _Ranks(n)
    try:
        yield ranks
    finally:
        ranks.close()


@pytest.fixture(scope="module")
def pool2():
    yield from _pool(2)


@pytest.fixture(scope="module")
def pool4():
    yield from _pool(4)


def test_pinned_system_prompt_survives_pressure(prompts, reference):
    from ringtree.apps.serve.engine import TPEngine
    from ringtree.apps.serve.runner import serve
    from ringtree.apps.serve.tpcomm import SoloTP

    opts = CacheOptions(num_blocks=20, block_size=8, max_batch=4, pin_cap_ratio=0.3,
                        pin_tokens=prompts[0][:40])
    eng = TPEngine(CFG, init_state_dict(CFG, SEED), SoloTP(), 20, 8)
    reqs = [Request(i, p, NEW) for i, p in enumerate(prompts)]
    res = serve(eng, SoloTP(), reqs, opts)
    assert [res.outputs[i] for i in range(len(prompts))] == reference
    assert res.cache["pinned_tokens"] == 40 and res.cache["evicted_blocks"] > 0
    # every request after the first found the pinned 40 tokens (5 blocks) cached
    assert res.cache["hit_tokens"] >= 40 * (len(prompts) - 1)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_cached_equals_uncached(prompts, reference, tp, request):
    pool = request.getfixturevalue(f"pool{tp}")
    res = pool.run(_cached_and_uncached, prompts, tp, "lru")
    cached, plain = res[0]
    assert all(r == [None, None] for r in res[1:])
    assert cached["outputs"] == plain["outputs"] == reference
    assert cached["evicted"] > 0 and cached["preemptions"] > 0


def test_gloo_tp_backend_gives_the_same_tokens(pool2, prompts, reference):
    opts = CacheOptions(**SMALL)
    res = pool2.run(_serve_gloo, prompts, 2, opts)
    assert res[0]["outputs"] == reference and res[1] is None


def test_two_replicas_route_by_prefix(pool2):
    prompts = _prompts(8, groups=2)
    ref = _reference(prompts)
    opts = CacheOptions(num_blocks=64, block_size=8, max_batch=4)
    got = pool2.run(_serve, prompts, 1, opts)[0]
    assert got["outputs"] == ref
    where = got["replica_of"]
    assert {where[i] for i in range(0, 8, 2)} != {where[i] for i in range(1, 8, 2)}
    assert len({where[i] for i in range(0, 8, 2)}) == 1     # group 0 stays together
    assert len({where[i] for i in range(1, 8, 2)}) == 1
    assert got["hit"] == ideal_hit_tokens(prompts, 8)


def test_router_prefers_the_replica_holding_the_prefix_unless_overloaded():
    a, b = [1] * 64, [2] * 64
    r = Router(2, 16)
    assert [r.route(a + [i]) for i in range(3)] == [0, 0, 0]   # 0.75 match vs load
    assert r.route(b + [0]) == 1
    assert r.route(a + [9]) == 0
    rr = route_all([a + [i] for i in range(4)], 2, 16, "round-robin")
    assert rr == [0, 1, 0, 1]
    # with a heavy load weight, affinity gives way to balance
    assert route_all([a + [i] for i in range(4)], 2, 16, "cache", beta=100.0) == [0, 1, 0, 1]
    # one replica far ahead of the mean spills new work to the other
    spill = route_all([a + [i] for i in range(40)], 2, 16, "cache", batch=4)
    assert spill[:4] == [0] * 4 and spill.count(1) == 20
    with pytest.raises(ValueError, match="unknown router"):
        Router(2, 16, "random")


def test_scheduler_preempts_newest_and_recomputes():
    pool = BlockPool(4, 4)
    s = Scheduler(pool, max_batch=4)
    for i in range(2):
        s.add(Request(i, [10 * i + j for j in range(7)], 8))    # 2 blocks each at once
    plan = s.schedule()
    assert [q.seq for q in plan.seqs] == [0, 1]
    s.update(plan, [0, 0])                                       # 8 tokens: still 2 blocks
    plan = s.schedule()
    s.update(plan, [0, 0])                                       # now 9 tokens: 3 blocks
    plan = s.schedule()                                          # no room for both
    assert plan.preempted == [1] and [q.seq for q in plan.seqs] == [0]
    assert s.requests[1].blocks == [] and s.waiting[0].id == 1
    assert Plan.decode(plan.encode()) == Plan(plan.seqs)
    while s.has_work:
        plan = s.schedule()
        s.update(plan, [0] * len(plan.seqs))
    assert all(len(s.requests[i].output) == 8 for i in range(2))
    assert s.requests[1].preemptions >= 1


# ---- the CLI ------------------------------------------------------------------------


def _write(tmp_path, lines) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _cli(tmp_path, lines, *flags) -> tuple[int, str]:
    prompts = _write(tmp_path, lines)
    p = subprocess.run([sys.executable, "-m", "ringtree.cli", "generate", "--prompts",
                        prompts, *flags], capture_output=True, text=True, timeout=120,
                       env=_env())
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("lines,flags,message", [
    ([{"prompt": "hi"}, {"prompt": "x" * 250}], ["--max-new-tokens", "10"],
     "request 1: prompt of 250 tokens + 10 new tokens exceeds the model's context of 256"),
    ([{"prompt": "hi"}, {"prompt": ""}], ["--max-new-tokens", "4"], "request 1: empty prompt"),
    ([{"tokens": [1, 2, 3]}], ["--max-new-tokens", "40", "--cache-blocks", "2"],
     "request 0: needs 3 blocks of 16 tokens but the pool holds 2 usable blocks"),
    ([{"prompt": "hi"}], ["--max-new-tokens", "4", "--tp", "3"],
     "--tp 3 does not divide the model's 4 attention heads"),
    ([{"prompt": "hi"}, {"text": "hi"}], ["--max-new-tokens", "4"],
     "request 1 ("),
    ([{"tokens": [1, 500]}], ["--max-new-tokens", "4"],
     "request 0: token id 500 is outside the vocabulary of 96"),
])
def test_generate_bad_input_names_the_request(tmp_path, capsys, lines, flags, message):
    from ringtree.apps.serve import cli

    code = cli.main(["--prompts", _write(tmp_path, lines), *flags])
    out = capsys.readouterr()
    assert code == 2 and message in out.err, out
    assert out.err.startswith("ringtree generate: error: ")


def test_generate_json_schema_tp2_matches_tp1(tmp_path):
    lines = [{"prompt": "def main():\n    return " + s} for s in ("1", "22", "333")]
    lines.append({"tokens": [5, 6, 7, 8]})
    out1, out2 = tmp_path / "a.json", tmp_path / "b.json"
    code, log = _cli(tmp_path, lines, "--max-new-tokens", "6", "--json", str(out1),
                     "--seed", "1", "--quiet")
    assert code == 0, log
    p = subprocess.run([sys.executable, "-m", "ringtree.cli", "run", "-n", "2",
                        sys.executable, "-m", "ringtree.cli", "generate", "--tp", "2",
                        "--prompts", str(tmp_path / "prompts.jsonl"), "--max-new-tokens",
                        "6", "--seed", "1", "--json", str(out2), "--quiet"],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 0, p.stdout + p.stderr
    a, b = json.loads(out1.read_text()), json.loads(out2.read_text())
    assert set(a) == {"requests", "cache", "tokens_per_s"}
    assert set(a["cache"]) == {"hit_tokens", "miss_tokens", "evicted_blocks"}
    assert [r["id"] for r in a["requests"]] == [0, 1, 2, 3]
    assert all(set(r) == {"id", "tokens", "ttft_ms"} and len(r["tokens"]) == 6
               for r in a["requests"])
    assert [r["tokens"] for r in a["requests"]] == [r["tokens"] for r in b["requests"]]
    assert a["cache"] == b["cache"]


def test_generate_serves_a_training_checkpoint(tmp_path, capsys):
    """A checkpoint in the training layer's format gives what the same weights give."""
    from ringtree.apps.serve import cli

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text(json.dumps({
        "format": "ringtree-train/1", "step": 0, "grid": {"dp": 1, "tp": 1, "pp": 1},
        "model": CFG.to_dict(), "spec": {}}))
    torch.save({"model": init_state_dict(CFG, SEED)}, ckpt / "rank00000.pt")
    prompts = _write(tmp_path, [{"tokens": p} for p in _prompts(3)])
    outs = []
    for i, source in enumerate((["--checkpoint", str(ckpt)],
                                ["--seed", str(SEED), "--layers", "2", "--embd", "64"])):
        out = tmp_path / f"{i}.json"
        flags = ["--prompts", prompts, "--max-new-tokens", "5", "--json", str(out), "--quiet"]
        assert cli.main([*flags, *source]) == 0, capsys.readouterr()
        outs.append([r["tokens"] for r in json.loads(out.read_text())["requests"]])
    assert outs[0] == outs[1] == _reference(_prompts(3), 5)
    with pytest.raises(SystemExit):
        cli.main(["--prompts", prompts, "--max-new-tokens", "5", "--seed", "1",
                  "--checkpoint", str(ckpt)])
    assert cli.main(["--prompts", prompts, "--max-new-tokens", "5",
                     "--checkpoint", str(tmp_path / "nothing")]) == 2
    assert "not a ringtree checkpoint" in capsys.readouterr().err
