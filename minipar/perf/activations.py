"""Activation memory: Korthikanti et al. 2022's formulas, and minipar's own accounting.

Per transformer layer, s tokens, b sequences, hidden h, a heads, tp degree t, 16-bit
activations (Korthikanti et al., "Reducing Activation Recomputation", Table 2):

    no parallelism            s·b·h·(34 + 5·a·s/h)                 bytes
    tensor parallel           s·b·h·(10 + 24/t + 5·a·s/(h·t))
    tensor + sequence par.    s·b·h/t·(34 + 5·a·s/h)
    selective recompute       s·b·h·(10 + 24/t)      (with SP: 34·s·b·h/t)
    full recompute            2·s·b·h                (with SP: 2·s·b·h/t)

The 34 = 2 (LN in) ×2 + 6 (qkv in, Q, K) + 2 (V) ... the byte count of every tensor
a Megatron layer keeps; 5as/h the attention scores, softmax and its dropout mask.
A pipeline stage holds the activations of the micro-batches in flight: 1F1B keeps p
of them on the first stage, AFAB all m, interleaving with v chunks
p·(1 + (p-1)/(p·v)) micro-batch stages' worth (``pipeline.in_flight``).

``minipar_block_bytes`` is the same count for minipar's autograd, where every op's
output lives until backward: per block (e: activation bytes, w = max(e, 4): the bytes
of a statistic, which LayerNorm and the loss keep in float32 at least, ``backend.wide_dtype``)

    25·N·h·e + 2·b·a·s²·e   (t = 1, naive attention, N = b·s tokens)
    ln out, xhat (w), qkv 3, scores + P (2·a·s²/h), P·v, head merge, proj, add,
    ln out, xhat (w), fc 4, gelu out 4 + its tanh 4, proj, add

The llama block (``block=Llama(kv, f)``: kv columns of k and of v per rank, SwiGLU
width f) keeps, besides the same norms, adds and core: q and k rotated (h + kv), v (kv),
P·v and the head merge (2h), and the SwiGLU's gate, up and their gated product (3f, e
bytes) with its σ (f, w bytes; ``ops.swiglu`` is one op and keeps no SiLU output):

    N·e·(2·2 + 2 + 2 + h-terms…) = norms + 2·N·h·e (adds) + 2·N·h·e (o, down outputs)
                                   + N·(3h + 2kv + 3f)·e + N·f·w + core

flash keeps b·a·s log-sum-exp values instead of scores and P; selective recompute
keeps neither; full recompute keeps the block's input and recomputes one block at
a time.  Checked against ``backend.memory``'s peak in ``tests/test_perf_memory.py``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from minipar.perf.profile import DTYPE_BYTES


class Experts(NamedTuple):
    """A mixture of experts' MLP (``nn/moe.py``): E routed experts, k per token, S shared,
    in ``share`` of the blocks, over ``ep`` expert-parallel ranks."""
    n: int
    k: int
    shared: int
    share: float
    ep: int = 1


class Llama(NamedTuple):
    """The llama block's widths on one tp rank's terms: ``kv`` columns of k (and of v)
    on the rank (``LayerShape.kv_columns``), ``ffn`` the full SwiGLU width d_ff;
    ``experts`` where some blocks' MLP is a mixture of experts."""
    kv: int
    ffn: int
    experts: Optional[Experts] = None


def llama_block(cfg, t=1, ep=1):
    """``Llama`` for model ``cfg`` on t tp ranks (and ep expert-parallel ones), or None
    for a gpt2 block."""
    if cfg.arch != "llama":
        return None
    experts = None
    if cfg.moe_experts:
        share = sum(cfg.is_moe_block(i) for i in range(cfg.n_layer)) / cfg.n_layer
        experts = Experts(cfg.moe_experts, cfg.moe_top_k, cfg.moe_shared_experts, share, ep)
    return Llama(cfg.d_model // cfg.n_head * max(cfg.kv_heads // t, 1), cfg.ffn_width, experts)


def moe_mlp_bytes(tokens, h, f, t, experts, e, w):
    """Bytes a MoE MLP keeps for backward, for the ``tokens`` this rank routes (N, or N/t
    under sequence parallelism), at a balanced load (each rank's experts take, in all,
    k·N rows): the router's logits and probabilities (N·E), the k weights, each routed
    row's way through an expert (its gathered input, gate, up, their product and σ, the
    down projection: whole experts, not cut by tp), the combine (the rows put back,
    in (token, choice) order, weighted, summed), the rows exchanged under expert
    parallelism (received and returned), and the shared experts as dense SwiGLUs cut by
    tp.  The imbalance of a real step (the busiest rank's experts take more) is left out."""
    rows = experts.k * tokens
    router = tokens * experts.n * (e + w)
    weights = tokens * experts.k * (2 * w + e)
    routed = rows * (2 * h * e + 3 * f * e + f * w)
    combine = 3 * rows * h * e + tokens * h * w
    exchanged = 2 * rows * h * e if experts.ep > 1 else 0
    shared = experts.shared * tokens * t * (3 * f / t * e + f / t * w + h * e)
    return router + weights + routed + combine + exchanged + shared


def korthikanti_layer_bytes(s, b, h, a, t=1, sp=False, recompute="none"):
    """Bytes of one layer's activations (16-bit), Korthikanti et al. 2022, Table 2."""
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    if recompute == "selective":
        return 34 * sbh / t if sp else sbh * (10 + 24 / t)
    if sp:
        return sbh / t * (34 + 5 * a * s / h)
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def minipar_block_bytes(b, s, h, a, t=1, sp=False, dtype="fp32", attention="naive",
                        recompute="none", block: Optional[Llama] = None, context=(1, 1)):
    """Bytes one of minipar's blocks keeps for backward (see the module docstring);
    ``block``: None for gpt2's, ``Llama(kv, ffn)`` for the llama block; ``context``: (R, U)
    of context parallelism (``context_core_bytes``), ``s`` then this rank's positions."""
    e, w, N = DTYPE_BYTES[dtype], max(DTYPE_BYTES[dtype], 4), b * s
    seq = N / t if sp else N                      # tokens of the LN / residual parts
    norms = 2 * (seq * h * e + seq * h * w + seq * w)        # out, xhat, inv_sigma
    residual = 2 * seq * h * e                               # the two adds
    rows = 2 * N * h * e                                     # proj outputs, full rows
    if t > 1:
        rows += 2 * 2 * seq * h * e     # their reduced (scattered) copy, and + bias after it
    gathered = 2 * N * h * e if sp else 0                    # all-gathered LN outputs
    sliced = (3 + 1 + 1 + 4 + 8) * N * h / t * e             # qkv, P·v, merge, fc, gelu ×2
    if block is not None:    # llama: RMSNorm keeps no mean; q, k rotated, v; SwiGLU
        norms = 2 * (seq * h * e + seq * h * w + seq * w)
        if t > 1:            # no bias after the reduction: only the reduced copy
            rows = 2 * N * h * e + 2 * seq * h * e
        f = block.ffn / t
        sliced = (3 * h / t + 2 * block.kv + 3 * f) * N * e + f * N * w
        if block.experts is not None:       # those blocks' MLP: experts, not one SwiGLU
            dense_mlp = 3 * f * N * e + f * N * w + N * h * e
            sliced += block.experts.share * (
                moe_mlp_bytes(seq, h, block.ffn, t, block.experts, e, w) - dense_mlp)
    core = context_core_bytes(b, s, h, a, t, e, w, attention, *context)
    if recompute == "selective":
        core = 0.0
    if recompute == "full":
        return seq * h * e                                   # the block's input only
    return norms + residual + rows + gathered + sliced + core


def context_core_bytes(b, s, h, a, t, e, w, attention, ring=1, ulysses=1):
    """What a block's attention core keeps for backward on a rank holding ``s`` of the
    sequence's S = s·R·U positions (``parallel/context``): without context parallelism,
    naive attention's scores and probabilities (2·b·a/t·s² numbers) or flash's log-sum-exp;
    Ulysses (U > 1) adds q, k, v and the output in the heads layout (4·b·s·h/t numbers)
    and, alone (R = 1), attends whole: the S² scores of a/(t·U) heads; the ring (R > 1)
    keeps no score matrix — its backward rebuilds each pair's — only the log-sum-exp of
    its rows beside its output (the block's P·v, counted with the block)."""
    if ring == 1 and ulysses == 1:
        return {"naive": 2 * b * (a / t) * s * s * e, "flash": b * (a / t) * s * 4}[attention]
    swapped = 4 * b * s * h / t * e if ulysses > 1 else 0.0
    heads, whole = a / (t * ulysses), s * ring * ulysses
    if ring == 1:
        return swapped + {"naive": 2 * b * heads * whole * whole * e, "flash": b * heads * whole * 4}[attention]
    return swapped + b * (a / t) * s * 4


def ring_pair_bytes(b, s, a, t, w, ring=1, ulysses=1):
    """The peak a ring-attention chunk pair adds while it is computed (R > 1): its
    backward's scores, probabilities and their gradient, (b, a/(t·U), c, c) with
    c = S/(2R) = s·U/2 in the wide dtype; 0 without the ring."""
    if ring == 1:
        return 0.0
    c = s * ulysses / 2
    return 3 * b * a / (t * ulysses) * c * c * w


def minipar_embed_bytes(b, s, h, dtype="fp32", t=1, sp=False, positions=True):
    """Token rows, position rows and their sum; vocabulary-parallel (t > 1) adds the
    masked lookup (rows of other shards zeroed) and its all-reduced sum — reduce-scattered
    to this rank's s/t positions under sequence parallelism, where the sum is s/t too.
    ``positions`` False (llama, rotary positions): the token rows only."""
    e, N = DTYPE_BYTES[dtype], b * s
    if not positions:
        if t == 1:
            return N * h * e
        return (2 * N * h + (N * h / t if sp else N * h)) * e
    if t == 1:
        return (2 * N * h + s * h) * e
    if sp:
        return (2 * N * h + 2 * N * h / t + s * h / t) * e
    return (4 * N * h + s * h) * e


def minipar_head_bytes(b, s, h, vocab, t=1, dtype="fp32", sp=False):
    """ln_f (out, xhat, inv_sigma), logits, and the loss's exp(z - max) and its sums
    (vocabulary-parallel: the sums and the picked logits, stacked for one all-reduce).
    Under sequence parallelism ln_f runs on s/t positions and its output is gathered."""
    e, w, N = DTYPE_BYTES[dtype], max(DTYPE_BYTES[dtype], 4), b * s
    v = -(-vocab // t)
    norm = N * h * e + N * h * w + N * w
    if sp and t > 1:
        norm = norm / t + N * h * e
    return norm + N * v * e + N * v * w + N * w * (2 if t > 1 else 1)


def minipar_peak_activation_bytes(b, s, h, a, vocab, layers, t=1, sp=False, dtype="fp32",
                                  attention="naive", recompute="none", first=True,
                                  last=True, in_flight=1.0, pipeline=None, block=None, context=(1, 1)):
    """Peak bytes of activations on one rank: ``in_flight`` micro-batches' worth of
    ``layers`` blocks (+ embeddings on the first stage, head on the last); with full
    recompute the recomputed block's working set on top during backward.  ``pipeline``:
    None, or (chunks, schedule, micro-batches waiting for W) of a pipelined run
    (``pipeline_io_bytes`` and ``weight_input_bytes`` on top)."""
    kw = dict(t=t, sp=sp, dtype=dtype, attention=attention, block=block, context=context)
    per_mb = layers * minipar_block_bytes(b, s, h, a, recompute=recompute, **kw)
    if first:
        per_mb += minipar_embed_bytes(b, s, h, dtype, t, sp, positions=block is None)
    if last:
        per_mb += minipar_head_bytes(b, s, h, vocab, t, dtype, sp)
    peak = in_flight * per_mb + ring_pair_bytes(b, s, a, t, max(DTYPE_BYTES[dtype], 4), *context)
    if block is not None and recompute != "full":
        # llama: the peak comes in the last block's backward, when the SwiGLU's input
        # gradients (d gate, d up: 2·N·f/t) exist beside every activation still held
        peak += 2 * b * s * block.ffn / t * DTYPE_BYTES[dtype]
    if pipeline is not None:
        chunks, schedule, w_held = pipeline
        x = b * s * h * DTYPE_BYTES[dtype] / (t if sp else 1)
        peak += pipeline_io_bytes(x, first, chunks, in_flight, schedule != "afab")
        ffn = 4 * h if block is None else block.ffn
        peak += w_held * weight_input_bytes(b, s, h, layers, t, dtype, last, ffn)
    if recompute == "full":
        # the peak is in backward, recomputing a block: its working set and the upstream
        # gradient on top — by then the head's backward has freed what its loss and ln_f
        # saved, and only ln_f's output and the logits (the step still holds them) remain
        e, v = DTYPE_BYTES[dtype], -(-vocab // t)
        working = minipar_block_bytes(b, s, h, a, **kw) + b * s * h * e
        freed = 0.0
        if last:
            freed = minipar_head_bytes(b, s, h, vocab, t, dtype, sp) - b * s * (h + v) * e
        peak = max(peak, peak - freed + working)
    return peak


def pipeline_io_bytes(x, first, chunks, in_flight, interleaves):
    """What a pipeline stage holds besides its layers' activations, ``x`` bytes being one
    micro-batch's activation tensor: the received input of every micro-batch in flight
    (every chunk receives, except virtual stage 0's, which embeds), and, when forwards and
    backwards interleave (every schedule but AFAB), one sent buffer not yet found
    complete (``PipelineEngine._send`` frees finished sends when it posts the next)."""
    receiving = 1.0 - (1.0 / chunks if first else 0.0)
    return in_flight * receiving * x + (x if interleaves else 0.0)


def weight_input_bytes(b, s, h, layers, t=1, dtype="fp32", last=False, ffn=None):
    """What a micro-batch whose W (weight gradients) is deferred still holds: the inputs
    of the weight GEMMs, per block qkv's and fc's (LayerNorm outputs, gathered under
    SP: N·h each), proj's (N·h/t) and fc2's (the GELU output, ffn = 4h: 4·N·h/t; llama:
    q/k/v's and gate/up's norm outputs, o's, and down's gated product, N·d_ff/t);
    ln_f's output for the head on the last stage."""
    e, N = DTYPE_BYTES[dtype], b * s
    ffn = 4 * h if ffn is None else ffn
    return (layers * (2 * N * h + (N * h + N * ffn) / t) + (N * h if last else 0)) * e
