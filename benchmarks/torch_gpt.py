"""The PyTorch GPT the benchmarks measure minipar against (``step_time.py``, ``ddp_vs_torch.py``).

    from torch_gpt import build_torch_gpt
    torch.manual_seed(0)
    model = build_torch_gpt(layers=4, d_model=256, heads=4, seq=256, fused_attention=False)
    loss = model(ids, targets)          # ids, targets: (batch, seq) int64 -> scalar mean loss

minipar's ``nn.GPT`` written in PyTorch, layer for layer, in float32: token + position
embeddings, pre-LayerNorm blocks (fused qkv ``Linear(d, 3d)``, causal softmax attention,
output projection; tanh-GELU MLP ``d -> 4d -> d``), a final LayerNorm and an untied head
over the 256-byte vocabulary.  Attention either materialises the N×N scores as minipar's
naive attention does (matmul, mask, softmax, matmul) or, with ``fused_attention``, calls
PyTorch's fused ``scaled_dot_product_attention``.  The causal mask is a plain attribute,
not a buffer, so ``DistributedDataParallel`` has no buffer to broadcast.  Seed torch
before building it (the caller owns the random stream).
"""
from __future__ import annotations

import math

VOCAB = 256


def build_torch_gpt(layers, d_model, heads, seq, fused_attention=False, device="cpu"):
    """The GPT as a ``torch.nn.Module`` on ``device`` whose ``forward(ids, targets)`` returns the loss."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    d, h, n = d_model, heads, seq
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), 1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b = x.shape[0]
            q, k, v = self.qkv(self.ln_1(x)).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
            if fused_attention:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
                a = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
            return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(n, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=False)

        def forward(self, ids, targets):
            x = self.wte(ids) + self.wpe(torch.arange(n, device=ids.device))
            for block in self.blocks:
                x = block(x)
            return F.cross_entropy(self.head(self.ln_f(x)).view(-1, VOCAB), targets.view(-1))

    return GPT().to(device)
