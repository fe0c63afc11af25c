"""minipar's parameters under Hugging Face ``transformers`` names, layouts and config.

GPT-2 (``GPT2LMHeadModel``).  minipar's ``Linear`` keeps its weight as (in, out) and
computes x @ W, which is exactly the layout of GPT-2's ``Conv1D``; the qkv columns are
[q | k | v], head-major, as ``c_attn`` splits them.  So every GPT-2 tensor maps one to one,
with no transpose:

    wte, wpe                      transformer.wte, transformer.wpe
    blocks.i.ln_1 / ln_2          transformer.h.i.ln_1 / ln_2
    blocks.i.attn.qkv / proj      transformer.h.i.attn.c_attn / c_proj
    blocks.i.mlp.fc / proj        transformer.h.i.mlp.c_fc / c_proj
    ln_f                          transformer.ln_f
    lm_head.weight (d, V)         lm_head.weight (V, d): transposed (an ``nn.Linear``)

The GELU is GPT-2's tanh form (``gelu_new``), LayerNorm's ε is 1e-5.  A tied head
(``tie_weights``) writes no ``lm_head``: ``transformers`` ties it to ``wte`` itself.

Llama (``LlamaForCausalLM``).  The names map one to one (``nn/llama.py`` lists them);
every matrix is transposed, since HF's ``nn.Linear`` keeps (out, in).  minipar's RoPE
uses HF's rotate_half layout, so q_proj and k_proj need no permutation of their rows.

Mixtral (``MixtralForCausalLM``): a llama whose every MLP is a mixture of experts
(``nn/moe.py``), in the Hub's key layout (which transformers 4.x reads as it is and 5.x
converts to its fused experts on load):

    blocks.i.mlp.router                  model.layers.i.block_sparse_moe.gate       (transposed)
    blocks.i.mlp.experts.j.gate_proj     model.layers.i.block_sparse_moe.experts.j.w1  (transposed)
    blocks.i.mlp.experts.j.up_proj       model.layers.i.block_sparse_moe.experts.j.w3  (transposed)
    blocks.i.mlp.experts.j.down_proj     model.layers.i.block_sparse_moe.experts.j.w2  (transposed)

Mixtral's router is minipar's: softmax over the E experts (in float32), top-k, the k
weights divided by their sum.  It has no shared experts, no dense block between MoE ones,
no router bias and no capacity (every assignment is computed), so a model with
``moe_shared_experts``, ``moe_every`` > 1, ``moe_balance`` bias or a capacity factor has
no Mixtral equivalent and is refused.
"""
from __future__ import annotations

GPT2_RENAMES = (("blocks.", "transformer.h."), (".attn.qkv.", ".attn.c_attn."),
                (".attn.proj.", ".attn.c_proj."), (".mlp.fc.", ".mlp.c_fc."),
                (".mlp.proj.", ".mlp.c_proj."))


def gpt2_name(name):
    """minipar name -> (HF name, transpose?)."""
    if name == "lm_head.weight":
        return "lm_head.weight", True
    if name.startswith(("wte.", "wpe.", "ln_f.")):
        return "transformer." + name, False
    for old, new in GPT2_RENAMES:
        name = name.replace(old, new)
    return name, False


def gpt2_config(model, dtype="float32"):
    """config.json of a ``GPT2LMHeadModel`` with minipar's model config (``GPTConfig.to_dict``)."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": model["vocab_size"], "n_positions": model["seq_len"],
        "n_embd": model["d_model"], "n_layer": model["n_layer"], "n_head": model["n_head"],
        "n_inner": 4 * model["d_model"], "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": bool(model.get("tie_weights", False)),
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "use_cache": True, "torch_dtype": dtype,
    }


LLAMA_RENAMES = (("blocks.", "model.layers."), (".ln_1.", ".input_layernorm."),
                 (".ln_2.", ".post_attention_layernorm."), (".attn.", ".self_attn."))


def llama_name(name):
    """minipar name -> (HF name, transpose?)."""
    if name == "wte.weight":
        return "model.embed_tokens.weight", False
    if name == "ln_f.weight":
        return "model.norm.weight", False
    if name == "lm_head.weight":
        return "lm_head.weight", True
    for old, new in LLAMA_RENAMES:
        name = name.replace(old, new)
    return name, name.endswith("_proj.weight")


def llama_config(model, dtype="float32"):
    """config.json of a ``LlamaForCausalLM`` with minipar's model config."""
    from minipar.nn.gpt import GPTConfig
    cfg = GPTConfig(**model)
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_width, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.d_model // cfg.n_head, "max_position_embeddings": cfg.seq_len,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": float(cfg.rope_theta),
        "rope_parameters": rope, "rope_scaling": None, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": bool(cfg.tie_weights),
        "use_cache": True, "torch_dtype": dtype,
    }


MIXTRAL_RENAMES = ((".mlp.router.", ".block_sparse_moe.gate."),
                   (".gate_proj.", ".w1."), (".up_proj.", ".w3."), (".down_proj.", ".w2."),
                   (".mlp.experts.", ".block_sparse_moe.experts."))


def mixtral_name(name):
    """minipar name -> (HF name, transpose?): llama's, with the MoE MLP renamed."""
    hf_name, transpose = llama_name(name)
    if ".mlp." not in hf_name:
        return hf_name, transpose
    for old, new in MIXTRAL_RENAMES:
        hf_name = hf_name.replace(old, new)
    return hf_name, True


def mixtral_config(model, dtype="float32"):
    """config.json of a ``MixtralForCausalLM``: llama's fields and the experts'."""
    from minipar.nn.gpt import GPTConfig
    cfg = GPTConfig(**model)
    config = llama_config(model, dtype)
    for dense_only in ("mlp_bias", "attention_bias"):
        del config[dense_only]
    config.update({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "num_local_experts": cfg.moe_experts, "num_experts_per_tok": cfg.moe_top_k,
        "router_aux_loss_coef": cfg.moe_aux_coef if cfg.moe_balance == "aux" else 0.0,
        "output_router_logits": False, "router_jitter_noise": 0.0, "sliding_window": None,
    })
    return config


ARCHITECTURES = {"gpt2": (gpt2_name, gpt2_config), "llama": (llama_name, llama_config),
                 "mixtral": (mixtral_name, mixtral_config)}


def mixtral_refusal(model):
    """Why this MoE model has no Mixtral equivalent (one line), or None."""
    if model.get("moe_shared_experts", 0) > 0:
        return f"--moe-shared-experts {model['moe_shared_experts']} (Mixtral has no shared experts)"
    if model.get("moe_every", 1) > 1:
        return (f"--moe-every {model['moe_every']} (every Mixtral block is MoE, none dense)")
    if model.get("moe_balance", "aux") == "bias":
        return "--moe-balance bias (Mixtral's router has no selection bias)"
    if model.get("moe_capacity_factor", 0.0) > 0:
        return (f"--moe-capacity-factor {model['moe_capacity_factor']} (Mixtral drops no "
                "assignment: it has no capacity)")
    return None


def mapping(model):
    """(name -> (HF name, transpose?), model config -> config.json) for this model's arch;
    a llama with experts is Mixtral."""
    arch = model.get("arch", "gpt2")
    if model.get("moe_experts"):
        refusal = mixtral_refusal(model)
        if refusal is not None:
            raise ValueError(f"cannot export as Mixtral: {refusal}")
        arch = "mixtral"
    if arch not in ARCHITECTURES:
        raise ValueError(f"no Hugging Face mapping for arch {arch!r} (have: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]
