"""minipar's llama against the same block written in PyTorch as Hugging Face's eager
``LlamaForCausalLM`` computes it (``benchmarks/torch_llama.py``: rotate_half RoPE,
repeat_kv GQA, torch's RMSNorm, SwiGLU): same weights, same loss to 1e-10 in float64.
Skipped where PyTorch is not installed (it is not a dependency)."""
import os
import sys

import numpy as np
import pytest

from minipar import backend
from minipar.nn import config_from_preset, make_model

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
from torch_llama import build_torch_llama  # noqa: E402


def torch_loss(cfg, state, ids, kv_heads, fused, theta):
    theirs = build_torch_llama(2, 32, 4, kv_heads, 16, cfg.ffn_width, fused, theta=theta,
                               dtype=torch.float64).double()
    names = {"wte.weight": "wte.weight", "ln_f.weight": "ln_f.weight", "lm_head.weight": "head.weight"}
    for i in range(2):
        for mine, hf in (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("attn.q_proj", "q"),
                         ("attn.k_proj", "k"), ("attn.v_proj", "v"), ("attn.o_proj", "o"),
                         ("mlp.gate_proj", "gate"), ("mlp.up_proj", "up"),
                         ("mlp.down_proj", "down")):
            names[f"blocks.{i}.{mine}.weight"] = f"blocks.{i}.{hf}.weight"
    with torch.no_grad():
        for mine, hf in names.items():
            w = torch.from_numpy(state[mine])
            # minipar's Linear weight is (in, out), torch's (out, in)
            theirs.get_parameter(hf).copy_(w.T if w.ndim == 2 and mine != "wte.weight" else w)
        t = torch.from_numpy(ids)
        return theirs(t, t).item()


@pytest.mark.parametrize("kv_heads,fused", [(2, False), (1, True), (4, False)])
def test_llama_matches_pytorch_hf_style(kv_heads, fused):
    old = backend.default_dtype()
    backend.set_default_dtype(np.float64)
    try:
        cfg = config_from_preset("llama-tiny", n_layer=2, d_model=32, n_head=4,
                                 n_kv_head=kv_heads, seq_len=16, rope_theta=500.0)
        model = make_model(cfg, seed=3)
        for p in model.parameters():      # sharp attention: positions matter to the loss
            p.data *= 8.0
        ids = np.random.default_rng(0).integers(0, 256, size=(2, 16))
        _, loss = model(ids, ids)
    finally:
        backend.set_default_dtype(old)
    state = model.state_dict()
    assert float(loss.data) == pytest.approx(torch_loss(cfg, state, ids, kv_heads, fused, 500.0),
                                             rel=1e-10)
    # the comparison sees the rotary angles: another base changes the loss
    assert float(loss.data) != pytest.approx(torch_loss(cfg, state, ids, kv_heads, fused, 400.0),
                                             rel=1e-6)
