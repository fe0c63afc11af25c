"""The LLaMA-style decoder: RMSNorm, rotary positions, SwiGLU, grouped-query attention.

    x = wte[ids]                                       (no table of positions)
    x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))       (each of n_layer blocks)
    logits = ln_f(x) @ W_head                          (untied head by default)

    attn(x):  q = rope(x W_q),  k = rope(x W_k),  v = x W_v       q: H heads, k, v: Hkv heads
              y = softmax(q kᵀ/sqrt(d) + causal mask) v           query head h reads KV head
              out = concat_heads(y) W_o                               h // (H/Hkv)
    mlp(x):   (silu(x W_gate) ∘ (x W_up)) W_down,  silu(z) = z·sigmoid(z)

No biases; RMSNorm (``norms.py``) instead of LayerNorm; RoPE (``rope.py``) rotates q and
k by each token's position, so attention sees relative positions.  Grouped-query
attention (GQA) keeps Hkv < H key/value heads: the KV cache and the K/V projections
shrink by H/Hkv, the attention scores do not.  SwiGLU's hidden width is
``cfg.ffn_width`` (8/3·d rounded up to 64: three matrices of d×8/3·d cost what GPT-2's
two of d×4d do).  Initialisation as GPT-2's (N(0, 0.02), the residual outputs o_proj and
down_proj N(0, 0.02/sqrt(2·n_layer)), gains 1), drawn by name (``nn/init.py``).

Parameter names, and their Hugging Face ``LlamaForCausalLM`` names (minipar's Linear
weight is (in, out): HF's is its transpose; the rotate_half layout is HF's, so q and k
need no permutation):

    wte.weight                    model.embed_tokens.weight
    blocks.{i}.ln_1.weight        model.layers.{i}.input_layernorm.weight
    blocks.{i}.attn.q_proj.weight model.layers.{i}.self_attn.q_proj.weight   (transposed)
    blocks.{i}.attn.k_proj.weight model.layers.{i}.self_attn.k_proj.weight   (transposed)
    blocks.{i}.attn.v_proj.weight model.layers.{i}.self_attn.v_proj.weight   (transposed)
    blocks.{i}.attn.o_proj.weight model.layers.{i}.self_attn.o_proj.weight   (transposed)
    blocks.{i}.ln_2.weight        model.layers.{i}.post_attention_layernorm.weight
    blocks.{i}.mlp.gate_proj.weight  model.layers.{i}.mlp.gate_proj.weight   (transposed)
    blocks.{i}.mlp.up_proj.weight    model.layers.{i}.mlp.up_proj.weight     (transposed)
    blocks.{i}.mlp.down_proj.weight  model.layers.{i}.mlp.down_proj.weight   (transposed)
    ln_f.weight                   model.norm.weight
    lm_head.weight                lm_head.weight                              (transposed)

With ``moe_experts`` E > 0 the MLP of every ``moe_every``-th block is a mixture of
experts (``nn/moe.py``): ``blocks.{i}.mlp.router.weight`` (d x E) and, for each expert j,
``blocks.{i}.mlp.experts.{j}.gate_proj.weight`` (up_proj, down_proj alike), shared
experts as ``blocks.{i}.mlp.shared.{s}.…``; ``loss`` adds their balancing loss.

(HF's ``rms_norm_eps`` is 1e-5 here, ``rope_theta`` is ``cfg.rope_theta``.)  The model
keeps GPT's interface — ``embed``, ``blocks``, ``head``, ``loss`` — so pipeline stages,
recomputation, context and tensor parallelism take it as they take GPT-2.
"""
from __future__ import annotations

import math

from minipar.autograd import Tensor, ops
from minipar.autograd.function import is_grad_enabled
from minipar.nn.attention import AttentionCore
from minipar.nn.gpt import GPT
from minipar.nn.init import drawer, init_specs, initialise
from minipar.nn.layers import Dropout, Linear
from minipar.nn.module import Module
from minipar.nn.moe import MoE, add_balancing_losses
from minipar.nn.norms import RMSNorm
from minipar.nn.rope import RotaryEmbedding
from minipar.backend import xp


class SwiGLU(Module):
    """down(silu(gate(x)) ∘ up(x)): a gated MLP, three bias-free matrices (the gated
    product one op, ``ops.swiglu``)."""

    def __init__(self, d_model, width, rng, proj_std, dropout):
        self.gate_proj = Linear(d_model, width, rng, bias=False)
        self.up_proj = Linear(d_model, width, rng, bias=False)
        self.down_proj = Linear(width, d_model, rng, bias=False, std=proj_std)
        self.drop = dropout
        self.enter = None     # tensor parallelism: one f / all-gather for gate and up

    def forward(self, x):
        if self.enter is not None:
            x = self.enter(x)
        return self.drop(self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x))))


class GroupedQueryAttention(Module):
    """Causal self-attention with n_head query heads and n_kv_head key/value heads,
    rotary positions on q and k.  ``n_head``/``n_kv_head`` are the heads this module
    computes (a tensor-parallel rank holds its share)."""

    def __init__(self, d_model, n_head, n_kv_head, rope, rng, proj_std, dropout, attention):
        d_head = d_model // n_head
        self.n_head, self.n_kv_head, self.rope = n_head, n_kv_head, rope
        self.q_proj = Linear(d_model, n_head * d_head, rng, bias=False)
        self.k_proj = Linear(d_model, n_kv_head * d_head, rng, bias=False)
        self.v_proj = Linear(d_model, n_kv_head * d_head, rng, bias=False)
        self.o_proj = Linear(n_head * d_head, d_model, rng, bias=False, std=proj_std)
        self.drop = dropout
        self.core = AttentionCore(attention)
        self.enter = None     # tensor parallelism: one f / all-gather for q, k and v

    @staticmethod
    def heads(x, n_head):
        """(B, N, H·d) -> (B, H, N, d)."""
        b, n, hd = x.shape
        return x.reshape(b, n, n_head, hd // n_head).transpose(0, 2, 1, 3)

    def forward(self, x):
        if self.enter is not None:
            x = self.enter(x)
        q = self.rope(self.heads(self.q_proj(x), self.n_head))
        k = self.rope(self.heads(self.k_proj(x), self.n_kv_head))
        v = self.heads(self.v_proj(x), self.n_kv_head)
        y = self.core(q, k, v)
        b, h, n, d = y.shape
        return self.drop(self.o_proj(y.transpose(0, 2, 1, 3).reshape(b, n, h * d)))


class LlamaBlock(Module):
    """One block; its MLP is SwiGLU, or the mixture of experts (``nn/moe.py``) in the
    blocks ``cfg.is_moe_block(index)`` names."""

    def __init__(self, cfg, rope, rng, dropout_rng, index=0):
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        self.ln_1 = RMSNorm(cfg.d_model)
        self.attn = GroupedQueryAttention(cfg.d_model, cfg.n_head, cfg.kv_heads, rope, rng,
                                          proj_std, Dropout(cfg.dropout, dropout_rng),
                                          cfg.attention)
        self.ln_2 = RMSNorm(cfg.d_model)
        def swiglu():
            return SwiGLU(cfg.d_model, cfg.ffn_width, rng, proj_std,
                          Dropout(cfg.dropout, dropout_rng))
        self.mlp = MoE(cfg.d_model, swiglu, rng, cfg) if cfg.is_moe_block(index) else swiglu()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Llama(GPT):
    """GPT's interface with the llama block; ``wpe`` is None (positions live in ``rope``)."""

    aux_in_loss = True     # Llama.loss adds the MoE balancing losses (see there)

    def __init__(self, cfg, seed=0, materialize=True):
        cfg.validate()
        self.config, self.seed = cfg, seed
        rng = None                 # placeholders; drawn by name below (nn/init.py)
        self.dropout_rng = xp.random.default_rng(seed + 1)
        self.rope = RotaryEmbedding(cfg.d_model // cfg.n_head, cfg.rope_theta)
        self.wte, lm_head = self.vocabulary_layers(cfg, rng)   # Vp rows (nn/gpt.py)
        self.wpe = None
        self.drop = Dropout(cfg.dropout, self.dropout_rng)
        self.blocks = [LlamaBlock(cfg, self.rope, rng, self.dropout_rng, i)
                       for i in range(cfg.n_layer)]
        self.ln_f = RMSNorm(cfg.d_model)
        self.lm_head = lm_head     # after the blocks: parameters in the order they are used
        if materialize:
            initialise(self, drawer(seed, init_specs(self)))

    def embed(self, ids):
        ids = ops.raw(ids)
        n = ids.shape[-1]
        if n > self.config.seq_len:
            raise ValueError(f"sequence of {n} tokens is longer than seq_len {self.config.seq_len}")
        return self.drop(self.wte(ids))

    def loss(self, logits, targets):
        """Mean cross-entropy; with MoE blocks, while gradients are recorded (training),
        plus the value of each MoE layer's balancing loss of this forward, so the training
        loss (and the logged loss) is the total; the balancing loss's gradient enters at
        its layer (``nn/moe.py``, ``AttachAux``), from the gradient this loss receives.
        Evaluation (no gradients) gives the cross-entropy alone, and so does a model
        whose ``aux_in_loss`` a pipeline turned off: its MoE layers sit on several stages
        and it adds their balancing losses and seeds their gradients itself."""
        return add_balancing_losses(self, ops.cross_entropy(logits, targets))
