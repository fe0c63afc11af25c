"""Refuse tensor-parallel layouts that cannot work, before any message is sent.

Every rank runs the same checks on the same configuration, so all stop with the same
message.  What must divide by t:

- n_head: each rank computes whole heads (n_head/t of them);
- llama: n_kv_head divisible by t, or t by n_kv_head (each KV head then copied on
  t/n_kv_head ranks, ``tensor/llama.py``); the SwiGLU width d_ff divisible by t;
- d_model and the MLP width 4·d_model: the column/row slices (implied by the heads,
  checked anyway for a clear message);
- with sequence parallelism, the sequence length: each rank holds s/t tokens.

The vocabulary need *not* divide by t: it is split with the array_split rule
(parts differ by one row), which keeps the model identical to the single-process one —
no padded rows, no masked logits.  It must only have at least one row per rank.
"""
from __future__ import annotations


def _divisors(n, limit=64):
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def check_tensor_parallel(cfg, tp, sequence_parallel=False):
    """Raise ValueError, saying what to change, unless ``cfg`` (a GPTConfig) can be split
    over ``tp`` ranks."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"`tp` must be a positive integer, got {tp!r}")
    if cfg.n_head % tp:
        raise ValueError(f"`n_head` {cfg.n_head} is not divisible by `tp` {tp}: every "
                         f"tensor-parallel rank computes n_head/tp whole heads; use `tp` in "
                         f"{_divisors(cfg.n_head)} or an `n_head` divisible by {tp}")
    mlp = (("the MLP width 4·d_model", "d_model") if cfg.arch == "gpt2"
           else ("the SwiGLU width `d_ff`", "d_ff"))
    for (what, knob), width in ((("`d_model`", "d_model"), cfg.d_model), (mlp, cfg.ffn_width)):
        if width % tp:
            raise ValueError(f"{what} = {width} is not divisible by `tp` {tp}; choose a "
                             f"`{knob}` divisible by {tp}")
    kv = cfg.kv_heads
    if kv % tp and tp % kv:
        raise ValueError(f"`n_kv_head` {kv} and `tp` {tp}: one must divide the other (each rank "
                         f"holds n_kv_head/tp key/value heads, or each head is copied on "
                         f"tp/n_kv_head ranks); use `tp` in {_divisors(kv)} or a multiple of {kv}")
    if cfg.vocab_size < tp:
        raise ValueError(f"vocabulary of {cfg.vocab_size} ids cannot be split over `tp` {tp} "
                         f"ranks (at least one id each); use `tp` <= {cfg.vocab_size}")
    if sequence_parallel:
        check_sequence_length(cfg.seq_len, tp)


def check_sequence_length(n, tp):
    """Sequence parallelism shards the tokens: n must be divisible by tp."""
    if n % tp:
        raise ValueError(f"with `sequence_parallel` the sequence length {n} must be divisible by "
                         f"`tp` {tp} (each rank holds seq_len/tp tokens); change `seq_len` to a "
                         f"multiple of {tp} or drop `sequence_parallel`")
