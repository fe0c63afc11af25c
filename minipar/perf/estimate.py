"""One layout's predicted step: time, tokens/s, MFU and memory per rank.

For a resolved TrainConfig on ``world`` ranks (dp·tp·pp), micro-batch b = B/(dp·M)
with M micro-batches (``microbatches`` under a pipeline, ``grad_accum`` otherwise):

    t_f, t_b, t_w   one micro-batch through this rank's layers (compute.py, times the
                    model's own pass over the sum of its ops: calibrate_model.py), tp
                    collectives added on the critical path (comm.py); the last stage
                    also runs the head and loss, the first the embeddings
    pipeline        makespan of the schedule from the simulator (pipeline.py);
                    without one, M·(t_f + t_b + t_w)
    + exposed data-parallel communication (comm.py)
    + optimizer     AdamW on this rank's master parameters (profile, per parameter)
    + step overhead the profile's fixed cost of a step (loss reduction, logging), and its
                    small all-reduces (the gradient norm, the loss)
    step            at least the shared-core bound where a host's ranks outnumber its
                    cores (host.py): Σ of their work / cores; where their waits spin
                    too, every compute second above counts R/C (R ranks, C cores)

    tokens/s = B·s / step         MFU = (6N + 12·L·h·s)·B·s / (step · world · peak)

Memory per rank = model state (memory.py, exact) + peak activations
(activations.py; the micro-batches in flight from the schedule) + communication
buffers.  ``fits`` compares it with the profile's (or the given) memory per rank; the
whole process's peak (runtime, corpus, construction, workspace on top) is
``train/fits.predicted_peak``, the one model of it that the memory check, the run's
summary and ``benchmarks/memory_scaling.py`` use.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from minipar.nn import make_model

from minipar.perf import activations as act
from minipar.perf import comm as pcomm
from minipar.perf import context as pctx
from minipar.perf import experts as pexp
from minipar.perf import host
from minipar.parallel.buckets import bucket_bytes
from minipar.perf.bucket_size import CANDIDATES_MB, fastest_bucket_mb
from minipar.perf import memory as pmem
from minipar.perf.compute import embed_time, head_time, layer_shape, layer_time
from minipar.perf.pipeline import held_for_weights, in_flight as stage_in_flight, pipeline_time
from minipar.perf.profile import DTYPE_BYTES, load_profile


def compute_dtype(precision):
    return precision if precision in DTYPE_BYTES else "fp32"


@lru_cache(maxsize=256)
def flops_per_token(cfg):
    """The model's own count (``GPT.flops_per_token``: 6N + 12·L·h·s, N the weights a
    token's matmuls use — the head's V·h once, tied or not, a mixture of experts' active
    ones), read from a model of placeholders built once per configuration."""
    return make_model(cfg, materialize=False).flops_per_token()


@dataclass
class Prediction:
    config: object
    step_s: float
    tokens_per_s: float
    mfu: float
    mem_bytes: float              # peak per rank (the largest rank)
    model_state_bytes: dict
    activation_bytes: float
    bubble: float
    exposed_comm_s: float
    breakdown: dict = field(default_factory=dict)

    @property
    def comm_share(self):
        return self.exposed_comm_s / self.step_s if self.step_s else 0.0


def micro_rows(config):
    m = config.microbatches if config.pipelined else config.grad_accum
    return config.batch_size // (config.dp * m), m


def choose_bucket_mb(config, prof=None, ranks_per_node=None):
    """(bucket_mb, {size: predicted step seconds}) for a resolved ``config`` whose
    ``bucket_mb`` is None (the user gave none) and whose synchroniser has buckets: each
    of ``bucket_size.CANDIDATES_MB`` priced by ``predict``, the run's size by
    ``bucket_size.fastest_bucket_mb``."""
    prof = load_profile(prof)
    steps = {mb: predict(dataclasses.replace(config, bucket_mb=mb), prof, ranks_per_node,
                         memory=False).step_s
             for mb in CANDIDATES_MB}
    return fastest_bucket_mb(steps), steps


def predict(config, prof, ranks_per_node=None, korthikanti=None, memory=True):
    """Prediction for a resolved ``config``.  ``korthikanti``: count activations with
    Korthikanti et al.'s formula (Megatron's kernels) instead of minipar's own
    (default: for spec-sheet profiles).  ``memory`` False: the time alone (the memory
    fields None), as pricing bucket sizes needs — the memory model is most of the cost."""
    if config.bucket_mb is None and config.zero < 3 and config.dp * config.cp > 1:   # as train does
        config = dataclasses.replace(config, bucket_mb=choose_bucket_mb(config, prof,
                                                                         ranks_per_node)[0])
    cfg = config.model_config()
    rpn = ranks_per_node or prof.ranks_per_node or 1
    dtype = compute_dtype(config.precision)
    b, M = micro_rows(config)
    tp, pp, v, dp = config.tp, config.pp, config.chunks, config.dp
    x = layer_shape(cfg, b, tp, config.sequence_parallel, dtype, config.attention)
    cp, whole = config.cp, x         # a cp rank holds S/cp tokens of each sequence (context.py)
    sync = dp * cp                   # the ranks that average gradients (grid.dp_cp_comm)
    if cp > 1:
        x = pctx.local_shape(whole, cp)
    # the model's own pass over the sum of its ops (calibrate_model.py), and ranks sharing
    # cores, all runnable all step: each gets C/R of one (host.py)
    scale = prof.efficiency.get("model_compute_scale", 1.0)
    slow = host.compute_slowdown(prof, rpn, config.world_size)
    lt = layer_time(prof, x, config.recompute) if cp == 1 else pctx.layer_time(prof, whole, config)
    moe_share = pexp.moe_blocks(cfg) / cfg.n_layer    # the blocks whose MLP is experts
    if moe_share:
        moe_x, moe_whole = pexp.moe_shape(x, cfg), pexp.moe_shape(whole, cfg)
        lt_moe = layer_time(prof, moe_x, config.recompute) if cp == 1 else \
            pctx.layer_time(prof, moe_whole, config)
        lt = type(lt)(*((1 - moe_share) * a + moe_share * m
                        for a, m in zip(dataclasses.astuple(lt), dataclasses.astuple(lt_moe))))
    lt = type(lt)(*(scale * slow * t for t in dataclasses.astuple(lt)))
    per_rank_layers = cfg.n_layer // pp
    e = DTYPE_BYTES[dtype]
    act_bytes = b * (cfg.seq_len // cp) * cfg.d_model * e
    gaps = (lt.forward / 2, lt.backward / 2)      # compute before each tp collective
    tp_f, tp_b = pcomm.tp_seconds_per_layer(prof, tp, act_bytes, rpn, config.sequence_parallel, gaps)
    if cfg.arch == "llama":
        tp_b += pcomm.kv_copies_seconds(prof, tp, cfg.kv_heads, cfg.d_model * x.kv_columns * e, rpn)
    cp_f = cp_b = 0.0                # the ring's hops, Ulysses' all-to-alls: on the critical path
    if cp > 1:
        cp_f, cp_b = pctx.comm_seconds_per_layer(prof, whole, config, rpn, scale * slow)
    ep_f, ep_b = (moe_share * t for t in                # expert parallelism's all-to-alls
                  pexp.all_to_all_seconds_per_layer(prof, x, cfg, config, rpn))
    cp_f, cp_b = cp_f + ep_f, cp_b + ep_b      # on the critical path as cp's (redone alike)
    redo_tp = tp_f if config.recompute == "full" else 0.0
    redo_cp = cp_f if config.recompute == "full" else 0.0
    (etf, etb), (htf, htb) = pcomm.tp_seconds_edges(prof, tp, act_bytes, b * cfg.seq_len // cp, rpn,
                                                   config.sequence_parallel, gaps)
    hf, hb, ef, eb = (scale * slow * t for t in (*head_time(prof, x), *embed_time(prof, x)))
    # one micro-batch's own work on the mean stage, collectives excluded (host.py)
    work = per_rank_layers * (lt.forward + lt.backward) + (hf + hb + ef + eb) / pp
    hf, hb, ef, eb = hf + htf, hb + htb, ef + etf, eb + etb
    # the slowest stage (the last: its layers and the head) sets a pipeline's pace
    t_f = per_rank_layers * (lt.forward + tp_f + cp_f) + hf + (ef if pp == 1 else 0.0)
    t_b = per_rank_layers * (lt.backward_input + lt.recompute + tp_b + redo_tp + cp_b + redo_cp) + hb \
        + (eb if pp == 1 else 0.0)
    t_w = per_rank_layers * lt.backward_weight
    t_comm = pcomm.pp_send_seconds(prof, pp, act_bytes / (tp if config.sequence_parallel else 1),
                                   dp * tp, rpn, gap_s=per_rank_layers * lt.forward)
    kind = config.schedule or "1f1b"
    span, bubble, in_flight = pipeline_time(kind, pp, M, v, t_f, t_b, t_w, t_comm)
    # data-parallel synchronisation over this rank's gradients
    gbytes = 2 if config.precision in ("fp16", "bf16") else DTYPE_BYTES[config.precision]
    buckets = [n * gbytes for n, _ in pmem.rank_buckets(
        cfg, bucket_bytes(config), config.precision, sync, tp=tp, pp=pp, chunks=v, pp_rank=pp - 1,
        ep=config.ep)]
    units = [n * gbytes for n, _ in pmem.rank_units(cfg, sync, tp=tp, ep=config.ep)] \
        if config.zero == 3 else []
    backward_all = M * (t_b + t_w) if pp == 1 else (t_b + t_w)
    exposed_dp = pcomm.dp_exposed_seconds(prof, config.zero, sync, buckets, units, backward_all,
                                          M * t_f, config.overlap, tp, rpn,
                                          accum=M if pp == 1 else 1)
    params_here = pmem.numel(cfg, tp=tp, pp=pp, chunks=v, pp_rank=pp - 1, ep=config.ep)
    master = "fp32" if config.precision in ("fp16", "bf16") else config.precision
    opt = slow * prof.optimizer_seconds(params_here / (sync if config.zero else 1), master)
    overhead = slow * prof.efficiency.get("step_overhead_s", 0.0)
    agree = small_all_reduces_seconds(prof, config, rpn)
    path = span + exposed_dp + opt + overhead + agree
    sent = host.sent_bytes(dataclasses.replace(config, dp=sync), per_rank_layers, act_bytes,
                           sum(units) if config.zero == 3 else sum(buckets))
    if cp > 1:
        sent += M * per_rank_layers * pctx.sent_bytes_per_layer(whole, config)
    if config.ep > 1:
        sent += M * per_rank_layers * moe_share * pexp.sent_bytes_per_layer(x, cfg, config)
    # the bound counts each rank's work at a core's rate: undo the sharing slowdown above
    shared = host.shared_core_bound(prof, rpn, config.world_size,
                                    (M * work + opt + overhead) / slow, sent)
    step = max(path, shared)
    tp_exposed = M * (per_rank_layers * (tp_f + tp_b + redo_tp) + etf + etb + htf + htb)
    cp_exposed = M * per_rank_layers * (cp_f + cp_b + redo_cp)     # with ep's all-to-alls
    ep_exposed = M * per_rank_layers * (ep_f + ep_b + (ep_f if config.recompute == "full" else 0))
    tokens = config.batch_size * cfg.seq_len
    peak = prof.peak(dtype) * config.world_size
    mfu = flops_per_token(cfg) * tokens / step / peak if peak else 0.0
    if korthikanti is None:
        korthikanti = prof.kind == "spec"
    mem = state = a_bytes = None
    if memory:
        mem, state, a_bytes, _ = memory_per_rank(config, korthikanti)
    return Prediction(config, step, tokens / step, mfu, mem, state, a_bytes, bubble,
                      exposed_dp + tp_exposed + cp_exposed,
                      dict(pipeline_s=span, dp_exposed_s=exposed_dp, tp_s=tp_exposed,
                           cp_s=cp_exposed - ep_exposed, ep_s=ep_exposed,
                           optimizer_s=opt, overhead_s=overhead, agree_s=agree,
                           critical_path_s=path,
                           shared_cores_s=shared, t_f=t_f, t_b=t_b, t_w=t_w,
                           t_comm=t_comm, in_flight=in_flight, micro_rows=b, microbatches=M))


def small_all_reduces_seconds(prof, config, rpn):
    """A step's small all-reduces (a few floats each, so latency: the curves' smallest
    size): the gradient norm and overflow flag agreed over every rank
    (``parallel/step.py``), and the loss summed over the pipeline and over data
    parallelism (``train/steps.global_loss``).  Across a node boundary each is a round
    trip on the slow link, ~1 ms on the simulated cluster."""
    dp, tp, pp, world = config.dp * config.cp, config.tp, config.pp, config.world_size
    groups = [(world, 1), (pp, dp * tp), (dp, tp)]
    return sum(pcomm.collective_seconds(prof, "all_reduce", p, 4096, pcomm.placement(p, stride, rpn))
               for p, stride in groups if p > 1)


def memory_per_rank(config, korthikanti=False):
    """(peak bytes, model state {params, grads, optimizer}, activation bytes, buffer bytes)
    of the rank that holds the most: the first pipeline stage holds the most
    activations, the last the head.  ``korthikanti``: activations by Korthikanti et
    al.'s formula (Megatron's kernels) instead of minipar's own autograd."""
    return max((rank_memory(config, (0, 0, stage), korthikanti) for stage in sorted({0, config.pp - 1})),
               key=lambda r: r[0])


def rank_memory(config, coords, korthikanti=False):
    """``memory_per_rank``'s four figures for the rank at (dp, tp, pp) ``coords``."""
    cfg = config.model_config()
    b, _ = micro_rows(config)
    pp, e, stage = config.pp, DTYPE_BYTES[compute_dtype(config.precision)], coords[2]
    state = pmem.model_state_bytes(cfg, config, coords)
    if korthikanti:
        layer = act.korthikanti_layer_bytes(cfg.seq_len // config.cp, b, cfg.d_model, cfg.n_head, config.tp,
                                            config.sequence_parallel, config.recompute)
        a_bytes = _in_flight(config, stage) * (cfg.n_layer // pp) * layer * e / 2
        if stage == pp - 1:
            a_bytes += 4 * b * cfg.seq_len // config.cp * -(-cfg.vocab_size // config.tp) * 2
    else:
        a_bytes = minipar_activation_bytes(config, stage)
    buffers = pmem.comm_buffer_bytes(cfg, config, coords)
    return pmem.total(state) + a_bytes + buffers, state, a_bytes, buffers


def _in_flight(config, stage):
    """Micro-batches' worth of activations pipeline stage ``stage`` holds at its peak."""
    if not config.pipelined:
        return 1.0
    return stage_in_flight(config.schedule or "1f1b", config.pp, micro_rows(config)[1],
                           config.chunks, stage)


def minipar_activation_bytes(config, stage):
    """Peak activation bytes of minipar's autograd on pipeline stage ``stage``
    (``activations.minipar_peak_activation_bytes`` for this layout)."""
    cfg, (b, M), pp = config.model_config(), micro_rows(config), config.pp
    pipeline = None
    if config.pipelined:
        kind = config.schedule or "1f1b"
        pipeline = (config.chunks, kind, held_for_weights(kind, pp, M, config.chunks, stage))
    ulysses = pctx.ulysses_degree(config)
    return act.minipar_peak_activation_bytes(
        b, cfg.seq_len // config.cp, cfg.d_model, cfg.n_head, cfg.vocab_size, cfg.n_layer // pp,
        config.tp, config.sequence_parallel, compute_dtype(config.precision),
        config.attention, config.recompute, first=stage == 0, last=stage == pp - 1,
        in_flight=_in_flight(config, stage), pipeline=pipeline,
        block=act.llama_block(cfg, config.tp, config.ep),
        context=(config.cp // ulysses, ulysses))


def tracked_peak_bytes(config, coords=(0, 0, 0), accumulate=None):
    """What minipar's live-array counter (``peak_mem_bytes``) should read on the rank at
    ``coords``: the tracked model state (weights; ZeRO-3's shards are untracked)
    + activations (+ the gradients: DDP's flat buffers hold them all step, and ZeRO-1
    holds them when several micro-batches run before the last forward)."""
    cfg = config.model_config()
    b, M = micro_rows(config)
    state = pmem.model_state_bytes(cfg, config, coords)
    live = 0 if config.zero == 3 else state["params"]
    if config.zero in (1, 2) and config.precision in ("fp16", "bf16"):
        live = state["params"]
    pp, stage = config.pp, coords[2]
    in_flight = _in_flight(config, stage)
    dtype = compute_dtype(config.precision)
    a_bytes = minipar_activation_bytes(config, stage)
    if accumulate is None:      # do gradients exist yet when the activations peak?
        accumulate = M > 1
        if config.pipelined:    # a stage peaks before its first backward if it holds them all
            accumulate = in_flight < M
    # DDP keeps its gradients in flat buffers (parallel/sync/flat.py): they live the
    # whole step, so they count at the peak, as accumulated ones do
    flat_grads = config.zero == 0
    grads = 0
    if (accumulate and config.zero < 2) or flat_grads:
        item = DTYPE_BYTES[dtype]
        grads = item * pmem.numel(cfg, tp=config.tp, tp_rank=coords[1], pp=pp,
                                  chunks=config.chunks, pp_rank=stage, ep=config.ep)
    return live + a_bytes + grads


def decay_mask_bytes(config, state):
    """The weight-decay mask a rank keeps beside AdamW's m and v: one value per element
    of the flat buckets or shards it updates (the size of m).  ``state``:
    ``memory.model_state_bytes``."""
    if config.precision not in ("fp16", "bf16") or config.zero == 0:
        return state["optimizer"] / 2                # m and v: the mask is one of them
    return state["optimizer"] / 3                    # m, v, fp32 masters
