"""Training a GPT under any layout: ``train(config)`` behind ``python -m minipar train``.

The data path of one run, file by file (see ``docs/architecture.md``):

    config/         TrainConfig, frozen; ``prepare``: checked, probed, resolved once
    process/devices this rank's GPU on cupy: its rank among its node's ranks % the GPUs
    parallel/grid   ProcessGrid(dp, tp, pp) from the config
    nn/gpt          the plain GPT, as placeholders (weights drawn later by name)
    parallel/parallelize
                    tp/sp layers -> recompute wrappers -> pipeline stages -> this rank's
                    weights drawn from (seed, name) -> synchroniser
    train/steps     forward + backward of this replica's rows (grad accumulation or the
                    pipeline schedule); hooks start the gradient communication
    parallel/step   the one optimizer step: finish -> unscale -> found_inf -> norm ->
                    clip -> AdamW -> publish
    train/loop      the step loop: data, the step, the log, checkpoints, evaluation
    train/saving    sharded checkpoints: each rank writes and reads what it owns

``--batch-size`` is the global batch, so every layout sees the same data and makes the
same update as the single-process run.
"""
from __future__ import annotations

import dataclasses

from minipar import backend, checkpoint
from minipar.config import ConfigError, TrainConfig, prepare


def _world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _world_size():
    return _world().Get_size()


def load_resume(config, model, tokenizer=None):
    """The open ``Checkpoint`` of ``config.resume`` (its index; no array is read yet),
    or None.  A missing, corrupt or foreign checkpoint, or one this run cannot continue
    (another tokenizer, other parameters, shapes, dtypes or precision, non-finite
    weights, a step past the run's end) stops every rank here, before any message."""
    if not config.resume:
        return None
    from minipar.config.rules import check_resumed_step
    try:
        ckpt = checkpoint.open_checkpoint(config.resume)
        meta = ckpt.meta
        check_same_tokenizer(meta, tokenizer)
        defaults = {f.name: f.default for f in dataclasses.fields(model.config)
                    if f.default is not dataclasses.MISSING}
        checkpoint.check_compatible(meta, model.config.to_dict(), defaults)
        if meta.get("precision", config.precision) != config.precision:
            raise ValueError(f"it was written by a {meta['precision']} run; this run is "
                             f"{config.precision} (pass --precision {meta['precision']})")
        checkpoint.check_loadable(ckpt, model, config.precision)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"`resume` {config.resume}: {err}") from None
    check_resumed_step(config, int(meta["step"]))
    from minipar.config.outer import check_outer_resume
    check_outer_resume(config, int(meta["step"]))
    return ckpt


def _tokens_of(tokenizer_dict):
    if tokenizer_dict is None:
        return "bytes"
    size = 256 + len(tokenizer_dict["merges"]) + len(tokenizer_dict["special_tokens"])
    return f"a BPE tokenizer of {size} tokens"


def check_same_tokenizer(meta, tokenizer):
    """A checkpoint continues only on data cut by the tokenizer it learned from."""
    saved, ours = meta.get("tokenizer"), tokenizer.to_dict() if tokenizer is not None else None
    if saved == ours:
        return
    other = " (another one of that size)" if _tokens_of(saved) == _tokens_of(ours) else ""
    raise ValueError(f"it was trained on {_tokens_of(saved)}, this run's data is cut by "
                     f"{_tokens_of(ours)}{other}; give the --data it was trained on")


def setup(config: TrainConfig, prepared=False):
    """Everything a run needs, built in the order of the module docstring.  Every check
    (the config, the outputs, the memory model's peak against the limit, the corpus, the
    checkpoint to resume) comes before the first message between ranks.  ``prepared``:
    ``config`` is what ``config.prepare`` returned for this world (the command line
    prepares it before it calls ``train``); otherwise it is prepared here."""
    from minipar.comm import Communicator, abort_on_exception, set_hang_timeout
    from minipar.data.tokens import open_dataset
    from minipar.nn import make_model
    from minipar.parallel.grid import ProcessGrid
    from minipar.parallel.parallelize import build_optimizer, parallelize
    from minipar.train.loop import TrainingRun
    from minipar.train.saving import load_state
    from minipar.train.fits import check_fits
    from minipar.process.devices import choose_device
    if not prepared:
        config = prepare(config, _world_size())   # checks, preflight's probes, resolve
    # collective on cupy (the node split, one gather): this rank's GPU, chosen before the
    # free memory is read and anything is made on a device
    try:
        devices = choose_device(_world(), share=config.share_gpus)
    except ValueError as err:        # a node with more ranks than GPUs: every rank alike
        raise ConfigError(str(err)) from None
    fit = check_fits(config)        # before anything is allocated: the memory model's peak
    from minipar.observe.procmem import ProcessMemory
    process_memory = ProcessMemory()       # the construction phase starts here
    process_memory.begin("construction")
    half = config.precision in ("fp16", "bf16")   # built in fp32, then rounded (fp32 masters)
    backend.set_default_dtype(backend.dtype_of("fp32" if half else config.precision))
    cfg = config.model_config()
    try:
        dataset = open_dataset(config.data, cfg.seq_len)
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from None
    if dataset.vocab_size != cfg.vocab_size:
        raise ConfigError(f"`data` {config.data} has a vocabulary of {dataset.vocab_size}, "
                          f"the model {cfg.vocab_size}")
    # placeholders only: parallelize cuts them and each rank draws just its own part
    # (nn/init.py); a resumed run builds zeros and reads its part of the checkpoint after
    model = make_model(cfg, seed=config.seed, materialize=False)
    resume = load_resume(config, model, dataset.tokenizer)
    if config.world_size > 1:
        abort_on_exception()
        set_hang_timeout(config.hang_timeout or None)   # a stuck peer ends the job, named
    grid = ProcessGrid(Communicator(transport=config.transport), dp=config.dp, tp=config.tp,
                       pp=config.pp, cp=config.cp, ep=config.ep)
    groups = None
    if config.outer == "diloco":      # DiLoCo: everything below is built inside a group
        from minipar.parallel.outer import carve_groups
        groups = carve_groups(grid, config.diloco_groups)
        grid = groups.inner
    from minipar.process import setup_process
    # collective: threads from MPI's count of the ranks sharing this node; freed blocks kept
    setup_process(grid.world)
    bucket_source = "given" if config.bucket_mb is not None else "chosen by the performance model"
    config = with_bucket_size(config, grid)
    n_params = model.num_parameters()
    parallel = parallelize(model, config, grid, checkpoint=resume)
    optimizer = build_optimizer(parallel, config, grid)
    start, outer = 0, None
    if resume is not None:
        kind_of = None
        if groups is not None:      # DiLoCo: this group's own inner state
            from minipar.parallel.outer.state import inner_kinds
            kind_of = inner_kinds(resume.meta, groups.group)
        start = load_state(optimizer, parallel, resume, config, grid.rank, kind_of=kind_of)
    if groups is not None:          # DiLoCo's outer loop, from the weights now in the slots
        from minipar.parallel.outer import DiLoCo
        outer = DiLoCo(parallel.sync, groups, config, cfg.n_layer)
        if resume is not None:
            from minipar.parallel.outer.state import load_outer_state
            load_outer_state(outer, resume, parallel.placements)
    if resume is not None:
        resume.close()              # unmap its files: what was read is in the run's arrays
    process_memory.record("construction")
    run = TrainingRun(config, grid, cfg, dataset, parallel, optimizer, start, n_params, process_memory)
    run.outer = outer
    run.memory_fit = fit
    run.bucket_source = bucket_source
    run.devices = devices
    return run


def with_bucket_size(config, grid):
    """The config with its gradient bucket size: the user's, or the performance model's
    choice for this layout (``perf/estimate.choose_bucket_mb``), decided on rank 0 and
    broadcast so every rank builds the same buckets.  ZeRO-3's units are the layers: no
    buckets.  Collective.  The model is told how many ranks share a node (MPI's
    shared-memory split: which groups cross the link between nodes); the profile says
    how many nodes share a machine's cores."""
    if config.bucket_mb is not None or config.zero == 3 or grid.dp_cp_comm.size == 1:
        return config
    import dataclasses
    import numpy as np
    from mpi4py import MPI
    from minipar.comm import broadcast
    from minipar.perf.estimate import choose_bucket_mb
    node = grid.world.mpi.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_per_node = node.Get_size()
    node.Free()
    chosen = np.zeros(1)
    if grid.rank == 0:
        chosen[0] = choose_bucket_mb(config, ranks_per_node=ranks_per_node)[0]
    broadcast(grid.world, chosen, root=0)
    return dataclasses.replace(config, bucket_mb=float(chosen[0]))


def train(config: TrainConfig, prepared=False):
    """Train under ``config``; returns the run (its model, optimizer, grid, losses)."""
    run = setup(config, prepared)
    run.loop()
    return run


from minipar.train.errors import TrainingStopped  # noqa: E402

__all__ = ["train", "setup", "TrainConfig", "ConfigError", "TrainingStopped"]
