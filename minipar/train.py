"""``python -m minipar train``: building the model, the optimizer and the grid for a
layout (the step loop itself is ``train_loop.py``).

One optimizer step:
    batch  = the global batch of step k, a pure function of (seed, k)
    mine   = this data-parallel replica's rows of it
    forward + backward: K micro-batches in turn (grad accumulation), or the
                        pipeline schedule over M micro-batches (--pp)
    gradients averaged over replicas (DDP all-reduce or ZeRO reduce-scatter)
    clip the global gradient norm;  AdamW with the warm-up + cosine learning rate
and a log line.  ``--batch-size`` is the global batch, so every layout sees the
same data and makes the same update as the single-process run.
"""
from __future__ import annotations

import contextlib

from minipar import backend, checkpoint
from minipar.autograd import no_grad
from minipar.data import Dataset, load_corpus, shard_rows
from minipar.layout import LayoutError, validate_layout, model_config
from minipar.nn import GPT


def build_optimizer(module, grid, args, tp_model=None, amp=None):
    """DDP + AdamW for --zero 0, ZeRO-1/2/3 otherwise, on fp32 masters with a loss
    scaler for fp16/bf16 (``amp`` for DDP; ZeRO shards the masters itself); one
    interface for the loop."""
    from minipar.parallel.data import DataParallel, DataParallelAdamW
    from minipar.parallel.norm import GlobalNorm
    from minipar.parallel.zero import ZeroOptimizer
    from minipar.parallel.zero3 import ZeroStage3
    adam = dict(lr=args.lr, weight_decay=args.weight_decay)
    weight, prepare = None, None
    if tp_model is not None:      # replicated weights are counted once over the tp group
        weight = lambda name: 1.0 if name in tp_model.shard_specs else 1.0 / grid.tp  # noqa: E731
        prepare = tp_model.reduce_replicated_grads
    norm = GlobalNorm([grid.tp_comm, grid.pp_comm], weight)
    bucket_bytes = int(args.bucket_mb * 2**20)
    scaler = None
    if args.precision in ("fp16", "bf16"):
        from minipar.amp import make_scaler
        scaler = make_scaler(args.precision, comm=grid.world, init_scale=args.initial_loss_scale)
    if args.zero == 0:
        ddp = DataParallel(module, grid.dp_comm, bucket_bytes=bucket_bytes,
                           algorithm=args.comm_algorithm, overlap=not args.no_overlap)
        if amp is None:
            return DataParallelAdamW(ddp, global_norm=norm, prepare_grads=prepare, **adam)
        from minipar.amp import AmpAdamW
        return AmpAdamW(amp, scaler, ddp=ddp, norm_fn=lambda named: norm.total(norm.local_sq(named)),
                        prepare_grads=prepare, **adam)
    zero = dict(global_norm=norm, prepare_grads=prepare, scaler=scaler,
                half_dtype=backend.dtype_of(args.precision) if scaler else None, **adam)
    if args.zero == 3:
        return ZeroStage3(module, grid.dp_comm, **zero)
    return ZeroOptimizer(module, grid.dp_comm, stage=args.zero, bucket_bytes=bucket_bytes, **zero)


def build_model(args, layout, grid, cfg, params):
    """The plain GPT (weights from ``params`` when resuming), sliced for tensor
    parallelism, cut into pipeline stages.  Returns (model, module the optimizer
    owns, pipeline engine or None, tensor-parallel model or None)."""
    model = GPT(cfg, seed=args.seed)
    if params is not None:
        model.load_state_dict(params)
    tp_model = None
    if layout.tp > 1:
        from minipar.parallel.tensor import to_tensor_parallel
        model = tp_model = to_tensor_parallel(model, grid, args.sequence_parallel)
    if args.recompute != "none":
        from minipar.recompute import apply_recompute
        apply_recompute(model, args.recompute)
    if layout.pp == 1 and layout.chunks == 1:
        return model, model, None, tp_model
    from minipar.parallel.pipeline.engine import PipelineEngine
    from minipar.parallel.pipeline.stage import RankStages
    module = RankStages(model, grid.coords.pp, layout.pp, layout.chunks)
    act_shape = None
    if args.sequence_parallel:   # stages exchange their s/tp tokens of the sequence
        act_shape = lambda rows, n: (rows, n // layout.tp, cfg.d_model)  # noqa: E731
    engine = PipelineEngine(module, grid.pp_comm, args.schedule, layout.microbatches,
                            layout.chunks, activation_shape=act_shape,
                            dtype=backend.dtype_of(args.precision))
    return model, module, engine, tp_model


def evaluate(model, dataset, args, batches, grid, engine=None):
    """This replica's mean loss over ``batches`` fixed batches of the validation split.

    Evaluation is laid out as training is, so its memory peak is training's: each
    data-parallel replica takes its share of the rows, in --grad-accum pieces (a pipeline:
    in its micro-batches).  Every rank calls it — tensor-parallel, ZeRO-3 and pipelined
    forwards are collective — and ``_global_loss`` turns the replicas' means into the
    batch mean.  With a pipeline only the last stage knows the loss (0.0 elsewhere).
    """
    model.eval()
    total = 0.0
    with no_grad():
        for i in range(batches):
            x, y = dataset.batch(args.seed, i, args.batch_size, split="val")
            x, y = shard_rows(x, grid.coords.dp, grid.dp), shard_rows(y, grid.coords.dp, grid.dp)
            if engine is not None:
                loss = engine.evaluate(x, y)
                total += loss if grid.is_last_stage else 0.0
                continue
            rows = x.shape[0] // args.grad_accum
            for k in range(args.grad_accum):
                xs, ys = x[k * rows:(k + 1) * rows], y[k * rows:(k + 1) * rows]
                total += model(backend.to_device(xs), backend.to_device(ys))[1].item() / args.grad_accum
    model.train()
    return total / max(batches, 1)


def forward_backward(model, optimizer, x, y, grad_accum):
    """K micro-batches of this replica's rows; returns the mean local loss."""
    rows = x.shape[0] // grad_accum
    ddp = optimizer.ddp
    loss_sum = 0.0
    for i in range(grad_accum):
        last = i == grad_accum - 1
        quiet = ddp.no_sync() if (ddp is not None and not last) else contextlib.nullcontext()
        with quiet:
            xs, ys = x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]
            _, loss = model(backend.to_device(xs), backend.to_device(ys))
            (optimizer.scale_loss(loss) * (1.0 / grad_accum)).backward()
        loss_sum += loss.item()
    return loss_sum / grad_accum


def pipeline_forward_backward(engine, optimizer, x, y):
    """The schedule over M micro-batches; DP sync waits until after the last backward."""
    ddp = optimizer.ddp
    scale = optimizer.scaler.scale if optimizer.scaler else 1.0
    with (ddp.no_sync() if ddp is not None else contextlib.nullcontext()):
        loss = engine.run(x, y, loss_scale=scale)
    return 0.0 if loss is None else loss


def save_checkpoint(args, cfg, optimizer, grid, step, tp_model=None):
    """Full arrays by parameter name on world rank 0, whatever the layout: ZeRO shards
    gathered over dp, tensor slices over tp, stages merged over pp."""
    state = optimizer.state_dict()            # collective: gathers ZeRO shards
    params = optimizer.model_state_dict()     # collective under ZeRO-3
    if tp_model is not None:                  # collective over tp: slices -> full arrays
        params = tp_model.gather_full_arrays(params)
        state = dict(state, m=tp_model.gather_full_arrays(state["m"]),
                     v=tp_model.gather_full_arrays(state["v"]))
    if grid.pp > 1:                           # each stage holds other names: merge them
        parts = grid.pp_comm.mpi.gather((params, state), root=0)
        if parts is not None:
            params = {k: v for p, _ in parts for k, v in p.items()}
            state = {"step": state["step"], "m": {k: v for _, s in parts for k, v in s["m"].items()},
                     "v": {k: v for _, s in parts for k, v in s["v"].items()}}
    if grid.rank == 0:
        meta = {"model": cfg.to_dict(), "step": step, "seed": args.seed, "precision": args.precision}
        if optimizer.scaler:
            meta["loss_scaler"] = optimizer.scaler.state_dict()
        checkpoint.save(args.save, params, state, meta)


def train(args):
    layout = validate_layout(args)            # every check happens before any message
    from minipar.comm import Communicator, abort_on_exception
    from minipar.parallel.grid import ProcessGrid
    if layout.world_size > 1:
        abort_on_exception()
    half = args.precision in ("fp16", "bf16")   # built in fp32, then rounded (fp32 masters)
    backend.set_default_dtype(backend.dtype_of("fp32" if half else args.precision))
    cfg = model_config(args)
    resume = None
    if args.resume:                           # a missing, corrupt or foreign file stops
        try:                                  # every rank here, before any message
            resume = checkpoint.load(args.resume)
            checkpoint.check_compatible(resume[2], cfg.to_dict())
        except (ValueError, FileNotFoundError) as err:
            raise LayoutError(f"--resume {args.resume}: {err}") from None
    dataset = Dataset(load_corpus(args.data), cfg.seq_len)
    grid = ProcessGrid(Communicator(), dp=layout.dp, tp=layout.tp, pp=layout.pp)
    model, module, engine, tp_model = build_model(args, layout, grid, cfg,
                                                  resume[0] if resume else None)
    amp = None
    if half and args.zero == 0:               # ZeRO keeps (and shards) the masters itself
        from minipar.amp import MixedPrecision
        amp = MixedPrecision(module, args.precision)
    optimizer = build_optimizer(module, grid, args, tp_model, amp)
    start = 0
    if resume:
        _, state, meta = resume
        if tp_model is not None:
            state = dict(state, m=tp_model.shard_full_arrays(state["m"]),
                         v=tp_model.shard_full_arrays(state["v"]))
        optimizer.load_state_dict(state)
        if "loss_scaler" in meta and optimizer.scaler:
            optimizer.scaler.load_state_dict(meta["loss_scaler"])
        start = int(meta["step"])
    from minipar.train_loop import run_steps
    run_steps(args, layout, grid, cfg, dataset, model, optimizer, engine, start, tp_model)
    return model
