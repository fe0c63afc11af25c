"""``parallelize(model, config, grid)``: a plain GPT made ready for a layout, in one
visible order, each step a wrapper or a layer swap over the model before it:

    1. tensor parallelism   TensorParallelGPT: column/row/vocab-parallel layers sliced
                            from the plain model (+ sequence parallelism)
    1b. context parallelism this rank's positions; attention cores become ring attention
    1c. expert parallelism  this rank's experts of each MoE block, the others dropped;
                            tokens reach them by all-to-all (``experts.py``)
    2. recomputation        Recompute(block) or Recompute(attn.core)
    3. pipeline stages      RankStages (this rank's chunks) and the PipelineEngine
    3b. construction        a model of placeholders (``GPT(cfg, seed, materialize=False)``)
                            is cut first and drawn afterwards: this rank draws each of its
                            weights from (seed, name), keeps its tp piece, and the
                            synchroniser writes it straight into its flat buffers (DDP,
                            ZeRO-1/2) or, under ZeRO-3, only its range into its shard
    4. the synchroniser     DDPSync | ZeroSync (ZeRO-1/2) | Zero3Sync, with the masters
                            of mixed precision; ZeRO-3 also wraps the model (Zero3Model);
                            under expert parallelism two of them (ExpertSplitSync)

Where each parameter ends up is one table, ``Parallelized.placements`` (``placement.py``):
the tp cuts and pipeline stages are made first (``tp_placements``: construction cuts
drawn tensors with them), and the synchroniser adds its own cut (``sync.placements()``).

``build_optimizer(parallel, config, grid)`` then gives the one optimizer step
(``step.Optimizer``) over the synchroniser.  ``config`` is anything with the fields of
``minipar.config.TrainConfig`` (tp, sequence_parallel, recompute, pp, chunks, schedule,
microbatches, zero, bucket_mb, comm_algorithm, overlap, precision, lr, weight_decay,
initial_loss_scale); nothing here reads a command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipar import backend


@dataclass
class Parallelized:
    model: Any            # what forward is called on (None with a pipeline: use engine)
    module: Any           # what holds this rank's parameters (the synchroniser's module)
    sync: Any             # the gradient synchroniser
    engine: Any = None    # PipelineEngine when pp > 1 or chunks > 1
    tp_model: Any = None  # TensorParallelGPT when tp > 1 (checkpoint gathering)
    positions: Any = None  # the sequence positions this rank holds (cp > 1), else None
    placements: Any = None  # {name: Placement} of the parameters this rank holds

    def local_tokens(self, x):
        """This rank's columns of a (rows, seq_len) batch."""
        return x if self.positions is None else x[:, self.positions]


def _compression_hook(config):
    """DDP's comm hook for ``config.grad_compression`` (None: the plain all-reduce)."""
    method = getattr(config, "grad_compression", "none")
    if method == "none":
        return None
    from minipar.parallel.sync.compression import make_hook
    return make_hook(method, ratio=config.compression_ratio, rank=config.powersgd_rank,
                     start=config.compression_start)


def _piece_drawer(specs, seed, table, checkpoint=None):
    """name -> this rank's tp piece of that weight, drawn from (seed, name): one full
    tensor on the host at a time (``nn/init.py``, ``placement.py``).  Resuming from a
    ``checkpoint``, zeros: the optimizer's slots then read exactly the elements they own
    (``train/saving.load_state``), so nothing is drawn and no whole tensor is read."""
    import numpy as np
    from minipar.nn.init import initial_value
    if checkpoint is not None:
        return lambda name: np.zeros(table[name].piece_shape)

    def piece(name):
        shape, spec = specs[name]
        return table[name].piece(initial_value(seed, name, shape, spec))
    return piece


def make_sync(module, config, grid, table, model=None, initial_piece=None):
    """The synchroniser for ``config.zero`` over the data-parallel group (dp × cp);
    ``table``: the placements made so far (tp, stage).  Under expert parallelism, one
    for the dense weights and one for the experts (``sync/experts.py``)."""
    from minipar.parallel.sync import ExpertSplitSync
    if getattr(config, "ep", 1) > 1:
        from minipar.parallel.experts import is_expert_weight
        from minipar.parallel.sync.experts import ParameterSubset
        dense_part = ParameterSubset(module, lambda n: not is_expert_weight(n))
        expert_part = ParameterSubset(module, is_expert_weight)
        if config.zero == 3:
            return _zero3_expert_split(module, config, grid, table, initial_piece,
                                       dense_part, expert_part)
        dense = _sync_of_form(dense_part, config, grid.dp_cp_comm, table, None, initial_piece)
        experts = _sync_of_form(expert_part, config, grid.edp_comm, table, None, initial_piece,
                                mean_over=grid.dp_cp_comm.size)
        return ExpertSplitSync(module, grid.dp_cp_comm, table, dense, experts)
    return _sync_of_form(module, config, grid.dp_cp_comm, table, model, initial_piece)


def _zero3_expert_split(module, config, grid, table, initial_piece, dense_part, expert_part):
    """ZeRO-3 under expert parallelism: each unit's dense weights sharded over dp·cp, its
    experts over the ranks holding them (``sync/experts.py``)."""
    from minipar.parallel.experts import is_expert_weight
    from minipar.parallel.sync import ExpertSplitSync, Zero3Sync
    from minipar.parallel.sync.experts import split_units
    from minipar.parallel.sync.zero3 import model_units
    names = {id(p): n for n, p in module.named_parameters()}
    dense_units, expert_units, expert_unit_of = split_units(
        model_units(module), lambda p: is_expert_weight(names[id(p)]))
    half = backend.dtype_of(config.precision) if config.precision in ("fp16", "bf16") else None
    dense = Zero3Sync(dense_part, grid.dp_cp_comm, table, half_dtype=half,
                      initial_piece=initial_piece, units=dense_units)
    experts = Zero3Sync(expert_part, grid.edp_comm, table, half_dtype=half,
                        initial_piece=initial_piece, units=expert_units,
                        mean_over=grid.dp_cp_comm.size)
    return ExpertSplitSync(module, grid.dp_cp_comm, table, dense, experts, expert_unit_of)


def _sync_of_form(module, config, comm, table, model, initial_piece, mean_over=None):
    """DDPSync, ZeroSync or Zero3Sync, as ``config.zero`` says, over ``comm``."""
    from minipar.parallel.sync import DDPSync, Zero3Sync, ZeroSync
    half = backend.dtype_of(config.precision) if config.precision in ("fp16", "bf16") else None
    from minipar.parallel.buckets import bucket_bytes as bucket_bytes_of
    bucket_bytes = bucket_bytes_of(config)
    if config.zero == 0:
        hook = _compression_hook(config)
        sync = DDPSync(module, comm, table, bucket_bytes=bucket_bytes,
                       algorithm=config.comm_algorithm, overlap=config.overlap, half_dtype=half,
                       comm_hook=hook, initial_piece=initial_piece, mean_over=mean_over)
        if hook is not None:
            hook.bind(sync)          # it needs the buckets' parameters (names, shapes)
        return sync
    if config.zero == 3:
        return Zero3Sync(model if model is not None else module, comm, table,
                         half_dtype=half, initial_piece=initial_piece, mean_over=mean_over)
    return ZeroSync(module, comm, table, stage=config.zero, bucket_bytes=bucket_bytes,
                    half_dtype=half, initial_piece=initial_piece, mean_over=mean_over)


def parallelize(model, config, grid, checkpoint=None):
    """Steps 1-4 above; returns a ``Parallelized``.  ``model`` is not modified when tp > 1
    (it is sliced into a copy) unless its weights are placeholders (then it is used up);
    otherwise its blocks are wrapped in place.  ``checkpoint`` (an open ``Checkpoint``):
    a model of placeholders is built as zeros, not drawn; its weights are read later."""
    from minipar.nn.init import init_specs, initialise, is_unmade
    from minipar.parallel.placement import tp_placements
    global_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    specs = init_specs(model) if is_unmade(model) else None   # read before any cut
    seed = getattr(model, "seed", 0)
    tp_model = None
    if config.tp > 1:                                               # 1. tensor parallel
        from minipar.parallel.tensor import to_tensor_parallel
        model = tp_model = to_tensor_parallel(model, grid, config.sequence_parallel)
    positions = None
    if getattr(config, "cp", 1) > 1:                                # 1b. context parallel
        from minipar.parallel.context import apply_context_parallel
        apply_context_parallel(model, grid.cp_comm, config.cp_split == "zigzag",
                               config.cp_kind, config.cp_ulysses)
        positions = model.token_positions
    if model.config.moe_experts:     # MoE statistics per sequence, where sequences are split
        from minipar.parallel.moe_split import split_moe_sequences
        split_moe_sequences(model, grid, positions, model.config.seq_len,
                            bool(getattr(config, "sequence_parallel", False)))
    if getattr(config, "ep", 1) > 1:                                # 1c. expert parallel
        from minipar.parallel.experts import apply_expert_parallel
        apply_expert_parallel(model, grid.ep_comm)
    if config.recompute != "none":                                  # 2. recomputation
        from minipar.recompute import apply_recompute
        apply_recompute(model, config.recompute)
    module, engine = model, None
    if config.pp > 1 or config.chunks > 1:                          # 3. pipeline stages
        from minipar.parallel.pipeline.engine import PipelineEngine
        from minipar.parallel.pipeline.stage import RankStages
        module = RankStages(model, grid.coords.pp, config.pp, config.chunks)
        act_shape = None
        if config.sequence_parallel:   # stages exchange their s/tp tokens of the sequence
            d, tp = model.config.d_model, config.tp
            act_shape = lambda rows, n: (rows, n // tp, d)  # noqa: E731
        engine = PipelineEngine(module, grid.pp_comm, config.schedule, config.microbatches,
                                config.chunks, activation_shape=act_shape,
                                dtype=backend.dtype_of(config.precision))
    tp_comm = grid.tp_comm if tp_model is not None else None
    table = tp_placements(global_shapes, tp_model, tp_comm,         # the cuts so far
                          bool(config.sequence_parallel), module)
    piece = None
    if specs is not None:                                           # 3b. construction
        piece = _piece_drawer(specs, seed, table, checkpoint)
    sync = make_sync(module, config, grid, table, initial_piece=piece)   # 4. synchroniser
    if piece is not None and is_unmade(module):    # weights no synchroniser packed
        initialise(module, piece)
    if engine is None and config.zero == 3:
        model = module = sync.wrap(model)
    return Parallelized(model=None if engine else model, module=module, sync=sync,
                        engine=engine, tp_model=tp_model, positions=positions,
                        placements=sync.placements())


def build_optimizer(parallel, config, grid):
    """The one optimizer step over ``parallel.sync``: AdamW, the global norm over the
    model's other groups (tp, pp), a loss scaler for fp16 (agreed over every rank)."""
    from minipar.parallel.step import Optimizer
    scaler = None
    if config.precision in ("fp16", "bf16"):
        from minipar.amp import make_scaler
        scaler = make_scaler(config.precision, comm=grid.world,
                             init_scale=config.initial_loss_scale or 2.0 ** 16)
    tp_comm = grid.tp_comm if parallel.tp_model is not None else None
    return Optimizer(parallel.sync, lr=config.lr, weight_decay=config.weight_decay, scaler=scaler,
                     norm_comms=[grid.tp_comm, grid.pp_comm], tp_comm=tp_comm)
