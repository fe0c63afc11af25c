"""The checks of ``TrainConfig.resolve``: every way a layout can fail, before any message.

Every rank runs them on the same config and world size, so a bad configuration stops
all ranks with the same message and none is left waiting for a peer.  Combinations that
are not supported are refused by name; a setting that would change nothing under the
layout is refused too, never silently ignored.
"""
from __future__ import annotations

import numbers
from dataclasses import fields, replace

from minipar.backend import backend_name


EVAL_BATCHES = 16      # validation batches by default: 16 of the default 8 sequences = 16 KiB


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what to change."""


def _whole_numbers(config):
    """Every field the config declares an ``int`` holds one: a size of 2.5 (from Python)
    would otherwise fail deep inside a layer's shape or the pipeline's schedule."""
    for f in fields(config):
        value = getattr(config, f.name)
        if f.type in ("int", "Optional[int]") and value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ConfigError(f"`{f.name}` must be a whole number, got {value!r}")


def _positive(config):
    for name in ("tp", "pp", "cp", "chunks", "steps", "batch_size", "grad_accum"):
        if getattr(config, name) < 1:
            raise ConfigError(f"`{name}` must be >= 1")
    if config.dp is not None and config.dp < 1:
        raise ConfigError("`dp` must be >= 1")


def _finite(value):
    return value == value and value not in (float("inf"), float("-inf"))


def _numbers(config):
    """Every numeric setting in its range: NaN, negative or zero where it cannot be
    would train silently wrong (an lr of nan gives nan losses, exit 0)."""
    c = config
    if not (_finite(c.lr) and c.lr > 0):
        raise ConfigError(f"`lr` must be a finite number > 0, got {c.lr}")
    for name in ("weight_decay", "grad_clip"):
        value = getattr(c, name)
        if not (_finite(value) and value >= 0):
            raise ConfigError(f"`{name}` must be a finite number >= 0 (0 turns it off), got {value}")
    for name in ("eval_batches", "warmup", "save_every", "keep", "seed", "hang_timeout"):
        value = getattr(c, name)
        if value is not None and not value >= 0:      # nan too: it is not >= 0
            raise ConfigError(f"`{name}` must be >= 0, got {value}")
    if c.seed >= 2 ** 63:
        raise ConfigError(f"`seed` must be below 2^63, got {c.seed}")
    if c.stop_at is not None and not 1 <= c.stop_at <= c.steps:
        raise ConfigError(f"`stop_at` must be in [1, steps = {c.steps}], got {c.stop_at}")
    for name in ("peak_tflops", "bucket_mb", "initial_loss_scale", "mem_per_rank"):
        value = getattr(c, name)
        if value is not None and not (_finite(value) and value > 0):
            raise ConfigError(f"`{name}` must be a finite number > 0, got {value}")


ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "full", "selective")
BACKENDS = ("numpy", "cupy")


def _names(config):
    """Every setting chosen from a list names one of it.  The command line's choices
    allow nothing else; these catch a ``TrainConfig`` built in Python before the class
    that reads the name (the synchroniser, the schedule, the all-reduce) refuses it
    after the first message."""
    from minipar.backend import dtype_of
    from minipar.comm.algorithms import _algorithm as all_reduce_algorithm
    from minipar.parallel.pipeline.schedules import SCHEDULES
    c = config
    if c.zero not in ZERO_STAGES:
        raise ConfigError(f"`zero` must be 0, 1, 2 or 3, got {c.zero!r}")
    if c.recompute not in RECOMPUTE_MODES:
        raise ConfigError(f"`recompute` must be one of {', '.join(RECOMPUTE_MODES)}, got {c.recompute!r}")
    if c.backend is not None and c.backend not in BACKENDS:
        raise ConfigError(f"`backend` must be one of {', '.join(BACKENDS)}, got {c.backend!r}")
    if c.schedule is not None and c.schedule not in SCHEDULES:
        raise ConfigError(f"`schedule` must be one of {', '.join(SCHEDULES)}, got {c.schedule!r}")
    try:
        all_reduce_algorithm(c.comm_algorithm)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"`comm_algorithm`: {err}") from None
    try:
        dtype_of(c.precision)                 # bf16 also needs ml_dtypes: said here, not later
    except (ValueError, RuntimeError) as err:
        raise ConfigError(f"`precision`: {err}") from None


def _zero(config, cfg):
    if config.zero == 3 and cfg.tie_weights:
        raise ConfigError("`zero` 3 with `tie_weights` is not supported: ZeRO-3 gathers and frees "
                          "the model unit by unit, and the tied weight would belong to two units "
                          "(the embedding and the head); drop `tie_weights` or use `zero` 1 or 2")


def check_resumed_step(config, step):
    """A resumed run must go forward: steps >= the checkpoint's step, and stop_at after it."""
    if config.steps < step:
        raise ConfigError(f"`resume` {config.resume} is at step {step}, past `steps` {config.steps}; "
                          f"set `steps` to at least {step}")
    if config.stop_at is not None and config.stop_at <= step:
        raise ConfigError(f"`stop_at` {config.stop_at} is not after the resumed step {step}; "
                          f"choose a `stop_at` in ({step}, {config.steps}]")


def _data_parallel_size(config, world_size):
    tp, pp, cp = config.tp, config.pp, config.cp
    dp = config.dp if config.dp is not None else world_size // (cp * tp * pp)
    if dp < 1 or dp * cp * tp * pp != world_size:
        shown = config.dp if config.dp is not None else "?"
        if cp == 1:
            raise ConfigError(f"world size {world_size} != dp·tp·pp = {shown}·{tp}·{pp}; "
                              f"launch mpiexec -n {max(dp, 1) * tp * pp} or change the layout")
        raise ConfigError(f"world size {world_size} != dp·cp·tp·pp = {shown}·{cp}·{tp}·{pp}; "
                          f"launch mpiexec -n {max(dp, 1) * cp * tp * pp} or change the layout")
    return dp


def _compression(config):
    methods = ("none", "fp16", "bf16", "int8", "topk", "powersgd")
    c = config
    if c.grad_compression not in methods:
        raise ConfigError(f"`grad_compression` must be one of {', '.join(methods)}, got {c.grad_compression!r}")
    if c.grad_compression == "none":
        changed = [f for f, default in (("compression_ratio", 0.01), ("powersgd_rank", 4),
                                        ("compression_start", None)) if getattr(c, f) != default]
        if changed:
            raise ConfigError(f"`{changed[0]}` sets gradient compression; add `grad_compression` METHOD")
        return
    if c.zero:
        raise ConfigError(f"`grad_compression` {c.grad_compression} with `zero` {c.zero} is not supported: "
                          "ZeRO reduce-scatters gradients into shards, while the hooks replace DDP's "
                          "all-reduce of whole buckets; use `zero` 0")
    if c.grad_compression in ("int8", "topk", "powersgd") and c.precision == "fp16":
        raise ConfigError(f"`grad_compression` {c.grad_compression} with `precision` fp16 is not supported: "
                          "its error-feedback residuals are in loss-scaled units, which a scale change "
                          "or a skipped step would corrupt; use bf16 or fp32")
    if not 0 < c.compression_ratio <= 1:
        raise ConfigError(f"`compression_ratio` must be in (0, 1], got {c.compression_ratio}")
    if c.powersgd_rank < 1:
        raise ConfigError(f"`powersgd_rank` must be >= 1, got {c.powersgd_rank}")
    if c.compression_start is not None and c.compression_start < 0:
        raise ConfigError(f"`compression_start` must be >= 0, got {c.compression_start}")


def _context(config, cfg):
    if config.cp_split not in ("zigzag", "contiguous"):
        raise ConfigError(f"`cp_split` must be zigzag or contiguous, got {config.cp_split!r}")
    if config.cp == 1:
        if config.cp_split != "zigzag":
            raise ConfigError("`cp_split` belongs to context parallelism; set `cp` C or leave it out")
        return
    from minipar.parallel.context import check_context_parallel
    try:
        check_context_parallel(cfg.seq_len, config.cp)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if config.sequence_parallel and (cfg.seq_len // config.cp) % config.tp:
        raise ConfigError(f"with `cp` {config.cp} and `sequence_parallel` each rank's "
                          f"{cfg.seq_len // config.cp} positions must divide by `tp` {config.tp}")


def _pipeline(config, cfg, dp):
    pp, chunks = config.pp, config.chunks
    m = config.microbatches if config.microbatches is not None else (2 * pp if pp > 1 else 1)
    if not config.pipelined:
        if config.microbatches not in (None, 1) or config.trace:
            raise ConfigError("`microbatches` and `trace` belong to pipeline parallelism; "
                              "set `pp` P (P >= 2) or leave them out")
        return 1
    schedule = config.schedule or "1f1b"
    if chunks > 1 and schedule != "interleaved":
        raise ConfigError(f"`chunks` {chunks} needs `schedule` interleaved")
    if schedule == "interleaved" and chunks < 2:
        raise ConfigError("`schedule` interleaved needs `chunks` V with V >= 2")
    if schedule == "interleaved" and m % pp:
        raise ConfigError(f"`schedule` interleaved needs `microbatches` divisible by `pp` {pp}, got {m}")
    if m < 1:
        raise ConfigError("`microbatches` must be >= 1")
    from minipar.parallel.pipeline.stage import check_partition
    try:
        check_partition(cfg.n_layer, pp, chunks)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.tie_weights:
        raise ConfigError("`tie_weights` with pipeline parallelism is not supported; drop it")
    if config.grad_accum != 1:
        raise ConfigError("with `pp`, micro-batches do the accumulation: use `microbatches` "
                          "instead of `grad_accum`")
    if config.zero == 3:
        raise ConfigError("`zero` 3 with `pp` is not supported (ZeRO-3 gathers whole-model "
                          "units); use `zero` 1 or 2 with pipeline parallelism")
    if config.batch_size % (dp * m):
        raise ConfigError(f"`batch_size` {config.batch_size} must be divisible by "
                          f"dp·microbatches = {dp}·{m}")
    return m


def _tensor(config, cfg):
    if config.sequence_parallel and config.tp == 1:
        raise ConfigError("`sequence_parallel` needs `tp` T with T >= 2")
    if config.tp > 1:
        from minipar.parallel.tensor import check_tensor_parallel
        check_tensor_parallel(cfg, config.tp, config.sequence_parallel)


def _flags_have_effect(config):
    if config.schedule is not None and not config.pipelined:
        raise ConfigError("`schedule` belongs to pipeline parallelism; set `pp` P or leave it out")
    if config.zero > 0 and (config.comm_algorithm != "auto" or not config.overlap):
        raise ConfigError("`comm_algorithm` and `no_overlap` set data parallelism's all-reduce "
                          "(`zero` 0); ZeRO reduce-scatters (ring) from the gradient hooks")
    if config.zero == 3 and config.bucket_mb is not None:
        raise ConfigError("`bucket_mb` does not apply to `zero` 3, whose units are the layers")
    if config.initial_loss_scale is not None and config.precision != "fp16":
        raise ConfigError("`initial_loss_scale` needs `precision` fp16 (the only one scaled)")
    if config.balance and config.pipelined:
        raise ConfigError("`balance` with pipeline parallelism is not built (it would move layers "
                          "between stages); use it with data parallelism")
    if config.mem_per_rank is not None and config.skip_memory_check:
        raise ConfigError("`mem_per_rank` sets the limit of the memory check that "
                          "`skip_memory_check` turns off; drop one")
    if config.save_every and not config.save:
        raise ConfigError("`save_every` needs `save` DIR")
    if config.save_async and not config.save:
        raise ConfigError("`save_async` needs `save` DIR")
    if config.recompute != "none" and (config.dropout or 0) > 0 and backend_name() == "cupy":
        raise ConfigError("`recompute` with dropout on CuPy is not supported: replaying the "
                          "dropout masks needs the generator's state, which CuPy does not expose")


def with_data_vocabulary(config):
    """The data a name stands for (``stdlib``: its cached BPE shards, built the first
    time, ``data/named.py``), and the model's vocabulary: the data's (256 for bytes, or a
    tokenized dataset's) unless given."""
    from minipar.data.named import resolve_data
    from minipar.data.tokens import vocab_size_of
    try:
        config = replace(config, data=resolve_data(config.data, quiet=config.quiet))
        if config.vocab_size is not None:
            return config
        return replace(config, vocab_size=vocab_size_of(config.data))
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None


def check(config, world_size):
    """``config`` resolved for ``world_size`` ranks, or ConfigError."""
    _whole_numbers(config)
    _positive(config)
    _numbers(config)
    _names(config)
    config = with_data_vocabulary(config)     # the data may be built now: after the cheap checks
    dp = _data_parallel_size(config, world_size)
    try:
        cfg = config.model_config()
        _tensor(config, cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _zero(config, cfg)
    _flags_have_effect(config)
    _compression(config)
    _context(config, cfg)
    m = _pipeline(config, cfg, dp)
    if config.balance and dp == 1:
        raise ConfigError("`balance` shares the batch between data-parallel replicas; with dp 1 "
                          "there is nothing to balance")
    if config.batch_size % (dp * config.grad_accum):
        raise ConfigError(f"`batch_size` {config.batch_size} must be divisible by "
                          f"dp·grad-accum = {dp}·{config.grad_accum}")
    if config.resume:
        from minipar.checkpoint import exists
        if not exists(config.resume):
            raise ConfigError(f"`resume` {config.resume}: no checkpoint there")
    scale = config.initial_loss_scale
    if scale is None and config.precision == "fp16":
        scale = 2.0 ** 16
    # bucket_mb stays None where none was given: the run chooses it (perf/bucket_size.py)
    return replace(config, dp=dp, microbatches=m, initial_loss_scale=scale,
                   schedule=config.schedule or ("1f1b" if config.pipelined else None),
                   eval_batches=EVAL_BATCHES if config.eval_batches is None else config.eval_batches)
