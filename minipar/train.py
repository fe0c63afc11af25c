"""The training loop behind ``python -m minipar train``.

One optimizer step:
    batch  = the global batch of step k, a pure function of (seed, k)
    mine   = this data-parallel replica's rows of it
    for each of K micro-batches:  loss_i = CE(model(x_i), y_i) / K;  backward
    gradients averaged over replicas (DDP all-reduce or ZeRO reduce-scatter)
    clip the global gradient norm;  AdamW with the warm-up + cosine learning rate
and a log line.  ``--batch-size`` is the global batch, so every layout sees the
same data and makes the same update as the single-process run.
"""
from __future__ import annotations

import contextlib
import json
import time

import numpy as np

from minipar import backend, checkpoint
from minipar.autograd import no_grad
from minipar.data import Dataset, load_corpus, shard_rows
from minipar.layout import validate_layout
from minipar.nn import GPT, config_from_preset


def model_config(args):
    return config_from_preset(args.model, n_layer=args.n_layer, d_model=args.d_model,
                              n_head=args.n_head, seq_len=args.seq_len, dropout=args.dropout,
                              tie_weights=args.tie_weights, attention=args.attention)


def build_optimizer(model, grid, args):
    """DDP + AdamW for --zero 0, ZeRO-1/2 otherwise; one interface for the loop."""
    from minipar.parallel.data import DataParallel, DataParallelAdamW
    from minipar.parallel.zero import ZeroOptimizer
    from minipar.parallel.zero3 import ZeroStage3
    adam = dict(lr=args.lr, weight_decay=args.weight_decay)
    bucket_bytes = int(args.bucket_mb * 2**20)
    if args.zero == 0:
        ddp = DataParallel(model, grid.dp_comm, bucket_bytes=bucket_bytes,
                           algorithm=args.comm_algorithm, overlap=not args.no_overlap)
        return DataParallelAdamW(ddp, **adam)
    if args.zero == 3:
        return ZeroStage3(model, grid.dp_comm, **adam)
    return ZeroOptimizer(model, grid.dp_comm, stage=args.zero, bucket_bytes=bucket_bytes, **adam)


def evaluate(model, dataset, args, batches):
    """Mean validation loss over ``batches`` fixed batches (every rank computes it)."""
    model.eval()
    total = 0.0
    with no_grad():
        for i in range(batches):
            x, y = dataset.batch(args.seed, i, args.batch_size, split="val")
            total += model(backend.to_device(x), backend.to_device(y))[1].item()
    model.train()
    return total / max(batches, 1)


def forward_backward(model, optimizer, x, y, grad_accum):
    """K micro-batches of this replica's rows; returns the mean local loss."""
    rows = x.shape[0] // grad_accum
    ddp = getattr(optimizer, "ddp", None)
    loss_sum = 0.0
    for i in range(grad_accum):
        last = i == grad_accum - 1
        quiet = ddp.no_sync() if (ddp is not None and not last) else contextlib.nullcontext()
        with quiet:
            xs, ys = x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]
            _, loss = model(backend.to_device(xs), backend.to_device(ys))
            (loss * (1.0 / grad_accum)).backward()
        loss_sum += loss.item()
    return loss_sum / grad_accum


def save_checkpoint(args, model, optimizer, step, rank):
    state = optimizer.state_dict()            # collective: gathers shards on every rank
    params = optimizer.model_state_dict()     # collective under ZeRO-3
    if rank == 0:
        meta = {"model": model.config.to_dict(), "step": step, "seed": args.seed,
                "precision": args.precision}
        checkpoint.save(args.save, params, state, meta)


def train(args):
    layout = validate_layout(args)            # every check happens before any message
    from minipar.comm import Communicator, abort_on_exception, all_reduce
    from minipar.parallel.grid import ProcessGrid
    if layout.world_size > 1:
        abort_on_exception()
    backend.set_default_dtype(backend.dtype_of(args.precision))
    cfg = model_config(args)
    resume = None
    if args.resume:
        resume = checkpoint.load(args.resume)
        checkpoint.check_compatible(resume[2], cfg.to_dict())
    dataset = Dataset(load_corpus(args.data), cfg.seq_len)
    grid = ProcessGrid(Communicator(), dp=layout.dp, tp=layout.tp, pp=layout.pp)
    model = GPT(cfg, seed=args.seed)
    if resume:
        model.load_state_dict(resume[0])
    optimizer = build_optimizer(model, grid, args)
    start = 0
    if resume:
        optimizer.load_state_dict(resume[1])
        start = int(resume[2]["step"])
    return _loop(args, layout, grid, cfg, dataset, model, optimizer, start, all_reduce)


def _loop(args, layout, grid, cfg, dataset, model, optimizer, start, all_reduce):
    from minipar.optim import lr_at
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    tokens_per_step = args.batch_size * cfg.seq_len
    flops_per_step = model.flops_per_token() * tokens_per_step
    is_logger = layout.rank == 0
    log = open(args.log_json, "w") if (args.log_json and is_logger) else None
    bar = None
    if not args.quiet and is_logger:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, initial=start, desc="train", unit="step")
    dp_comm = grid.dp_comm
    end = min(args.steps, args.stop_at) if args.stop_at is not None else args.steps
    for step in range(start, end):
        optimizer.lr = lr_at(step, args.lr, warmup, args.steps)
        x, y = dataset.batch(args.seed, step, args.batch_size)
        x, y = shard_rows(x, grid.coords.dp, layout.dp), shard_rows(y, grid.coords.dp, layout.dp)
        backend.memory.reset_peak()
        t0 = time.perf_counter()
        local_loss = forward_backward(model, optimizer, x, y, args.grad_accum)
        norm = optimizer.step(args.grad_clip)
        optimizer.zero_grad()
        t_loss = time.perf_counter()
        loss = float(all_reduce(dp_comm, np.array([local_loss]))[0]) / layout.dp
        backend.sync()
        t1 = time.perf_counter()
        dt = t1 - t0
        record = {"step": step, "loss": loss, "lr": optimizer.lr, "grad_norm": norm,
                  "tokens_per_s": tokens_per_step / dt, "step_time_s": dt,
                  "comm_time_s": optimizer.exposed_comm_s + (t1 - t_loss),
                  "peak_mem_bytes": backend.memory.peak, "model_state_bytes": optimizer.memory_bytes()}
        if args.peak_tflops:
            record["mfu"] = flops_per_step / dt / (args.peak_tflops * 1e12 * layout.world_size)
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
        if bar:
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update(1)
        if args.save and args.save_every and (step + 1) % args.save_every == 0:
            save_checkpoint(args, model, optimizer, step + 1, layout.rank)
    if bar:
        bar.close()
    if args.save:
        save_checkpoint(args, model, optimizer, end, layout.rank)
    if args.eval_batches and is_logger:
        print(f"val loss {evaluate(model, dataset, args, args.eval_batches):.4f} "
              f"after {end} steps", flush=True)
    if log:
        log.close()
    return model
