"""The performance model's mixture of experts: the experts' compute and expert
parallelism's all-to-alls (``nn/moe.py``, ``parallel/experts.py``).

Compute.  At a balanced load each token goes through k routed experts and the S shared
ones, each a SwiGLU of width f = d_ff: a MoE block's MLP does the matmuls of one dense
SwiGLU of width (k + S)·f on the same tokens (the router's h·E is small beside it).
Under expert parallelism the rows are exchanged, not multiplied: each rank's E/ep
experts take, in all, the k·T rows of its own tokens on average.  So a MoE block is
priced as the dense block with ``ffn`` = (k + S)·f.  What this leaves out: the
imbalance (the busiest expert sets the pace; the log's max/mean load says by how much)
and the cost of many small GEMMs (one per expert) against one large one.

Communication.  Per MoE layer and micro-batch, a rank holding T tokens (its b
sequences' positions: S/cp each, /tp under sequence parallelism) sends k·T rows of h
values in the dispatch and gets as many back in the combine, each one all-to-all over
the ep ranks (``stride`` tp apart in the world): two forward, two backward, on the
critical path (the experts wait for their rows), priced by the comm package's own model
(``context.all_to_all_seconds``).  Of the k·T·h·e bytes, the (ep-1)/ep bound for other
ranks leave the rank.
"""
from __future__ import annotations

import dataclasses

from minipar.perf.context import all_to_all_seconds


def moe_blocks(cfg):
    """How many of the model's blocks have the MoE MLP."""
    return sum(cfg.is_moe_block(i) for i in range(cfg.n_layer)) if cfg.moe_experts else 0


def moe_shape(x, cfg):
    """The LayerShape of a MoE block priced as a dense one: ``ffn`` (k + S)·d_ff."""
    return dataclasses.replace(x, ffn=(cfg.moe_top_k + cfg.moe_shared_experts) * cfg.ffn_width)


def dispatch_bytes(x, cfg):
    """Bytes of the rows one rank dispatches per MoE layer and micro-batch: k·T·h·e, T its
    tokens (``x``: the rank's shape, S/cp positions; /tp under sequence parallelism)."""
    tokens = x.b * x.s // (x.t if x.sp else 1)
    return cfg.moe_top_k * tokens * x.h * x.e


def all_to_all_seconds_per_layer(prof, x, cfg, config, ranks_per_node):
    """(forward, backward) seconds of one MoE layer's all-to-alls: dispatch and combine
    each way; 0 without expert parallelism."""
    if config.ep == 1:
        return 0.0, 0.0
    one = all_to_all_seconds(prof, config.ep, dispatch_bytes(x, cfg), config.tp, ranks_per_node)
    return 2 * one, 2 * one


def sent_bytes_per_layer(x, cfg, config):
    """Bytes one rank sends per MoE layer and micro-batch, forward and backward: four
    all-to-alls of which (ep-1)/ep leave the rank."""
    return 4 * dispatch_bytes(x, cfg) * (config.ep - 1) / config.ep
