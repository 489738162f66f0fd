"""The training layer on the ringtree backend: each parallelism against its reference.

- tensor parallel: every sharded layer against the unsharded one (column-parallel
  forward bitwise; row-parallel, embedding, cross-entropy and all gradients to 1e-6);
- pipeline parallel: GPipe and 1F1B over pp+3 micro-batches, every loss and gradient
  against one process running the whole model (atol 1e-6, nanotron's test);
- ZeRO-1 against plain data parallel;
- the same seed on grids (1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,2) for 20 steps;
- resume from a sharded checkpoint, bit-identical; the merged checkpoint loads into
  the plain model.

The model is tiny (2 layers, d=32, T=16) so 8 ranks on 2 cores stay quick.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra")
dist = pytest.importorskip("torch.distributed")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from ringtree.apps.models.gpt import GPTConfig, build_gpt  # noqa: E402
from ringtree.apps.parallel import checkpoint  # noqa: E402
from ringtree.apps.parallel import tensor_parallel as tpl  # noqa: E402
from ringtree.apps.parallel.grid import build_grid  # noqa: E402
from ringtree.apps.parallel.pipeline_parallel import run_stage  # noqa: E402
from ringtree.apps.parallel.trainer import Trainer, TrainSpec  # noqa: E402
from ringtree.torch.testing import TorchRankPool  # noqa: E402

pytestmark = pytest.mark.torch

TINY = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16)
GRID_STEPS = 20
GRID_RTOL = 1e-4


def _spec(**kw) -> TrainSpec:
    base = dict(model=TINY, batch_size=8, micro_batches=2, steps=GRID_STEPS, seed=7,
                warmup=3, bucket_bytes=16 * 1024)   # several buckets even at this size
    base.update(kw)
    return TrainSpec(**base)


@pytest.fixture(scope="module")
def pools():
    made: dict[int, TorchRankPool] = {}

    def get(n: int) -> TorchRankPool:
        if n not in made:
            made[n] = TorchRankPool(n, gloo=False, timeout=600, pg_timeout=240)
        return made[n]

    yield get
    for p in made.values():
        p.close()


# ---------------------------------------------------------------- tensor parallel


def _tp_layers(ctx):
    grid = build_grid(1, 2, 1)
    g, r, n = grid.tp_group, grid.tp_rank, grid.tp
    gen = torch.Generator().manual_seed(0)
    full = nn.Linear(16, 8)
    with torch.no_grad():
        full.weight.copy_(torch.randn(8, 16, generator=gen))
        full.bias.copy_(torch.randn(8, generator=gen))
    x0 = torch.randn(5, 3, 16, generator=gen)
    probe = torch.randn(5, 3, 8, generator=gen)
    out = {}

    # column-parallel: f, then this rank's output columns
    x_ref = x0.clone().requires_grad_()
    y_ref = full(x_ref)
    (y_ref * probe).sum().backward()
    col = tpl.ColumnParallelLinear(full, r, n)
    x = x0.clone().requires_grad_()
    y = col(tpl.Enter(g)(x))
    (y * probe.chunk(n, -1)[r]).sum().backward()
    out["col_fwd_equal"] = torch.equal(y, y_ref.detach().chunk(n, -1)[r])
    out["col"] = [(x.grad, x_ref.grad), (col.weight.grad, full.weight.grad.chunk(n, 0)[r]),
                  (col.bias.grad, full.bias.grad.chunk(n, 0)[r])]

    # row-parallel: this rank's input columns, g, bias once
    full.zero_grad()
    x_ref = x0.clone().requires_grad_()
    (full(x_ref) * probe).sum().backward()
    row_full = nn.Linear(16, 8)
    row_full.load_state_dict(full.state_dict())
    row = tpl.RowParallelLinear(row_full, r, n, g)
    xs = x0.chunk(n, -1)[r].clone().requires_grad_()
    y = row(xs)
    (y * probe).sum().backward()
    out["row"] = [(y, full(x0)), (xs.grad, x_ref.grad.chunk(n, -1)[r]),
                  (row.weight.grad, full.weight.grad.chunk(n, 1)[r]),
                  (row.bias.grad, full.bias.grad)]

    # vocabulary-parallel embedding
    emb = nn.Embedding(12, 6)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(12, 6, generator=gen))
    ids = torch.randint(0, 12, (4, 5), generator=gen)
    p6 = torch.randn(4, 5, 6, generator=gen)
    (emb(ids) * p6).sum().backward()
    vemb = tpl.VocabParallelEmbedding(emb, r, n, g)
    ye = vemb(ids)
    (ye * p6).sum().backward()
    out["emb_fwd_equal"] = torch.equal(ye, emb(ids).detach())
    out["emb"] = [(vemb.weight.grad, emb.weight.grad.chunk(n, 0)[r])]

    # vocabulary-parallel cross-entropy
    logits = torch.randn(7, 12, generator=gen) * 3
    target = torch.randint(0, 12, (7,), generator=gen)
    lf = logits.clone().requires_grad_()
    ref = F.cross_entropy(lf, target)
    ref.backward()
    ls = logits.chunk(n, -1)[r].clone().requires_grad_()
    loss = tpl.vocab_parallel_cross_entropy(ls, target, g, r * 12 // n)
    loss.backward()
    out["ce"] = [(loss, ref), (ls.grad, lf.grad.chunk(n, -1)[r])]
    return {k: v if isinstance(v, bool) else [(a.detach(), b.detach()) for a, b in v]
            for k, v in out.items()}


def test_tensor_parallel_layers_match_unsharded(pools):
    for res in pools(2).run_ok(_tp_layers):
        assert res["col_fwd_equal"], "column-parallel forward is not bitwise equal"
        assert res["emb_fwd_equal"], "vocab-parallel embedding forward is not bitwise equal"
        for name in ("col", "row", "emb", "ce"):
            for got, want in res[name]:
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)


# ---------------------------------------------------------------- pipeline parallel


def _pipeline_vs_reference(ctx, schedule: str, pp: int):
    grid = build_grid(1, 1, pp)
    m = pp + 3
    spec = _spec(micro_batches=m, batch_size=2 * m, schedule=schedule)
    tr = Trainer(spec, grid)
    xs, ys = tr.micro_batches("train", 0)
    tr.dp.zero_grad()
    run = run_stage(tr.model, tr.row, grid, tr.act_shape, xs if grid.first_stage else None,
                    ys if grid.last_stage else None,
                    lambda lg, y: F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)))
    tr.dp.finish()
    ref = build_gpt(TINY, spec.seed)
    ref_losses = []
    for x, y in zip(xs, ys):
        lg = ref(x)
        loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)) / m
        loss.backward()
        ref_losses.append(loss.detach())
    ref_grads = dict(ref.named_parameters())
    pairs = [(p.grad, ref_grads[k].grad) for k, p in tr.model.named_parameters()]
    missing = [k for k, p in tr.model.named_parameters() if p.grad is None or
               not p.grad.abs().sum() > 0]
    return run.losses, ref_losses if grid.last_stage else [], pairs, missing


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_schedules_match_single_process(pools, schedule):
    for losses, ref_losses, pairs, missing in pools(2).run_ok(_pipeline_vs_reference,
                                                              schedule, 2):
        assert not missing, f"parameters without gradient: {missing}"
        assert len(losses) == len(ref_losses)
        for a, b in zip(losses, ref_losses):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-7)
        for a, b in pairs:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-7)


# ---------------------------------------------------------------- ZeRO-1


def _train_params(ctx, dp, tp, pp, steps, **kw):
    tr = Trainer(_spec(steps=steps, **kw), build_grid(dp, tp, pp))
    losses = [tr.train_step().loss for _ in range(steps)]
    return losses, {k: v.detach().clone() for k, v in tr.model.state_dict().items()}


def test_zero1_matches_plain_data_parallel(pools):
    pool = pools(2)
    plain = pool.run_ok(_train_params, 2, 1, 1, 4, zero=0)
    zero = pool.run_ok(_train_params, 2, 1, 1, 4, zero=1)
    for (lp, sp), (lz, sz) in zip(plain, zero):
        torch.testing.assert_close(lz, lp, rtol=1e-6, atol=0)
        for k in sp:
            torch.testing.assert_close(sz[k], sp[k], rtol=1e-6, atol=1e-7, msg=k)
    # replicas agree bitwise
    for k in plain[0][1]:
        assert torch.equal(plain[0][1][k], plain[1][1][k])
        assert torch.equal(zero[0][1][k], zero[1][1][k])


# ---------------------------------------------------------------- grids agree


def _losses(ctx, dp, tp, pp, steps):
    tr = Trainer(_spec(steps=steps), build_grid(dp, tp, pp))
    return [tr.train_step().loss for _ in range(steps)]


def test_same_seed_same_losses_on_every_grid(pools):
    ref = pools(1).run_ok(_losses, 1, 1, 1, GRID_STEPS)[0]
    assert ref[-1] < ref[0] - 0.3, f"the reference run does not learn: {ref}"
    worst = {}
    for n, grid in ((2, (2, 1, 1)), (2, (1, 2, 1)), (2, (1, 1, 2)), (8, (2, 2, 2))):
        got = pools(n).run_ok(_losses, *grid, GRID_STEPS)
        assert all(g == got[0] for g in got), f"ranks of grid {grid} report different losses"
        rel = max(abs(a - b) / abs(b) for a, b in zip(got[0], ref))
        worst[grid] = rel
        assert rel <= GRID_RTOL, f"grid {grid}: relative loss difference {rel:.2e}"
    print("max relative loss difference vs (1,1,1) over 20 steps:", worst)


# ---------------------------------------------------------------- checkpoints


def _resume(ctx, dp, tp, pp, directory, zero):
    grid = build_grid(dp, tp, pp)
    straight = Trainer(_spec(zero=zero), grid)
    ref = [straight.train_step().loss for _ in range(6)]
    ref_val = straight.evaluate()
    first = Trainer(_spec(zero=zero), grid)
    for _ in range(3):
        first.train_step()
    checkpoint.save(directory, first)
    second = Trainer(_spec(zero=zero), grid)
    assert checkpoint.resume(directory, second) == 3
    cont = [second.train_step().loss for _ in range(3)]
    state = {k: v.detach().clone() for k, v in second.model.state_dict().items()}
    checkpoint.save(directory + "-end", second)
    return ref, cont, ref_val, state


def test_resume_is_bit_identical_and_merges_to_plain_model(pools, tmp_path):
    d = str(tmp_path / "ck")
    res = pools(8).run_ok(_resume, 2, 2, 2, d, 1)
    ref, cont, ref_val, _ = res[0]
    assert cont == ref[3:], f"resumed losses {cont} differ from {ref[3:]}"
    cfg, full = checkpoint.load_full_state_dict(d + "-end")
    model = build_gpt(cfg, 0)
    model.load_state_dict(full)
    from ringtree.apps.models import data

    total = 0.0
    with torch.no_grad():
        for k in range(4):
            x, y = data.global_batch("val", k, 8, cfg.block_size, 7)
            lg = model(x)
            total += float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)))
    assert abs(total / 4 - ref_val) < 1e-4, (total / 4, ref_val)


def test_resume_refuses_another_grid(pools, tmp_path):
    d = str(tmp_path / "ck2")
    pools(2).run_ok(_save_only, 2, 1, 1, d)
    res = pools(2).run(_resume_only, 1, 1, 2, d)
    assert all(isinstance(e, ValueError) and "same grid" in str(e) for e in res)


def _save_only(ctx, dp, tp, pp, d):
    tr = Trainer(_spec(), build_grid(dp, tp, pp))
    tr.train_step()
    checkpoint.save(d, tr)


def _resume_only(ctx, dp, tp, pp, d):
    checkpoint.resume(d, Trainer(_spec(), build_grid(dp, tp, pp)))
