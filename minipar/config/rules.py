"""The rules across sections, and ``resolve``: a config checked for a world size, with
every default that depends on the layout filled in.

    resolve(config, world_size)
        config.check()                      each section alone (sections.py)
        check_across(config, world_size)    the rules that tie sections together
        -> dp = world / (cp·tp·pp), microbatches, the schedule, fp16's loss scale, ...

Both are pure: the config's values and the world size, no file and no message, so
every rank runs them on the same input and stops alike, before any message is sent.
A combination that is not supported is refused by name; a setting that would change
nothing under the layout is refused too, never silently ignored.  ``bucket_mb`` stays
None when none is given: the run chooses it (``perf/bucket_size.py``).
"""
from __future__ import annotations

from dataclasses import replace

from minipar.backend import backend_name
from minipar.config.error import ConfigError
from minipar.config.outer import check_outer_layout
from minipar.config.sections import (DEFAULT_SCHEDULE, EVAL_BATCHES, INITIAL_LOSS_SCALE,
                                     default_microbatches)


def data_parallel_size(config, world_size):
    """dp: the given one, or every rank left over by cp·tp·pp (0 when none is)."""
    return config.dp if config.dp is not None else world_size // (config.cp * config.tp * config.pp)


def micro_batches(config):
    """Micro-batches per step: the given ones in a pipeline, its default, or 1."""
    if not config.pipelined:
        return 1
    return config.microbatches if config.microbatches is not None else default_microbatches(config.pp)


def check_across(config, world_size):
    """Every rule that involves two sections, or the world size: the layout against the
    model's shape, the numerics and the batch; the outputs the layout needs."""
    c = config
    tp, pp, cp = c.tp, c.pp, c.cp
    dp, m = data_parallel_size(c, world_size), micro_batches(c)
    if dp < 1 or dp * cp * tp * pp != world_size:
        shown = c.dp if c.dp is not None else "?"
        if cp == 1:
            raise ConfigError(f"world size {world_size} != dp·tp·pp = {shown}·{tp}·{pp}; "
                              f"launch mpiexec -n {max(dp, 1) * tp * pp} or change the layout")
        raise ConfigError(f"world size {world_size} != dp·cp·tp·pp = {shown}·{cp}·{tp}·{pp}; "
                          f"launch mpiexec -n {max(dp, 1) * cp * tp * pp} or change the layout")
    try:                                    # the layout against the model's shape
        cfg = c.model_config()
        if tp > 1:
            from minipar.parallel.tensor import check_tensor_parallel
            check_tensor_parallel(cfg, tp, c.sequence_parallel)
        if cp > 1:
            from minipar.parallel.context import check_context_parallel
            check_context_parallel(cfg.seq_len, cp)
            if c.cp_kind == "ulysses":
                from minipar.parallel.context import check_ulysses
                check_ulysses(cfg.n_head, cfg.kv_heads, cp, c.cp_ulysses or cp, tp)
        if c.pipelined:
            from minipar.parallel.pipeline.stage import check_partition
            check_partition(cfg.n_layer, pp, c.chunks)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.moe_experts and tp > 1 and not c.sequence_parallel:
        raise ConfigError("`moe_experts` with `tp` needs `sequence_parallel`: each tp rank "
                          "routes its own positions of the sequence (as Megatron requires)")
    if c.ep > 1:
        _check_expert_parallel(c, cfg, dp * cp)
    if c.zero == 3 and cfg.tie_weights:
        raise ConfigError("`zero` 3 with `tie_weights` is not supported: ZeRO-3 gathers and frees "
                          "the model unit by unit, and the tied weight would belong to two units "
                          "(the embedding and the head); drop `tie_weights` or use `zero` 1 or 2")
    if c.recompute != "none" and (c.dropout or 0) > 0 and backend_name() == "cupy":
        raise ConfigError("`recompute` with dropout on CuPy is not supported: replaying the "
                          "dropout masks needs the generator's state, which CuPy does not expose")
    if c.grad_compression in ("int8", "topk", "powersgd") and c.precision == "fp16":
        raise ConfigError(f"`grad_compression` {c.grad_compression} with `precision` fp16 is not "
                          "supported: its error-feedback residuals are in loss-scaled units, which "
                          "a scale change or a skipped step would corrupt; use bf16 or fp32")
    if cp > 1 and c.sequence_parallel and (cfg.seq_len // cp) % tp:
        raise ConfigError(f"with `cp` {cp} and `sequence_parallel` each rank's "
                          f"{cfg.seq_len // cp} positions must divide by `tp` {tp}")
    if not c.pipelined and (c.microbatches not in (None, 1) or c.trace):
        raise ConfigError("`microbatches` and `trace` belong to pipeline parallelism; "
                          "set `pp` P (P >= 2) or leave them out")
    if c.pipelined and cfg.tie_weights:
        raise ConfigError("`tie_weights` with pipeline parallelism is not supported; drop it")
    if c.pipelined and c.batch_size % (dp * m):
        raise ConfigError(f"`batch_size` {c.batch_size} must be divisible by "
                          f"dp·microbatches = {dp}·{m}")
    check_outer_layout(c, dp, cfg.n_layer)
    if c.balance and dp == 1:
        raise ConfigError("`balance` shares the batch between data-parallel replicas; with dp 1 "
                          "there is nothing to balance")
    if c.batch_size % (dp * c.grad_accum):
        raise ConfigError(f"`batch_size` {c.batch_size} must be divisible by "
                          f"dp·grad-accum = {dp}·{c.grad_accum}")


def _check_expert_parallel(c, cfg, data_ranks):
    """ep > 1: experts to split, ep dividing them and the data-parallel ranks; the
    compositions not built yet refused by name."""
    if not cfg.moe_experts:
        raise ConfigError(f"`ep` {c.ep} splits the experts of a mixture of experts; set "
                          "`moe_experts` E (with `arch` llama) or leave `ep` out")
    if cfg.moe_experts % c.ep:
        raise ConfigError(f"`moe_experts` {cfg.moe_experts} must be divisible by `ep` {c.ep}: "
                          f"each expert-parallel rank holds E/ep experts")
    if data_ranks % c.ep:
        raise ConfigError(f"`ep` {c.ep} must divide the data-parallel ranks dp·cp = {data_ranks}, "
                          "from which the expert-parallel groups are carved")
    if c.grad_compression != "none":
        raise ConfigError("`ep` with `grad_compression` is not built yet; leave one out")


def check_resumed_step(config, step):
    """A resumed run must go forward: steps >= the checkpoint's step, and stop_at after it
    (checked once the run has read the checkpoint's step)."""
    if config.steps < step:
        raise ConfigError(f"`resume` {config.resume} is at step {step}, past `steps` {config.steps}; "
                          f"set `steps` to at least {step}")
    if config.stop_at is not None and config.stop_at <= step:
        raise ConfigError(f"`stop_at` {config.stop_at} is not after the resumed step {step}; "
                          f"choose a `stop_at` in ({step}, {config.steps}]")


def resolve(config, world_size):
    """``config`` checked for ``world_size`` ranks, with the layout's defaults filled in;
    or ConfigError."""
    config.check()
    check_across(config, world_size)
    scale = config.initial_loss_scale
    if scale is None and config.precision == "fp16":
        scale = INITIAL_LOSS_SCALE
    return replace(config, dp=data_parallel_size(config, world_size),
                   microbatches=micro_batches(config), initial_loss_scale=scale,
                   schedule=config.schedule or (DEFAULT_SCHEDULE if config.pipelined else None),
                   eval_batches=EVAL_BATCHES if config.eval_batches is None else config.eval_batches)
