"""A GPT-2 style decoder-only transformer.

    x = wte[ids] + wpe[positions]                  (embed)
    x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))   (each of n_layer blocks)
    logits = ln_f(x) @ W_head                      (head)

GPT-2 initialisation: weights ~ N(0, 0.02), the two residual projections of each
block ~ N(0, 0.02/sqrt(2·n_layer)) so the residual stream's variance does not grow
with depth, biases 0, LayerNorm 1/0.  Each weight is drawn from a generator keyed by
(seed, its name) (``nn/init.py``), so the values do not depend on the order the model
is built in; ``GPT(cfg, seed, materialize=False)`` builds placeholders only, which a
parallel layout cuts and then fills with just its own part.  With ``tie_weights`` the head reuses the
token embedding (W_head = wteᵀ).  ``embed``, ``blocks`` and ``head`` are separate
so a pipeline can place them on different stages.

``GPTConfig`` describes both blocks minipar trains: ``arch="gpt2"`` (this file) and
``arch="llama"`` (``nn/llama.py``: RMSNorm, rotary positions, SwiGLU, grouped-query
attention; its fields ``n_kv_head``, ``rope_theta``, ``d_ff``, and ``moe_*``: a mixture
of experts in place of SwiGLU, ``nn/moe.py``).  ``make_model(cfg)``
(``nn/architectures.py``) builds whichever ``cfg.arch`` names; the llama model keeps
this class's interface.

Vocabulary padding (``pad_vocab_to`` = m, Megatron's make-vocab-size-divisible-by): the
embedding and the head hold Vp = m·ceil(V/m) rows, so the head's GEMM has an output width
a multiple of 64 on a GPU (tensor-core tiles; GPT-2's 50257 -> 50304).  The padding rows
start at zero (the real rows are drawn exactly as unpadded, so losses match the unpadded
model), are stored in checkpoints (as Megatron does) and counted in the parameters; the
head returns only the V real logits, so the padding is in no softmax denominator, no loss
and no sample, and its rows never get a gradient: they stay zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict, replace
from typing import Optional

import numpy as np

from minipar.backend import xp, to_device
from minipar.autograd import ops
from minipar.nn.init import ZeroPadded, drawer, init_specs, initialise
from minipar.nn.module import Module
from minipar.nn.layers import Linear, Embedding, LayerNorm, Dropout, MLP
from minipar.nn.attention import CausalSelfAttention


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 64
    n_layer: int = 4
    d_model: int = 64
    n_head: int = 4
    dropout: float = 0.0
    tie_weights: bool = False
    attention: str = "naive"
    arch: str = "gpt2"             # gpt2 | llama (nn/llama.py)
    n_kv_head: Optional[int] = None   # llama: key/value heads (GQA); None: n_head
    rope_theta: float = 10000.0    # llama: RoPE's base
    d_ff: Optional[int] = None     # llama: SwiGLU's hidden width; None: 8/3·d to a multiple of 64
    pad_vocab_to: int = 1          # the embedding/head rows: V rounded up to a multiple of this
    moe_experts: int = 0           # llama: routed experts of the MoE MLP (nn/moe.py); 0: dense
    moe_top_k: int = 2             # experts per token
    moe_every: int = 1             # every N-th block (blocks N-1, 2N-1, ...) has the MoE MLP
    moe_shared_experts: int = 0    # experts every token goes through (DeepSeek's shared experts)
    moe_balance: str = "aux"       # aux (Switch/GShard loss) | bias (DeepSeek-V3's loss-free) | none
    moe_aux_coef: float = 0.01     # the aux loss's weight in the training loss
    moe_capacity_factor: float = 0.0   # per sequence ⌈C·k·T/E⌉ assignments per expert; 0: dropless
    moe_bias_rate: float = 1e-3    # bias balancing: each expert's selection bias moves ±rate per step

    @property
    def padded_vocab_size(self):
        """Vp = pad_vocab_to · ceil(V / pad_vocab_to): the rows the embedding and head hold."""
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    def to_dict(self):
        return asdict(self)

    @property
    def kv_heads(self):
        """Key/value heads: n_kv_head, or n_head (multi-head attention) when it is None."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ffn_width(self):
        """The MLP's hidden width: 4·d (gpt2); d_ff or 8/3·d rounded up to 64 (llama)."""
        if self.arch == "gpt2":
            return 4 * self.d_model
        if self.d_ff is not None:
            return self.d_ff
        return 64 * math.ceil(8 * self.d_model / 3 / 64)

    def validate(self):
        """This config, or ValueError naming the field a model cannot be built or trained
        with.  A size given as 0 is refused, never read as "the default" (None is)."""
        for field in ("vocab_size", "seq_len", "n_layer", "d_model", "n_head", "pad_vocab_to"):
            if getattr(self, field) < 1:
                raise ValueError(f"`{field}` must be >= 1, got {getattr(self, field)}")
        if self.d_model % self.n_head:
            raise ValueError(f"`d_model` {self.d_model} must be divisible by `n_head` {self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {self.dropout}")
        if self.attention not in ("naive", "flash"):
            raise ValueError(f"`attention` must be naive or flash, got {self.attention!r}")
        if self.arch not in ("gpt2", "llama"):
            raise ValueError(f"`arch` must be gpt2 or llama, got {self.arch!r}")
        self._validate_moe()
        if self.arch == "gpt2":
            for field in ("n_kv_head", "d_ff"):
                if getattr(self, field) is not None:
                    raise ValueError(f"`{field}` belongs to `arch` llama; gpt2 has "
                                     f"{'n_head key/value heads' if field == 'n_kv_head' else 'an MLP of 4·d_model'}")
            return self
        for field in ("n_kv_head", "d_ff"):
            if getattr(self, field) is not None and getattr(self, field) < 1:
                raise ValueError(f"`{field}` must be >= 1, got {getattr(self, field)}")
        if not 0 < self.rope_theta < math.inf:      # nan fails both comparisons
            raise ValueError(f"`rope_theta` must be a finite number > 0, got {self.rope_theta}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"`n_head` {self.n_head} must be a multiple of `n_kv_head` "
                             f"{self.kv_heads} (each key/value head serves a group of query heads)")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"RoPE rotates pairs of features: the head size d_model/n_head = "
                             f"{self.d_model // self.n_head} must be even")
        return self

    def is_moe_block(self, i):
        """Block i has the MoE MLP: every ``moe_every``-th block, counting from 1."""
        return self.moe_experts > 0 and (i + 1) % self.moe_every == 0

    def _validate_moe(self):
        """The MoE fields (``nn/moe.py``): only with llama and experts, each in its range."""
        moe_defaults = dict(moe_top_k=2, moe_every=1, moe_shared_experts=0, moe_balance="aux",
                            moe_aux_coef=0.01, moe_capacity_factor=0.0, moe_bias_rate=1e-3)
        if self.moe_experts < 0:
            raise ValueError(f"`moe_experts` must be >= 0 (0: dense), got {self.moe_experts}")
        if self.moe_experts == 0:
            changed = [f for f, v in moe_defaults.items() if getattr(self, f) != v]
            if changed:
                raise ValueError(f"`{changed[0]}` sets the mixture of experts; add `moe_experts` E")
            return
        if self.arch != "llama":
            raise ValueError("`moe_experts` belongs to `arch` llama (its MLP is SwiGLU); "
                             "gpt2 has no mixture of experts")
        if not 1 <= self.moe_top_k <= self.moe_experts:
            raise ValueError(f"`moe_top_k` must be in [1, moe_experts = {self.moe_experts}], "
                             f"got {self.moe_top_k}")
        if self.moe_every < 1 or self.moe_shared_experts < 0:
            raise ValueError(f"`moe_every` must be >= 1 and `moe_shared_experts` >= 0, got "
                             f"{self.moe_every} and {self.moe_shared_experts}")
        if self.moe_balance not in ("aux", "bias", "none"):
            raise ValueError(f"`moe_balance` must be aux, bias or none, got {self.moe_balance!r}")
        if self.moe_balance != "bias" and self.moe_bias_rate != moe_defaults["moe_bias_rate"]:
            raise ValueError("`moe_bias_rate` moves the selection bias of `moe_balance` bias; "
                             f"`moe_balance` {self.moe_balance} has none")
        if not (math.isfinite(self.moe_bias_rate) and self.moe_bias_rate > 0):
            raise ValueError(f"`moe_bias_rate` must be a finite number > 0, got {self.moe_bias_rate}")
        if self.moe_balance != "aux" and self.moe_aux_coef != moe_defaults["moe_aux_coef"]:
            raise ValueError("`moe_aux_coef` weighs the aux balancing loss; `moe_balance` "
                             f"{self.moe_balance} has none: drop one")
        if not (math.isfinite(self.moe_aux_coef) and self.moe_aux_coef >= 0):
            raise ValueError(f"`moe_aux_coef` must be a finite number >= 0, got {self.moe_aux_coef}")
        if not (math.isfinite(self.moe_capacity_factor) and self.moe_capacity_factor >= 0):
            raise ValueError(f"`moe_capacity_factor` must be a finite number >= 0 (0: dropless), "
                             f"got {self.moe_capacity_factor}")


PRESETS = {
    "tiny": GPTConfig(n_layer=4, d_model=64, n_head=4, seq_len=64),
    "small": GPTConfig(n_layer=4, d_model=128, n_head=4, seq_len=128),
    "medium": GPTConfig(n_layer=8, d_model=256, n_head=8, seq_len=256),
    "gpt2": GPTConfig(n_layer=12, d_model=768, n_head=12, seq_len=1024),
}
# the llama counterparts: same depth, width and context; half as many key/value heads
for _name in ("tiny", "small", "medium"):
    _base = PRESETS[_name]
    PRESETS[f"llama-{_name}"] = replace(_base, arch="llama", n_kv_head=_base.n_head // 2)


def config_from_preset(name, **overrides):
    """The preset with ``overrides`` (None: keep the preset's).  ``arch`` llama on a gpt2
    preset gives its llama form (``--model tiny --arch llama`` == ``--model llama-tiny``
    but with n_head key/value heads unless ``n_kv_head`` says otherwise)."""
    if name not in PRESETS:
        raise ValueError(f"unknown `model` {name!r}; presets: {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    arch = overrides.get("arch")
    if arch == "gpt2" and PRESETS[name].arch != "gpt2":
        raise ValueError(f"`model` {name} is a {PRESETS[name].arch} preset; drop `arch` gpt2 "
                         f"or choose a gpt2 preset")
    return replace(PRESETS[name], **overrides).validate()


class Block(Module):
    def __init__(self, cfg, rng, dropout_rng):
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        self.ln_1 = LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_head, rng, proj_std,
                                        Dropout(cfg.dropout, dropout_rng), cfg.attention)
        self.ln_2 = LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg.d_model, rng, proj_std, Dropout(cfg.dropout, dropout_rng))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    def __init__(self, cfg: GPTConfig, seed: int = 0, materialize: bool = True):
        cfg.validate()
        self.config = cfg
        self.seed = seed
        rng = None                 # placeholders; drawn by name below (nn/init.py)
        self.dropout_rng = xp.random.default_rng(seed + 1)
        self.wte, lm_head = self.vocabulary_layers(cfg, rng)
        self.wpe = Embedding(cfg.seq_len, cfg.d_model, rng, std=0.01)
        self.drop = Dropout(cfg.dropout, self.dropout_rng)
        self.blocks = [Block(cfg, rng, self.dropout_rng) for _ in range(cfg.n_layer)]
        self.ln_f = LayerNorm(cfg.d_model)
        self.lm_head = lm_head     # after the blocks: parameters in the order they are used
        if materialize:
            initialise(self, drawer(seed, init_specs(self)))

    @staticmethod
    def vocabulary_layers(cfg, rng):
        """(wte, lm_head or None when tied) with Vp rows: the real rows drawn as unpadded,
        the padding zero."""
        vocab, padded = cfg.vocab_size, cfg.padded_vocab_size
        wte = Embedding(padded, cfg.d_model, rng)
        lm_head = None if cfg.tie_weights else Linear(cfg.d_model, padded, rng, bias=False)
        if padded != vocab:
            wte.inits["weight"] = ZeroPadded(wte.inits["weight"], vocab, axis=0)
            if lm_head is not None:
                lm_head.inits["weight"] = ZeroPadded(lm_head.inits["weight"], vocab, axis=1)
        return wte, lm_head

    # The positions of the tokens this model sees: 0..n-1 (None), unless context
    # parallelism gave this rank other positions of the sequence (parallel/context).
    # A model with RoPE (``self.rope``, shared by its attention layers) hands them on.
    _token_positions = None

    @property
    def token_positions(self):
        return self._token_positions

    @token_positions.setter
    def token_positions(self, positions):
        self._token_positions = positions
        if getattr(self, "rope", None) is not None:
            self.rope.positions = positions

    def positions(self, n):
        if self.token_positions is None:
            return np.arange(n)
        if n != len(self.token_positions):
            raise ValueError(f"this rank holds {len(self.token_positions)} positions of the "
                             f"sequence, got {n} tokens")
        return self.token_positions

    def embed(self, ids):
        ids = ops.raw(ids)
        n = ids.shape[-1]
        if n > self.config.seq_len:
            raise ValueError(f"sequence of {n} tokens is longer than seq_len {self.config.seq_len}")
        positions = to_device(self.positions(n))
        return self.drop(self.wte(ids) + self.wpe(positions))

    def head(self, x):
        """Logits (B, N, V): the GEMM over all Vp rows, the padding's columns cut off."""
        x = self.ln_f(x)
        if self.lm_head is None:
            logits = ops.linear(x, ops.transpose(self.wte.weight))
        else:
            logits = self.lm_head(x)
        vocab = self.config.vocab_size
        return logits if logits.shape[-1] == vocab else ops.getitem(logits, (..., slice(0, vocab)))

    def loss(self, logits, targets):
        """Mean cross-entropy of the logits against the next tokens."""
        return ops.cross_entropy(logits, targets)

    def forward(self, ids, targets=None):
        """Logits (B, N, V); with targets also ``self.loss`` of them."""
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        if targets is None:
            return logits
        return logits, self.loss(logits, targets)

    def flops_per_token(self):
        """Training FLOPs per token: 6·N (matmuls on weights) + 12·L·d·s (attention).  N
        leaves out the lookups: the position embedding, and the token embedding unless the
        head's matmul uses it (tied); an untied head is counted, as the matmul it is.  Of a
        mixture of experts N counts the weights a token goes through: the router, the
        shared experts and k of the E routed experts (3·d·d_ff each) — its active
        parameters — whichever experts this model object holds (expert parallelism keeps
        E/ep of them)."""
        c = self.config
        routed_here = sum(p.size for name, p in self.named_parameters()
                          if ".mlp.experts." in name)
        n = self.num_parameters() - routed_here - (self.wpe.weight.size if self.wpe is not None else 0)
        if self.lm_head is not None:          # untied: the token embedding is only a lookup
            n -= self.wte.weight.size
        moe_blocks = sum(c.is_moe_block(i) for i in range(c.n_layer))
        n += moe_blocks * c.moe_top_k * 3 * c.d_model * c.ffn_width if c.moe_experts else 0
        return 6 * n + 12 * c.n_layer * c.d_model * c.seq_len
