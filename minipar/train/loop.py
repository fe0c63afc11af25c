"""The step loop: data, forward/backward, the one optimizer step, the log, checkpoints.

    for step k:   batch k = f(seed, k); this replica's rows
                  forward + backward          (train/steps.py)
                  optimizer.step(grad_clip)   (parallel/step.py)
                  the mean loss over the grid, the log line, maybe a checkpoint
    then          the final checkpoint and the validation loss
"""
from __future__ import annotations

import json
import math
import os
import time

import numpy as np

from minipar import backend
from minipar.comm import all_gather, all_reduce
from minipar.data import shard_rows
from minipar.optim import lr_at
from minipar.train.errors import Interrupt, TrainingStopped
from minipar.train.saving import save_checkpoint
from minipar.train.steps import evaluate, forward_backward, global_loss, pipeline_forward_backward


def _inject_failure(step, rank):
    """Fault injection for tests: MINIPAR_INJECT_FAILURE="RANK:STEP" raises on that
    rank at that step, to show that one rank's exception ends the whole job."""
    spec = os.environ.get("MINIPAR_INJECT_FAILURE")
    if spec and tuple(int(v) for v in spec.split(":")) == (rank, step):
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")


class Run:
    """One training run: the config, the grid, the parallelized model and its optimizer."""

    def __init__(self, config, grid, cfg, dataset, parallel, optimizer, start):
        self.config, self.grid, self.cfg, self.dataset = config, grid, cfg, dataset
        self.parallel, self.optimizer, self.start = parallel, optimizer, start
        self.losses, self.val_loss = [], None
        self.end = min(config.steps, config.stop_at) if config.stop_at is not None else config.steps

    @property
    def model(self):
        return self.parallel.model

    def step(self, step):
        """One optimizer step; returns (global loss, timings of this rank)."""
        c, grid, engine, opt = self.config, self.grid, self.parallel.engine, self.optimizer
        opt.lr = lr_at(step, c.lr, self.warmup, c.steps)
        x, y = self.dataset.batch(c.seed, step, c.batch_size)
        x, y = shard_rows(x, grid.coords.dp, grid.dp), shard_rows(y, grid.coords.dp, grid.dp)
        _inject_failure(step, grid.rank)
        backend.memory.reset_peak()
        if engine is not None:
            grid.pp_comm.barrier()            # a common time origin for the trace
        tp_before = getattr(grid.tp_comm, "blocking_comm_s", 0.0)
        t0 = time.perf_counter()
        if engine is not None:
            local = pipeline_forward_backward(engine, opt, x, y)
        else:
            local = forward_backward(self.parallel.model, opt, x, y, c.grad_accum)
        t_opt = time.perf_counter()
        norm = opt.step(c.grad_clip)
        t_loss = time.perf_counter()
        loss = global_loss(grid, local)
        backend.sync()
        t1 = time.perf_counter()
        tp_comm = getattr(grid.tp_comm, "blocking_comm_s", 0.0) - tp_before
        comm = opt.exposed_comm_s + (t1 - t_loss) + tp_comm   # dp sync not hidden, loss, tp
        wait = engine.comm_wait_s if engine is not None else 0.0
        mine = {"step_time_s": t1 - t0, "comm_time_s": comm, "pipeline_wait_s": wait,
                "optimizer_s": max(t_loss - t_opt - opt.exposed_comm_s, 0.0),
                "peak_mem_bytes": backend.memory.peak}
        mine["compute_s"] = max(mine["step_time_s"] - comm - wait - mine["optimizer_s"], 0.0)
        shared = {"loss": loss, "lr": opt.lr, "grad_norm": norm,
                  "model_state_bytes": opt.memory_bytes()}
        if opt.scaler and opt.scaler.enabled:
            shared.update(loss_scale=opt.last_scale, skipped=opt.last_skipped)
        return shared, mine

    def loop(self):
        c = self.config
        self.warmup = c.warmup if c.warmup is not None else max(1, c.steps // 10)
        self.log = _Log(self)
        with Interrupt() as interrupt:
            for step in range(self.start, self.end):
                try:
                    with np.errstate(all="ignore"):   # non-finite values are caught below
                        shared, mine = self.step(step)
                except FloatingPointError as err:     # agreed: the norm is global
                    self.log.close_bar()
                    raise TrainingStopped(f"step {step}: {err}; nothing was updated or saved "
                                          "(lower --lr, or use --grad-clip)") from None
                self.losses.append(shared["loss"])
                if not math.isfinite(shared["loss"]):  # agreed: the loss is global
                    self.log.close_bar()
                    raise TrainingStopped(f"step {step}: the loss is {shared['loss']}; stopping "
                                          "before a non-finite state is saved (lower --lr)")
                self.log.step(step, shared, mine)
                if self._interrupted(interrupt):
                    self._stop_interrupted(step + 1)
                if c.save and c.save_every and (step + 1) % c.save_every == 0:
                    save_checkpoint(self, step + 1)
        self.log.close_bar()
        if c.save:
            save_checkpoint(self, self.end)
        if c.eval_batches:   # on every rank: tp, ZeRO-3 and pipelined forwards are collective
            self.val_loss = global_loss(self.grid, evaluate(self.parallel, self.dataset, c, self.grid))
        self.log.finish(self.val_loss)


    def _interrupted(self, interrupt):
        """Did Ctrl-C reach any rank?  OR-ed over the world once per step, so all agree."""
        flag = np.array([1.0 if interrupt.requested else 0.0])
        if self.grid.world.size > 1:
            flag = backend.to_host(all_reduce(self.grid.world, backend.to_device(flag), op="max"))
        return bool(flag[0] > 0)

    def _stop_interrupted(self, done):
        self.log.close_bar()
        saved = ""
        if self.config.save:
            save_checkpoint(self, done)
            saved = f"; checkpoint of step {done} saved: continue with --resume {self.config.save}"
        raise TrainingStopped(f"interrupted after step {done}{saved}", code=130)


class _Log:
    """The per-step JSON log and the progress bar (rank 0 writes)."""

    def __init__(self, run):
        c, self.run = run.config, run
        self.is_logger = run.grid.rank == 0
        self.file = open(c.log_json, "w") if (c.log_json and self.is_logger) else None
        self.bar = None
        self.tokens_per_step = c.batch_size * run.cfg.seq_len
        module = run.parallel.module
        self.flops_per_step = module.flops_per_token() * self.tokens_per_step
        if not c.quiet and self.is_logger:
            from tqdm import tqdm
            self.bar = tqdm(total=c.steps, initial=run.start, desc="train", unit="step")

    def step(self, step, shared, mine):
        run, c, grid = self.run, self.run.config, self.run.grid
        dt, comm = mine["step_time_s"], mine["comm_time_s"]
        peaks = backend.to_host(all_gather(
            grid.world, backend.to_device(np.array([mine["peak_mem_bytes"]], dtype=np.int64)),
            sizes=[1] * grid.world.size))
        record = {"step": step, **shared, "tokens_per_s": self.tokens_per_step / dt,
                  "step_time_s": dt, "comm_time_s": comm, "comm_share": comm / dt,
                  "peak_mem_bytes": int(peaks.max()),
                  "peak_mem_bytes_per_rank": [int(p) for p in peaks]}
        engine = run.parallel.engine
        if engine is not None:   # waiting for other stages: the bubble plus the transfers
            record["pipeline_wait_s"] = mine["pipeline_wait_s"]
        if c.peak_tflops:
            record["mfu"] = self.flops_per_step / dt / (c.peak_tflops * 1e12 * grid.world.size)
        if engine is not None and c.trace and step == run.end - 1:
            record.update(_trace(run))
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.bar:
            self.bar.set_postfix(loss=f"{shared['loss']:.4f}")
            self.bar.update(1)

    def close_bar(self):
        if self.bar:
            self.bar.close()

    def finish(self, val_loss):
        if val_loss is not None and self.is_logger:
            print(f"val loss {val_loss!r} after {self.run.end} steps", flush=True)
        if self.file:
            self.file.close()


def _trace(run):
    """Write the last step's pipeline trace: the stages of the first replica's first
    tensor-parallel rank (one writer); returns its summary."""
    from minipar.parallel.pipeline.trace import gather_spans, summarize, write_trace
    c, grid, engine = run.config, run.grid, run.parallel.engine
    timelines = gather_spans(grid.pp_comm, engine.spans)
    if timelines is None or grid.coords.dp != 0 or grid.coords.tp != 0:
        return {}
    summary = summarize(timelines, c.schedule, c.pp, c.microbatches, c.chunks)
    write_trace(c.trace, timelines, summary)
    return summary
