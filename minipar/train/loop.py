"""The step loop: data, forward/backward, the one optimizer step, the log, checkpoints.

    for step k:   batch k = f(seed, k); this replica's rows
                  forward + backward          (train/steps.py)
                  optimizer.step(grad_clip)   (parallel/step.py)
                  the mean loss over the grid, the log line, maybe a checkpoint
    then          the final checkpoint and the validation loss
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from minipar import backend
from minipar.comm import all_reduce
from minipar.optim import lr_at
from minipar.observe.procmem import ProcessMemory
from minipar.train import faults
from minipar.train.balance import Balancer
from minipar.train.errors import Interrupt, TrainingStopped
from minipar.train.saving import Saver, save_checkpoint
from minipar.train.steps import StepHooks, evaluate, global_loss, train_step


class TrainingRun:
    """One training run: the config, the grid, the parallelized model and its optimizer."""

    def __init__(self, config, grid, cfg, dataset, parallel, optimizer, start, n_params=None,
                 process_memory=None):
        self.config, self.grid, self.cfg, self.dataset = config, grid, cfg, dataset
        self.n_params = n_params        # of the whole (plain) model
        self.memory_fit = None          # (PeakEstimate, limit, where) of train/fits.py
        self.bucket_source = "given"    # or "chosen by the performance model" (train.setup)
        self.devices = None             # every rank's GPU on cupy (process/devices.py; train.setup)
        self.parallel, self.optimizer, self.start = parallel, optimizer, start
        self.losses, self.val_loss = [], None
        self.end = min(config.steps, config.stop_at) if config.stop_at is not None else config.steps
        self.outer = None               # DiLoCo's outer loop (parallel/outer; train.setup)
        self.balancer = Balancer(grid, config.batch_size // self.groups, config.grad_accum,
                                 config.balance)
        self.heartbeat = os.environ.get("MINIPAR_HEARTBEAT_DIR")   # set by `minipar launch`
        self.process_memory = process_memory or ProcessMemory()   # peaks per phase (procmem)
        self.saver = Saver(self)        # sharded checkpoints, maybe in the background
        self.hooks = StepHooks()        # attached from outside the step: train/faults.py's
        faults.register(self.hooks, grid.rank)
        if parallel.engine is not None:
            parallel.engine.after_compute = self.hooks.after_compute

    @property
    def model(self):
        return self.parallel.model

    @property
    def groups(self):
        """DiLoCo's groups G (1 without DiLoCo): each trains on 1/G of the global batch."""
        return self.config.diloco_groups if self.config.outer == "diloco" else 1

    def group_rows(self, x):
        """This DiLoCo group's rows of the global batch: group g of G takes the g-th of G
        equal blocks (everything without DiLoCo)."""
        if self.groups == 1:
            return x
        rows, g = x.shape[0] // self.groups, self.outer.groups.group
        return x[g * rows:(g + 1) * rows]

    def step(self, step):
        """One optimizer step; returns (global loss, timings of this rank)."""
        c, grid, engine, opt = self.config, self.grid, self.parallel.engine, self.optimizer
        opt.lr = lr_at(step, c.lr, self.warmup, c.steps)
        x, y = self.dataset.batch(c.seed, step, c.batch_size)
        x, y = self.group_rows(x), self.group_rows(y)               # DiLoCo: this group's
        x, y = self.balancer.my_rows(x), self.balancer.my_rows(y)   # this replica's share
        x, y = self.parallel.local_tokens(x), self.parallel.local_tokens(y)   # cp: my positions
        for hook in self.hooks.before_step:
            hook(step)
        backend.memory.reset_peak()
        self.process_memory.begin("steps")
        if engine is not None:
            grid.pp_comm.barrier()            # a common time origin for the trace
        tp_before = grid.tp_comm.blocking_comm_s
        dp_sent_before = grid.dp_cp_comm.bytes_sent   # the gradient sync's bytes (report)
        t0 = time.perf_counter()
        # --balance times this rank's forward and backward: the loss is read before the
        # update, so that the time is the finished computation's and not its launches'
        result = train_step(self.parallel, opt, x, y, c.grad_accum, c.grad_clip,
                            self.balancer.weight, read_loss_now=c.balance, hooks=self.hooks,
                            before_update=self.saver.before_update)
        t_opt = t0 + result.forward_backward_s
        local, norm = result.local_loss, result.grad_norm
        t_loss = time.perf_counter()
        loss = global_loss(grid, local)
        backend.sync()
        t1 = time.perf_counter()
        tp_comm = grid.tp_comm.blocking_comm_s - tp_before
        comm = opt.exposed_comm_s + (t1 - t_loss) + tp_comm   # dp sync not hidden, loss, tp
        wait = engine.comm_wait_s if engine is not None else 0.0
        held = self.process_memory.record("steps")
        mine = {"step_time_s": t1 - t0, "comm_time_s": comm, "pipeline_wait_s": wait,
                "optimizer_s": max(t_loss - t_opt - opt.exposed_comm_s, 0.0),
                "peak_mem_bytes": backend.memory.peak, "peak_rss_bytes": held["rss"],
                "pool_peak_bytes": held["pool"], "device_used_bytes": held["device"]}
        mine["compute_s"] = max(mine["step_time_s"] - comm - wait - mine["optimizer_s"], 0.0)
        state = opt.memory_bytes()
        if self.outer is not None:      # DiLoCo's θ and momentum count as optimizer state
            state["optimizer"] += self.outer.memory_bytes()
        shared = {"loss": loss, "lr": opt.lr, "grad_norm": norm, "model_state_bytes": state}
        if opt.scaler and opt.scaler.enabled:
            shared.update(loss_scale=result.loss_scale, skipped=result.skipped)
        if c.balance:
            shared["batch_shares"] = list(self.balancer.shares)
        shared.update(opt.sync.stats().comm)   # the comm hook's bytes, this step
        shared["dp_bytes_sent"] = grid.dp_cp_comm.bytes_sent - dp_sent_before   # this rank's
        if self.outer is not None:             # DiLoCo: the outer step, when due
            shared.update(self.outer.after_step(step, loss))
        self.balancer.record(step, t_opt - t0)
        return shared, mine

    def loop(self):
        c = self.config
        self.warmup = c.warmup if c.warmup is not None else max(1, c.steps // 10)
        self.monitor = self._monitor()
        self.monitor.start()
        try:
            with Interrupt() as interrupt:
                for step in range(self.start, self.end):
                    self._one_step(step)
                    self.saver.poll()           # a background save done everywhere: commit it
                    if self._interrupted(interrupt):
                        self._stop_interrupted(step + 1)
                    if c.save and c.save_every and (step + 1) % c.save_every == 0:
                        save_checkpoint(self, step + 1)
        except TrainingStopped:
            self._finish_background_save()
            self.monitor.finish(None)           # the steps that were done, and their log
            raise
        saved_last = c.save_every and self.end % c.save_every == 0   # by the loop, just now
        if c.save and not saved_last:
            save_checkpoint(self, self.end)
        self.saver.wait()
        if c.eval_batches:   # on every rank: tp, ZeRO-3 and pipelined forwards are collective
            self.val_loss = global_loss(self.grid, evaluate(self.parallel, self.dataset, c, self.grid))
        pm = self.process_memory
        self.monitor.process_memory(pm.vector(), pm.exact, pm.floor, self._predicted_peak(pm.floor))
        if self.memory_fit is not None and self.monitor.process:    # rank 0: beside the check's
            self.monitor.process["checked_peak_bytes"] = int(self.memory_fit[0].total)
        self.monitor.finish(self.val_loss)
        if self.val_loss is not None and self.grid.rank == 0:
            print(f"val loss {self.val_loss!r} after {self.end} steps", flush=True)  # every digit

    def _finish_background_save(self):
        """Stopping: a save still being written is finished (and committed) first; the
        reason for stopping stays the one reported."""
        try:
            self.saver.wait()
        except TrainingStopped:
            pass

    def _predicted_peak(self, floor):
        """The memory model's process peak for this rank (``train/fits.py``, with the
        runtime floor this process measured before construction; NaN if it cannot say)."""
        from minipar.train.fits import predicted_peak
        c = self.grid.coords
        try:
            return float(predicted_peak(self.config, runtime=floor, coords=(c.dp, c.tp, c.pp)).total)
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            return math.nan

    def _one_step(self, step):
        try:
            with np.errstate(all="ignore"):   # non-finite values are caught below
                shared, mine = self.step(step)
        except FloatingPointError as err:     # agreed: the norm is global
            raise TrainingStopped(f"step {step}: {err}; nothing was updated or saved "
                                  "(lower --lr, or use --grad-clip)") from None
        self.losses.append(shared["loss"])
        if not math.isfinite(shared["loss"]):  # agreed: the loss is global
            raise TrainingStopped(f"step {step}: the loss is {shared['loss']}; stopping "
                                  "before a non-finite state is saved (lower --lr)")
        engine = self.parallel.engine
        extra = _trace(self) if engine is not None and self.config.trace and step == self.end - 1 else None
        if engine is None:
            mine["pipeline_wait_s"] = None      # not a pipeline run: no such column
        self.monitor.step(step, shared=shared, mine=mine, extra=extra)
        if self.heartbeat:
            _beat(self.heartbeat, self.grid.rank, step)

    def _monitor(self):
        from minipar.observe.expert_load import ExpertLoadLog
        from minipar.observe.monitor import RunMonitor
        c, grid = self.config, self.grid
        tokens = c.batch_size * self.cfg.seq_len
        header = dict(layout=c.layout_name(), params=self.n_params, tokens_per_step=tokens,
                      batch_size=c.batch_size, seq_len=self.cfg.seq_len, backend=backend.backend_name(),
                      precision=c.precision, config=c.to_dict(), vocab_size=self.cfg.vocab_size,
                      bytes_per_token=self.dataset.bytes_per_token)
        if c.zero < 3 and grid.dp_cp_comm.size > 1:    # buckets exist: say their size
            header.update(bucket_mb=c.bucket_mb, bucket_source=self.bucket_source)
        if self.devices:                               # rank -> host, GPU, bus id
            header.update(gpus=[vars(p) for p in self.devices])
        if self.memory_fit is not None:                # what the memory model predicted
            peak, limit, _ = self.memory_fit
            header.update(predicted_peak_bytes=peak.total, mem_limit_bytes=limit)
        return RunMonitor(grid.world, rank=grid.rank, world_size=grid.world.size, header=header,
                          flops_per_step=self.parallel.module.flops_per_token() * tokens,
                          peak_tflops=c.peak_tflops, log_path=c.log_json, progress=not c.quiet,
                          total_steps=c.steps, start_step=self.start,
                          expert_load=ExpertLoadLog.of(self.parallel.module, self.cfg,
                                                       grid.coords.tp == 0 or c.sequence_parallel))

    def _interrupted(self, interrupt):
        """Did Ctrl-C reach any rank?  OR-ed over the world once per step, so all agree."""
        flag = np.array([1.0 if interrupt.requested else 0.0])
        if self.grid.world.size > 1:
            flag = backend.to_host(all_reduce(self.grid.world, backend.to_device(flag), op="max"))
        return bool(flag[0] > 0)

    def _stop_interrupted(self, done):
        saved = ""
        if self.config.save:
            save_checkpoint(self, done)
            saved = f"; checkpoint of step {done} saved: continue with --resume {self.config.save}"
        raise TrainingStopped(f"interrupted after step {done}{saved}", code=130)


def _beat(directory, rank, step):
    """A heartbeat for the elastic supervisor: ``DIR/rank<R>`` holds the last step done
    (written to a temporary name and renamed, so a reader never sees half a number)."""
    path = os.path.join(directory, f"rank{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{step + 1} {time.time():.3f}\n")
    os.replace(path + ".tmp", path)


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
