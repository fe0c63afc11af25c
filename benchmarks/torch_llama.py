"""The PyTorch llama the step-time benchmark measures minipar's ``nn.Llama`` against.

    from torch_llama import build_torch_llama
    torch.manual_seed(0)
    model = build_torch_llama(layers=4, d_model=256, heads=4, kv_heads=2, seq=256)
    loss = model(ids, targets)          # ids, targets: (batch, seq) int64 -> scalar mean loss

minipar's llama block written in PyTorch, in float32, as Hugging Face's eager
``LlamaForCausalLM`` computes it: token embedding (no positions), pre-RMSNorm blocks
(``torch.nn.RMSNorm``), bias-free q/k/v/o projections with grouped key/value heads,
rotary positions in the rotate_half layout, causal softmax attention, SwiGLU MLP
(silu(gate)·up -> down, width ``ffn``), final RMSNorm, untied head over 256 bytes.
Attention either materialises the N×N scores with K/V repeated per group (HF's eager
``repeat_kv``) or, with ``fused_attention``, calls ``scaled_dot_product_attention``
with ``enable_gqa`` (no repeat).
"""
from __future__ import annotations

import math

VOCAB = 256


def build_torch_llama(layers, d_model, heads, kv_heads, seq, ffn, fused_attention=False,
                      device="cpu", theta=10000.0, dtype=None):
    """The llama as a ``torch.nn.Module`` whose ``forward(ids, targets)`` returns the loss.
    ``dtype``: of the rotary tables (default float32, the benchmark's; float64 to compare)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    d, h, hk, n, dh = d_model, heads, kv_heads, seq, d_model // heads
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), 1)
    inv_freq = theta ** (-torch.arange(0, dh, 2, dtype=torch.float64, device=device) / dh)
    angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = (a.to(dtype or torch.float32) for a in (angles.cos(), angles.sin()))

    def rope(x):
        a, b = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-b, a], dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
            self.q = nn.Linear(d, h * dh, bias=False)
            self.k = nn.Linear(d, hk * dh, bias=False)
            self.v = nn.Linear(d, hk * dh, bias=False)
            self.o = nn.Linear(h * dh, d, bias=False)
            self.gate = nn.Linear(d, ffn, bias=False)
            self.up = nn.Linear(d, ffn, bias=False)
            self.down = nn.Linear(ffn, d, bias=False)

        def forward(self, x):
            b = x.shape[0]
            y = self.ln_1(x)
            q = rope(self.q(y).view(b, n, h, dh).transpose(1, 2))
            k = rope(self.k(y).view(b, n, hk, dh).transpose(1, 2))
            v = self.v(y).view(b, n, hk, dh).transpose(1, 2)
            if fused_attention:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hk < h)
            else:
                k, v = k.repeat_interleave(h // hk, dim=1), v.repeat_interleave(h // hk, dim=1)
                s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
                a = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(b, n, d))
            y = self.ln_2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.head = nn.RMSNorm(d, eps=1e-5), nn.Linear(d, VOCAB, bias=False)

        def forward(self, ids, targets):
            x = self.wte(ids)
            for block in self.blocks:
                x = block(x)
            return F.cross_entropy(self.head(self.ln_f(x)).view(-1, VOCAB), targets.view(-1))

    return Llama().to(device)
