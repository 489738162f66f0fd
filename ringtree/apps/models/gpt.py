"""A nanoGPT-style character-level GPT, written so that it can be sharded.

The model is GPT-2's block (pre-LayerNorm, causal self-attention, 4x GELU MLP) at toy
size; see Radford et al. 2019 and Karpathy's nanoGPT. It is the one model of the training
layer (:mod:`ringtree.apps.parallel`) and of the tensor-parallel decode engine, so its weights
are a plain ``state_dict`` with a documented layout:

================================  ==================  ===================================
key                               shape               notes
================================  ==================  ===================================
``wte.weight``                    (V, d)              token embedding
``wpe.weight``                    (T, d)              learned position embedding
``h.{i}.ln_1.{weight,bias}``      (d,)                LayerNorm before attention
``h.{i}.attn.{q,k,v}.weight``     (d, d)              separate q, k, v (``nn.Linear``:
                                                      out x in); head ``j`` is rows
                                                      ``j*hd:(j+1)*hd``, ``hd = d/H``
``h.{i}.attn.{q,k,v}.bias``       (d,)
``h.{i}.attn.o.{weight,bias}``    (d, d), (d,)        output projection (columns = heads)
``h.{i}.ln_2.{weight,bias}``      (d,)
``h.{i}.mlp.up.{weight,bias}``    (4d, d), (4d,)
``h.{i}.mlp.down.{weight,bias}``  (d, 4d), (d,)
``ln_f.{weight,bias}``            (d,)
``lm_head.weight``                (V, d)              untied from ``wte``, no bias
================================  ==================  ===================================

``i`` is the global layer index: a pipeline stage holds a subset of the layers under the
same keys (``layers=range(a, b)``, ``first``/``last`` say whether it owns the embeddings
or the head), so stage state dicts are disjoint pieces of the full one.

Tensor parallelism replaces modules rather than rewriting the model: q/k/v/up/lm_head
become column-parallel, o/down row-parallel, wte vocabulary-parallel, and the
``attn.enter``/``mlp.enter``/``head_enter`` identities become Megatron's ``f`` operator.
Attention reads the number of heads from its q projection's width, so a rank holding
``H/tp`` heads runs unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """Model hyper-parameters. ``vocab_size`` is the character vocabulary (96)."""

    vocab_size: int = 96
    block_size: int = 64      # context length T
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        return cls(**{k: int(d[k]) for k in cls.__dataclass_fields__})

    def validate(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be at least 1, got {getattr(self, k)}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.n_embd
        self.head_dim = cfg.head_dim
        self.enter = nn.Identity()       # TP: f (identity forward, all-reduce backward)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)         # TP: row-parallel, all-reduce forward (g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        x = self.enter(x)

        def heads(t: torch.Tensor) -> torch.Tensor:   # (B, T, h*hd) -> (B, h, T, hd)
            return t.view(B, T, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)),
                                           heads(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.enter = nn.Identity()
        self.up = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.down = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(self.enter(x)), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The whole model (defaults) or one pipeline stage of it.

    Args:
        cfg: hyper-parameters.
        layers: global indices of the blocks this module holds (default: all).
        first: holds ``wte``/``wpe`` and takes token ids (else hidden states).
        last: holds ``ln_f``/``lm_head`` and returns logits (else hidden states).
    """

    def __init__(self, cfg: GPTConfig, layers: Iterable[int] | None = None, *,
                 first: bool = True, last: bool = True):
        super().__init__()
        cfg.validate()
        self.cfg, self.first, self.last = cfg, first, last
        self.layer_ids = list(range(cfg.n_layer) if layers is None else layers)
        if first:
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleDict({str(i): Block(cfg) for i in self.layer_ids})
        if last:
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.head_enter = nn.Identity()
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) or hidden states (B, T, d) -> logits (B, T, V) or hidden."""
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)
        for block in self.h.values():
            x = block(x)
        if self.last:
            x = self.lm_head(self.head_enter(self.ln_f(x)))
        return x


def init_state_dict(cfg: GPTConfig, seed: int) -> dict[str, torch.Tensor]:
    """The full model's initial weights, a pure function of ``(cfg, seed)``.

    Every tensor is drawn from its own generator seeded with ``(seed, key)``, so a
    pipeline stage or a tensor-parallel shard can be built from the same numbers
    without materialising the rest, and the result does not depend on module order.
    GPT-2's init: N(0, 0.02) weights, zero biases, unit LayerNorm, residual projections
    (``o``, ``down``) scaled by 1/sqrt(2 n_layer).
    """
    sd = {}
    for key, t in GPT(cfg).state_dict().items():
        sd[key] = init_tensor(cfg, seed, key, tuple(t.shape))
    return sd


def init_tensor(cfg: GPTConfig, seed: int, key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One tensor of :func:`init_state_dict`."""
    if key.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        return torch.ones(shape)
    if key.endswith(".bias"):
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(_key_seed(seed, key))
    std = 0.02
    if key.endswith(("attn.o.weight", "mlp.down.weight")):
        std /= math.sqrt(2 * cfg.n_layer)
    return torch.randn(shape, generator=g) * std


def _key_seed(seed: int, key: str) -> int:
    h = 1469598103934665603                      # FNV-1a, stable across processes
    for b in f"{seed}:{key}".encode():
        h = ((h ^ b) * 1099511628211) % (1 << 64)
    return h % (1 << 63)


def build_gpt(cfg: GPTConfig, seed: int) -> GPT:
    """The full unsharded model with :func:`init_state_dict` weights."""
    model = GPT(cfg)
    model.load_state_dict(init_state_dict(cfg, seed))
    return model
