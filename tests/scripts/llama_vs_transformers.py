"""minipar's llama against transformers' ``LlamaForCausalLM`` on the same weights, float64.

    python tests/scripts/llama_vs_transformers.py [--float64-islands]

Needs torch and transformers (neither is a dependency; run it with a Python that has
them and minipar's requirements on its path).  Builds minipar's llama (2 layers, d 64,
4 heads, n_kv_head 2, 1 and 4; weights ×6 so attention is sharp and positions matter),
copies every tensor under its HF name (``nn/llama.py``'s table; matrices transposed),
and prints the largest logit difference relative to the largest logit.

transformers computes three things in float32 whatever the model's dtype — LlamaRMSNorm,
the rotary angles and the eager softmax — so plain it agrees to ~1e-5; with
``--float64-islands`` those three run in float64 too and what is left is the model.
"""
import sys

import numpy as np
import torch
import transformers.models.llama.modeling_llama as ml
from transformers import LlamaConfig, LlamaForCausalLM

from minipar import backend
from minipar.nn import config_from_preset, make_model


def hf_name(name):
    """minipar name -> (transformers name, transpose?)."""
    fixed = {"wte.weight": ("model.embed_tokens.weight", False),
             "ln_f.weight": ("model.norm.weight", False), "lm_head.weight": ("lm_head.weight", True)}
    if name in fixed:
        return fixed[name]
    for old, new in (("blocks.", "model.layers."), (".ln_1.", ".input_layernorm."),
                     (".ln_2.", ".post_attention_layernorm."), (".attn.", ".self_attn.")):
        name = name.replace(old, new)
    return name, name.endswith("_proj.weight")


def float64_islands():
    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        d = 2 * self.inv_freq.shape[0]
        theta = self.config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = position_ids[:, :, None].double() * theta[None, None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def attention(module, q, k, v, mask, scaling, dropout=0.0, **kw):
        k, v = ml.repeat_kv(k, module.num_key_value_groups), ml.repeat_kv(v, module.num_key_value_groups)
        w = torch.matmul(q, k.transpose(2, 3)) * scaling
        if mask is not None:
            w = w + mask[:, :, :, : k.shape[-2]]
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    ml.LlamaRMSNorm.forward = rms_norm
    ml.LlamaRotaryEmbedding.forward = rotary
    ml.eager_attention_forward = attention


def compare(kv_heads):
    cfg = config_from_preset("llama-tiny", n_layer=2, d_model=64, n_head=4, n_kv_head=kv_heads,
                             seq_len=32, rope_theta=500.0)
    model = make_model(cfg, seed=1)
    for p in model.parameters():
        p.data *= 6.0
    ids = np.random.default_rng(0).integers(0, 256, size=(2, 32))
    mine = model(ids).numpy()
    hf = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=cfg.ffn_width,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                     max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=500.0,
                     tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                     attn_implementation="eager")
    theirs = LlamaForCausalLM(hf).double().eval()
    state = {}
    for name, value in model.state_dict().items():
        target, transpose = hf_name(name)
        state[target] = torch.from_numpy(value.T.copy() if transpose else value)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    with torch.no_grad():
        ref = theirs(torch.from_numpy(ids)).logits.numpy()
    return np.abs(mine - ref).max() / np.abs(ref).max()


def main():
    if "--float64-islands" in sys.argv:
        float64_islands()
    backend.set_default_dtype(np.float64)
    for kv in (2, 1, 4):
        print(f"n_head 4, n_kv_head {kv}: max |logits - transformers'| / max |logits| = "
              f"{compare(kv):.2e}")


if __name__ == "__main__":
    main()
