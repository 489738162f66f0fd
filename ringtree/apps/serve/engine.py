"""Tensor-parallel forward of the GPT over a paged KV cache.

Each rank of a tp group holds ``n_head / tp`` heads (Megatron-LM, Shoeybi et al. 2019):
q/k/v and ``mlp.up`` are column-parallel (the rank's rows of the weight), ``attn.o`` and
``mlp.down`` row-parallel (its columns), so a layer needs exactly two all-reduces, on the
outputs of ``o`` and ``down``; their biases are added once, after the sum. Embeddings,
LayerNorms and ``lm_head`` are replicated, so every rank computes the same logits and
the same greedy token without further communication.

Each rank caches keys and values for its own heads only: a ``(layers, blocks, B, heads,
head_dim)`` tensor pair; token ``p`` of a sequence lives in *slot* ``table[p // B] * B +
p % B``, with block ids from the shared :class:`~ringtree.apps.serve.scheduler.Plan`. A step
writes the new tokens' keys and values to their slots, then each query attends to its
sequence's positions ``0 .. p`` (PagedAttention, Kwon et al. 2023), gathering whole
blocks through the block table: decoding sequences in one padded batch with a length
mask, prefills one by one with a causal mask offset by the cached prefix.

The engine computes in float64 by default: BLAS results depend on batch shapes in the
last bits, and cached and uncached runs batch tokens differently; float64 keeps greedy
choices away from such ties (float32 is available for speed).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ringtree.apps.models.gpt import GPTConfig
from ringtree.apps.serve.scheduler import Plan
from ringtree.apps.serve.tpcomm import TPComm


def check_tp(cfg: GPTConfig, tp: int) -> None:
    if tp < 1 or cfg.n_head % tp:
        raise ValueError(f"--tp {tp} does not divide the model's {cfg.n_head} attention "
                         f"heads")


class TPEngine:
    """One rank's shard of the model and of the KV cache."""

    def __init__(self, cfg: GPTConfig, state_dict: dict[str, torch.Tensor], comm: TPComm,
                 num_blocks: int, block_size: int, dtype: torch.dtype = torch.float64):
        check_tp(cfg, comm.size)
        self.cfg, self.comm, self.dtype = cfg, comm, dtype
        self.block_size, self.num_blocks = block_size, num_blocks
        tp, r = comm.size, comm.rank
        self.heads = cfg.n_head // tp
        hd = cfg.head_dim
        a = slice(r * self.heads * hd, (r + 1) * self.heads * hd)     # this rank's heads
        ff = 4 * cfg.n_embd // tp
        m = slice(r * ff, (r + 1) * ff)

        def w(key: str) -> torch.Tensor:
            if key not in state_dict:
                raise KeyError(f"state dict has no {key!r}")
            return state_dict[key].detach().to(dtype).contiguous()

        self.wte, self.wpe = w("wte.weight"), w("wpe.weight")
        self.ln_f = (w("ln_f.weight"), w("ln_f.bias"))
        self.lm_head = w("lm_head.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"h.{i}."
            qkv = torch.cat([w(p + f"attn.{x}.weight")[a] for x in "qkv"]).contiguous()
            qkv_b = torch.cat([w(p + f"attn.{x}.bias")[a] for x in "qkv"]).contiguous()
            self.layers.append(dict(
                ln_1=(w(p + "ln_1.weight"), w(p + "ln_1.bias")),
                qkv=qkv.T.contiguous(), qkv_b=qkv_b,
                o=w(p + "attn.o.weight")[:, a].T.contiguous(), o_b=w(p + "attn.o.bias"),
                ln_2=(w(p + "ln_2.weight"), w(p + "ln_2.bias")),
                up=w(p + "mlp.up.weight")[m].T.contiguous(), up_b=w(p + "mlp.up.bias")[m],
                down=w(p + "mlp.down.weight")[:, m].T.contiguous(),
                down_b=w(p + "mlp.down.bias")))
        shape = (cfg.n_layer, num_blocks, block_size, self.heads, hd)
        self.k_cache = torch.zeros(shape, dtype=dtype)
        self.v_cache = torch.zeros(shape, dtype=dtype)
        self.all_reduces = 0

    def _slots(self, start: int, n: int, table: list[int]) -> list[int]:
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, start + n)]

    @torch.no_grad()
    def forward(self, plan: Plan) -> list[int]:
        """Run one step; returns the greedy next token of every planned sequence."""
        cfg, hl, hd, bs = self.cfg, self.heads, self.cfg.head_dim, self.block_size
        toks, pos, slots, starts = [], [], [], []
        for s in plan.seqs:
            n = len(s.tokens)
            starts.append(len(toks))
            toks += s.tokens
            pos += range(s.start, s.start + n)
            slots += self._slots(s.start, n, s.table)
        x = self.wte[torch.tensor(toks)] + self.wpe[torch.tensor(pos)]
        slot_t = torch.tensor(slots)
        decode = [i for i, s in enumerate(plan.seqs) if len(s.tokens) == 1]
        if decode:      # padded block tables and a mask of each sequence's context
            width = max(len(plan.seqs[i].table) for i in decode)
            tables = torch.tensor([plan.seqs[i].table + [0] * (width - len(plan.seqs[i].table))
                                   for i in decode])
            ctx = torch.tensor([plan.seqs[i].start + 1 for i in decode])
            dec_mask = (torch.arange(width * bs)[None, :] < ctx[:, None])[:, None, None, :]
            dec_rows = torch.tensor([starts[i] for i in decode])
        prefills = [(i, s) for i, s in enumerate(plan.seqs) if len(s.tokens) > 1]
        scale = 1.0 / math.sqrt(hd)
        d = cfg.n_embd
        out = self.comm.buffer(x.shape[0], d, self.dtype)   # every row-parallel output
        for li, L in enumerate(self.layers):
            h = F.layer_norm(x, (d,), *L["ln_1"])
            qkv = torch.addmm(L["qkv_b"], h, L["qkv"]).view(-1, 3, hl, hd)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            kc, vc = self.k_cache[li], self.v_cache[li]           # (blocks, B, hl, hd)
            kc.view(-1, hl, hd).index_copy_(0, slot_t, k)
            vc.view(-1, hl, hd).index_copy_(0, slot_t, v)
            att = torch.empty(x.shape[0], hl, hd, dtype=self.dtype)
            if decode:
                S = len(decode)
                qd = q[dec_rows].unsqueeze(2)                        # (S, hl, 1, hd)
                kd = kc[tables].view(S, -1, hl, hd).transpose(1, 2)  # (S, hl, C, hd)
                vd = vc[tables].view(S, -1, hl, hd).transpose(1, 2)
                yd = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=dec_mask,
                                                    scale=scale)
                att[dec_rows] = yd.squeeze(2)
            for i, s in prefills:
                n, c = len(s.tokens), s.start + len(s.tokens)
                table = torch.tensor(s.table)
                qp = q[starts[i]:starts[i] + n].transpose(0, 1)       # (hl, n, hd)
                kp = kc[table].view(-1, hl, hd)[:c].transpose(0, 1)   # (hl, c, hd)
                vp = vc[table].view(-1, hl, hd)[:c].transpose(0, 1)
                mask = torch.arange(c)[None, :] <= torch.arange(s.start, c)[:, None]
                yp = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)
                att[starts[i]:starts[i] + n] = yp.transpose(0, 1)
            y = torch.mm(att.reshape(-1, hl * hd), L["o"], out=out)
            self.comm.all_reduce(y)
            x = x + (y + L["o_b"])
            h = F.layer_norm(x, (d,), *L["ln_2"])
            u = F.gelu(torch.addmm(L["up_b"], h, L["up"]), approximate="tanh")
            y = torch.mm(u, L["down"], out=out)
            self.comm.all_reduce(y)
            x = x + (y + L["down_b"])
            self.all_reduces += 2
        last = torch.tensor([starts[i] + len(s.tokens) - 1 for i, s in enumerate(plan.seqs)])
        h = F.layer_norm(x[last], (d,), *self.ln_f)
        return (h @ self.lm_head.T).argmax(dim=-1).tolist()
