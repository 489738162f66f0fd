"""The shared GPT and its corpus: layout, determinism, vocabulary, split."""

import pytest

torch = pytest.importorskip("torch")

from ringtree.apps.models import data, gpt  # noqa: E402


def test_init_is_a_function_of_seed_and_key():
    cfg = gpt.GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16)
    a, b = gpt.init_state_dict(cfg, 3), gpt.init_state_dict(cfg, 3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = gpt.init_state_dict(cfg, 4)
    assert not torch.equal(a["h.0.attn.q.weight"], c["h.0.attn.q.weight"])
    # a pipeline stage's keys are a subset of the full model's, same numbers
    stage = gpt.GPT(cfg, layers=[1], first=False, last=True)
    keys = set(stage.state_dict())
    assert keys < set(a) and "h.1.attn.q.weight" in keys and "wte.weight" not in keys
    stage.load_state_dict({k: a[k] for k in keys})


def test_layout_and_forward_shapes():
    cfg = gpt.GPTConfig(n_layer=2, n_embd=32, n_head=4, block_size=16)
    sd = gpt.init_state_dict(cfg, 0)
    assert sd["h.0.attn.q.weight"].shape == (32, 32)
    assert sd["h.1.mlp.up.weight"].shape == (128, 32)
    assert sd["lm_head.weight"].shape == (96, 32)
    m = gpt.build_gpt(cfg, 0)
    x, y = data.global_batch("train", 0, 3, 16, seed=0)
    assert m(x).shape == (3, 16, 96) and torch.equal(x[:, 1:], y[:, :-1])


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="n_head"):
        gpt.GPT(gpt.GPTConfig(n_embd=30, n_head=4))


def test_corpus_vocab_split_and_batches():
    assert data.VOCAB_SIZE == 96 and data.decode(data.encode("def f():\n\tx")) == "def f():\n?x"
    c = data.corpus()
    n_val = sum(1 for j, _ in enumerate(data.stdlib_files()) if j % 10 == 9)
    assert n_val >= 1 and 0.02 < len(c["val"]) / (len(c["train"]) + len(c["val"])) < 0.3
    x1, _ = data.global_batch("train", 5, 8, 32, seed=1)
    x2, _ = data.global_batch("train", 5, 8, 32, seed=1)
    x3, _ = data.global_batch("train", 6, 8, 32, seed=1)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert torch.equal(torch.cat([data.shard_rows(x1, i, 4) for i in range(4)]), x1)
    with pytest.raises(ValueError, match="equal parts"):
        data.shard_rows(x1, 0, 3)
