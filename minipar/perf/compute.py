"""Compute time of one transformer layer, forward and backward: a roofline over its ops.

One micro-batch of b sequences of s tokens, hidden size h, a heads, tp degree t, on one
tensor-parallel rank.  The matmuls of a layer (m × k times k × n costs 2mnk FLOPs):

    qkv    bs × h   · h × 3h/t          attention scores  (b·a/t) × s × d · d × s
    proj   bs × h/t · h/t × h           probabilities·v   (b·a/t) × s × s · s × d
    fc     bs × h   · h × 4h/t          fc2               bs × 4h/t · 4h/t × h

    forward FLOPs = 24·b·s·h²/t + 4·b·s²·h/t         (Narayanan et al. 2021)
    backward      = 2 × forward (input gradient + weight gradient: W is half of it)

Each op costs max(FLOPs / rate, bytes / bandwidth) — the roofline — where ``rate``
is the profile's measured GEMM curve or peak × efficiency, plus the per-op overhead
(kernel launch on a GPU; the autograd op's Python on a CPU, which dominates small
models).  Elementwise work (LayerNorm, GELU, residual adds, softmax, dropout) is
memory bound: its bytes over the bandwidth.  Sequence parallelism divides the
LayerNorm/dropout/residual work by t.

Recomputation adds forward work to backward: ``full`` the whole layer forward,
``selective`` the attention core (scores, softmax, P·v) only.

The llama block (``arch="llama"``, ``nn/llama.py``) has q and o of h × h/t, k and v of
the n_kv_head heads only (h × kv·d each, kv·d/t per rank, or one copied head when
t > n_kv_head), and SwiGLU's gate, up (h × f/t) and down (f/t × h), f = d_ff:

    forward FLOPs = 2·b·s·h·(2h + 2·kv·d + 3f)/t + 4·b·s²·h/t
"""
from __future__ import annotations

from dataclasses import dataclass

from minipar.parallel.tensor.llama import kv_replicas
from minipar.perf.profile import DTYPE_BYTES, interp_loglog

# autograd ops per block in minipar's GPT (counted in nn/gpt.py, nn/attention.py): 2 LayerNorm,
# 4 Linear, 2 MatMul, 1 softmax, 1 GELU, 2 Add, 2 Reshape, 3 Transpose, 3 GetItem
OPS_PER_BLOCK = 20
OPS_TP_EXTRA = 4          # copy-to / reduce-from region, twice per block
OPS_SP_EXTRA = 4          # gather / scatter sequence, twice per block
OPS_HEAD = 5              # ln_f, head linear, cross-entropy, mean, scaling
OPS_EMBED = 3             # two lookups and the add
# the llama block (nn/llama.py): 2 RMSNorm, 7 Linear, 2 rotary, 3+3 head reshapes and
# transposes, the core (4, + 6 reshapes for grouped K/V), out transpose + reshape, SiLU,
# the gate product, 2 adds
OPS_PER_LLAMA_BLOCK, OPS_GQA_EXTRA = 27, 6


@dataclass(frozen=True)
class LayerShape:
    b: int              # sequences in the micro-batch (on this data-parallel replica)
    s: int
    h: int
    a: int
    vocab: int
    t: int = 1
    sp: bool = False
    dtype: str = "fp32"
    attention: str = "naive"
    arch: str = "gpt2"
    kv: int = 0             # llama: key/value heads (0: a)
    ffn: int = 0            # llama: SwiGLU width d_ff (0: 4h)

    @property
    def e(self):
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_columns(self):
        """Columns of k (and of v) on one tp rank: n_kv·r/t heads of d columns, r the ranks
        holding each head (``tensor/llama.kv_replicas``: a copied head when t > n_kv)."""
        kv = self.kv or self.a
        return self.h // self.a * kv * kv_replicas(kv, self.t) // self.t

    @property
    def ops_per_block(self):
        if self.arch == "llama":
            return OPS_PER_LLAMA_BLOCK + (OPS_GQA_EXTRA if (self.kv or self.a) < self.a else 0)
        return OPS_PER_BLOCK


def layer_shape(cfg, b, t=1, sp=False, dtype="fp32", attention="naive"):
    """The LayerShape of model ``cfg`` (a GPTConfig) for micro-batches of b sequences."""
    return LayerShape(b, cfg.seq_len, cfg.d_model, cfg.n_head, cfg.vocab_size, t, sp, dtype,
                      attention, cfg.arch, cfg.kv_heads, cfg.ffn_width)


def layer_gemms(x: LayerShape):
    """[(name, m, n, k, batch)] of one layer's forward on one tp rank."""
    bs, h, t, d = x.b * x.s, x.h, x.t, x.h // x.a
    heads = x.b * max(x.a // t, 1)
    core = [("scores", x.s, x.s, d, heads), ("pv", x.s, d, x.s, heads)]
    if x.arch == "llama":
        f = x.ffn // t
        return [("q", bs, h // t, h, 1), ("kv", bs, 2 * x.kv_columns, h, 1), *core,
                ("proj", bs, h, h // t, 1), ("gate_up", bs, 2 * f, h, 1), ("down", bs, h, f, 1)]
    return [("qkv", bs, 3 * h // t, h, 1), *core, ("proj", bs, h, h // t, 1),
            ("fc", bs, 4 * h // t, h, 1), ("fc2", bs, h, 4 * h // t, 1)]


def _gemm_s(prof, x, m, n, k, batch):
    flops = 2.0 * m * n * k * batch
    nbytes = x.e * batch * (m * k + k * n + m * n)
    return prof.gemm_seconds(flops, x.dtype, nbytes)


def attention_core_s(prof, x: LayerShape):
    """(forward, backward) seconds of scores → softmax → P·v: measured if the profile
    has the curve for this kind, else two GEMMs plus the softmax's bytes (naive
    reads and writes b·a/t·s² scores; flash keeps them on chip)."""
    heads = x.b * max(x.a // x.t, 1)
    size = heads * x.s * x.s * (x.h // x.a)
    curve = prof.attention_curve(x.attention, x.dtype)
    if curve:
        return (interp_loglog([[p[0], p[1]] for p in curve], size),
                interp_loglog([[p[0], p[2]] for p in curve], size))
    g = layer_gemms(x)
    mm = _gemm_s(prof, x, *g[1][1:]) + _gemm_s(prof, x, *g[2][1:])
    soft = 0.0 if x.attention == "flash" else prof.elementwise_seconds(
        3 * heads * x.s * x.s * x.e, x.dtype)     # write scores, read them, write P (+ dropout mask)
    return mm + soft, 2 * mm + 2 * soft


def elementwise_bytes(x: LayerShape):
    """Forward bytes of a layer's memory-bound ops: 2 LayerNorms (read, write), 2 residual
    adds (2 reads, 1 write), 2 bias-dropout (read, write, mask), GELU on 4h/t (read, write).
    llama: 2 RMSNorms (read, write), 2 adds, rotary on q and k (read x, cos, sin: 3
    reads, 1 write, twice for rotate_half), SiLU (read, write) and the gate product
    (2 reads, 1 write) on f/t."""
    tok = x.b * x.s * x.h * x.e
    if x.arch == "llama":
        rotated = x.b * x.s * (x.h // x.t + x.kv_columns) * x.e
        gated = x.b * x.s * x.ffn / x.t * x.e
        return (2 * 2 + 2 * 3) * tok / (x.t if x.sp else 1) + 6 * rotated + 5 * gated
    norm_part = (2 * 2 + 2 * 3 + 2 * 2.5) * tok / (x.t if x.sp else 1)
    return norm_part + 2 * 4 * tok / x.t


def separate_bias_s(prof, x: LayerShape):
    """(forward, backward) seconds of the qkv and fc biases where a measured profile says the
    GEMMs come without them: minipar's Linear adds its bias in a pass of its own over the
    7h/t outputs (read, write; in fp32, half precision included: ``ops_reduce._mm``) and
    sums dy over rows for its gradient; Megatron fuses both into the GEMM or the GELU."""
    if prof.kind != "measured":
        return 0.0, 0.0
    t = prof.elementwise_seconds(2 * 7 * x.b * x.s * x.h * 4 / x.t, "fp32")
    return t, 0.5 * t


@dataclass(frozen=True)
class LayerTime:
    forward: float
    backward_input: float    # B: gradient w.r.t. the layer's input
    backward_weight: float   # W: gradients of the weights
    recompute: float         # forward work redone in backward

    @property
    def backward(self):
        return self.backward_input + self.backward_weight + self.recompute


def layer_time(prof, x: LayerShape, recompute="none"):
    """Seconds of one layer on one tp rank (communication excluded, see comm.py)."""
    weights = [g for g in layer_gemms(x) if g[0] not in ("scores", "pv")]
    mm = sum(_gemm_s(prof, x, *g[1:]) for g in weights)
    core_f, core_b = attention_core_s(prof, x)
    nbytes = elementwise_bytes(x)
    bias_f, bias_b = separate_bias_s(prof, x) if x.arch == "gpt2" else (0.0, 0.0)
    elem = prof.elementwise_seconds(nbytes, x.dtype) + bias_f
    elem_b = prof.elementwise_seconds(nbytes, x.dtype, backward=True) + bias_b
    ops = x.ops_per_block + (OPS_TP_EXTRA if x.t > 1 else 0) + (OPS_SP_EXTRA if x.sp else 0)
    over = ops * prof.op_overhead_s
    fwd = mm + core_f + elem + over
    b_in = mm + core_b + elem_b + over      # dX of the weight GEMMs, the core, elementwise
    b_w = mm                                # dW of the weight GEMMs
    redo = {"none": 0.0, "full": fwd, "selective": core_f}[recompute]
    return LayerTime(fwd, b_in, b_w, redo)


def head_time(prof, x: LayerShape):
    """(forward, backward) of ln_f, the vocabulary projection (V/t columns) and the
    cross-entropy over b·s·V/t logits (a few passes over them)."""
    bs = x.b * x.s
    mm = _gemm_s(prof, x, bs, -(-x.vocab // x.t), x.h, 1)
    logits = bs * -(-x.vocab // x.t) * x.e
    nbytes = 4 * logits + 2 * bs * x.h * x.e
    elem = prof.elementwise_seconds(nbytes, x.dtype)
    # the loss's backward is lighter than a layer's: 0.75 of a backward, 1.5x the forward
    # where a backward counts twice the bytes
    elem_b = 0.75 * prof.elementwise_seconds(nbytes, x.dtype, backward=True)
    over = OPS_HEAD * prof.op_overhead_s
    return mm + elem + over, 2 * mm + elem_b + over


def embed_time(prof, x: LayerShape):
    """(forward, backward) of the token and position lookups and their sum (llama: the
    token lookup only)."""
    nbytes = (4 if x.arch == "gpt2" else 2) * x.b * x.s * x.h * x.e
    over = (OPS_EMBED if x.arch == "gpt2" else 1) * prof.op_overhead_s
    return (prof.elementwise_seconds(nbytes, x.dtype) + over,
            0.75 * prof.elementwise_seconds(nbytes, x.dtype, backward=True) + over)
