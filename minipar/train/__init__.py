"""Training a GPT under any layout: ``train(config)`` behind ``python -m minipar train``.

The data path of one run, file by file (see ``docs/architecture.md``):

    config.py       TrainConfig, frozen; ``resolve(world_size)`` checks it once
    parallel/grid   ProcessGrid(dp, tp, pp) from the config
    nn/gpt          the plain GPT (same seed -> same weights on every rank)
    parallel/parallelize
                    tp/sp layers -> recompute wrappers -> pipeline stages -> synchroniser
    train/steps     forward + backward of this replica's rows (grad accumulation or the
                    pipeline schedule); hooks start the gradient communication
    parallel/step   the one optimizer step: finish -> unscale -> found_inf -> norm ->
                    clip -> AdamW -> publish
    train/loop      the step loop: data, the step, the log, checkpoints, evaluation
    train/saving    layout-free checkpoints (full arrays by parameter name)

``--batch-size`` is the global batch, so every layout sees the same data and makes the
same update as the single-process run.
"""
from __future__ import annotations

from minipar import backend, checkpoint
from minipar.config import ConfigError, TrainConfig


def _world_size():
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_size()


def load_resume(config, cfg):
    """(params, optimizer state, meta) of ``config.resume``, or None; a missing, corrupt
    or foreign checkpoint stops every rank here, before any message."""
    if not config.resume:
        return None
    try:
        resume = checkpoint.load(config.resume)
        checkpoint.check_compatible(resume[2], cfg.to_dict())
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"`resume` {config.resume}: {err}") from None
    return resume


def setup(config: TrainConfig):
    """Everything a run needs, built in the order of the module docstring."""
    from minipar.comm import Communicator, abort_on_exception
    from minipar.data import Dataset, load_corpus
    from minipar.nn import GPT
    from minipar.parallel.grid import ProcessGrid
    from minipar.parallel.parallelize import build_optimizer, parallelize
    from minipar.train.loop import Run
    from minipar.train.saving import load_optimizer_state
    config = config.resolve(_world_size())      # every check happens before any message
    if config.world_size > 1:
        abort_on_exception()
    half = config.precision in ("fp16", "bf16")   # built in fp32, then rounded (fp32 masters)
    backend.set_default_dtype(backend.dtype_of("fp32" if half else config.precision))
    cfg = config.model_config()
    resume = load_resume(config, cfg)
    dataset = Dataset(load_corpus(config.data), cfg.seq_len)
    grid = ProcessGrid(Communicator(), dp=config.dp, tp=config.tp, pp=config.pp)
    model = GPT(cfg, seed=config.seed)
    if resume is not None:
        model.load_state_dict(resume[0])
    parallel = parallelize(model, config, grid)
    optimizer = build_optimizer(parallel, config, grid)
    start = load_optimizer_state(optimizer, parallel, resume) if resume else 0
    return Run(config, grid, cfg, dataset, parallel, optimizer, start)


def train(config: TrainConfig):
    """Train under ``config``; returns the run (its model, optimizer, grid, losses)."""
    run = setup(config)
    run.loop()
    return run


__all__ = ["train", "setup", "TrainConfig", "ConfigError"]
