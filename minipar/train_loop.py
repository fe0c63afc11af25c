"""The step loop of ``train``: data, forward/backward, update, logging, saving."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from minipar import backend
from minipar.comm import all_gather, all_reduce
from minipar.data import shard_rows
from minipar.optim import lr_at


def _global_loss(grid, local_loss):
    """The mean loss of the global batch: the last stage's value, averaged over dp."""
    value = backend.to_device(np.array([local_loss if grid.is_last_stage else 0.0]))
    if grid.pp > 1:
        value = all_reduce(grid.pp_comm, value)
    return float(backend.to_host(all_reduce(grid.dp_comm, value))[0]) / grid.dp


def _inject_failure(step, rank):
    """Fault injection for tests: MINIPAR_INJECT_FAILURE="RANK:STEP" raises on that
    rank at that step, to show that one rank's exception ends the whole job."""
    spec = os.environ.get("MINIPAR_INJECT_FAILURE")
    if spec and tuple(int(v) for v in spec.split(":")) == (rank, step):
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")


def run_steps(args, layout, grid, cfg, dataset, model, optimizer, engine, start, tp_model=None):
    from minipar.train import forward_backward, pipeline_forward_backward, save_checkpoint, evaluate
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    tokens_per_step = args.batch_size * cfg.seq_len
    flops_per_step = model.flops_per_token() * tokens_per_step
    is_logger = layout.rank == 0
    log = open(args.log_json, "w") if (args.log_json and is_logger) else None
    bar = None
    if not args.quiet and is_logger:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, initial=start, desc="train", unit="step")
    end = min(args.steps, args.stop_at) if args.stop_at is not None else args.steps
    for step in range(start, end):
        optimizer.lr = lr_at(step, args.lr, warmup, args.steps)
        x, y = dataset.batch(args.seed, step, args.batch_size)
        x, y = shard_rows(x, grid.coords.dp, layout.dp), shard_rows(y, grid.coords.dp, layout.dp)
        _inject_failure(step, layout.rank)
        backend.memory.reset_peak()
        if engine is not None:
            grid.pp_comm.barrier()            # a common time origin for the trace
        tp_comm_before = getattr(grid.tp_comm, "blocking_comm_s", 0.0)
        t0 = time.perf_counter()
        if engine is not None:
            local_loss = pipeline_forward_backward(engine, optimizer, x, y)
        else:
            local_loss = forward_backward(model, optimizer, x, y, args.grad_accum)
        norm = optimizer.step(args.grad_clip)
        optimizer.zero_grad()
        t_loss = time.perf_counter()
        loss = _global_loss(grid, local_loss)
        backend.sync()
        t1 = time.perf_counter()
        dt = t1 - t0
        comm = (optimizer.exposed_comm_s + (t1 - t_loss)    # dp sync not hidden, loss
                + getattr(grid.tp_comm, "blocking_comm_s", 0.0) - tp_comm_before)  # tp
        peaks = backend.to_host(all_gather(
            grid.world, backend.to_device(np.array([backend.memory.peak], dtype=np.int64)),
            sizes=[1] * layout.world_size))
        record = {"step": step, "loss": loss, "lr": optimizer.lr, "grad_norm": norm,
                  "tokens_per_s": tokens_per_step / dt, "step_time_s": dt,
                  "comm_time_s": comm, "comm_share": comm / dt,
                  "peak_mem_bytes": int(peaks.max()),
                  "peak_mem_bytes_per_rank": [int(p) for p in peaks],
                  "model_state_bytes": optimizer.memory_bytes()}
        if engine is not None:   # waiting for other stages: the bubble plus the transfers
            record["pipeline_wait_s"] = engine.comm_wait_s
        if optimizer.scaler and optimizer.scaler.enabled:
            record["loss_scale"] = optimizer.last_scale
            record["skipped"] = optimizer.last_skipped
        if args.peak_tflops:
            record["mfu"] = flops_per_step / dt / (args.peak_tflops * 1e12 * layout.world_size)
        if engine is not None and args.trace and step == end - 1:
            record.update(_trace(args, layout, grid, engine))
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
        if bar:
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update(1)
        if args.save and args.save_every and (step + 1) % args.save_every == 0:
            save_checkpoint(args, cfg, optimizer, grid, step + 1, tp_model)
    if bar:
        bar.close()
    if args.save:
        save_checkpoint(args, cfg, optimizer, grid, end, tp_model)
    if args.eval_batches:  # on every rank: tensor-parallel, ZeRO-3, pipelined forwards are collective
        val_loss = _global_loss(grid, evaluate(model, dataset, args, args.eval_batches, grid, engine))
        if is_logger:
            print(f"val loss {val_loss!r} after {end} steps", flush=True)  # every digit: layouts compare
    if log:
        log.close()


def _trace(args, layout, grid, engine):
    """Write the last step's pipeline trace: the stages of the first replica's first
    tensor-parallel rank (one writer); returns its summary."""
    from minipar.parallel.pipeline.trace import gather_spans, summarize, write_trace
    timelines = gather_spans(grid.pp_comm, engine.spans)
    if timelines is None or grid.coords.dp != 0 or grid.coords.tp != 0:
        return {}
    summary = summarize(timelines, args.schedule, layout.pp, layout.microbatches, layout.chunks)
    write_trace(args.trace, timelines, summary)
    return summary
