"""What a training run tells you: a header, a progress bar, a JSON log, a summary.

Every rank measures its own step - how long it took, how much of it was compute,
exposed communication, waiting for other pipeline stages and the optimizer, its
memory peak - and :meth:`RunMonitor.step` gathers those few numbers to rank 0 in
ONE small collective (an ``MPI_Gather`` of a fixed-order float64 vector), so a
straggler or a rank short of memory shows up in the log, not just rank 0's view.

MFU (model FLOPs utilisation) = model FLOPs per step / step time / peak FLOP/s of
all ranks.  The peak is ``peak_tflops`` per rank when given; otherwise this
machine's measured float32 GEMM rate, timed once at start on every rank at the
same moment (so ranks sharing cores each measure their share) - the log says which.

The log (``log_path``, written by rank 0) has one JSON object per line: a ``header``, one
record per step (with ``per_rank``: each rank's own numbers), a ``final`` summary.  Every key
and unit is described in one place, ``docs/log-format.md``; ``runlog.py`` reads it.

Loss is in nats per token.  Bits per byte compare runs whatever their tokens:
bits/byte = nats/token / ln 2 / (bytes per token), with the header's ``bytes_per_token``
(the validation text's bytes over its tokens; 1 when the tokens are bytes).  Step records
carry ``bits_per_byte``; the final record ``train_bits_per_byte`` and ``val_bits_per_byte``.
Off a terminal (a log file) the progress bar is one line every few seconds (progress.py).
"""
from __future__ import annotations

import json
import math
import sys
import time

import numpy as np

from minipar.observe import monitor_text, procmem
from minipar.observe.resources import _nvml_handle, measure_gemm_flops, memory_budget_bytes
from minipar.process.threads import describe_threads

MINE = ("step_time_s", "compute_s", "comm_time_s", "pipeline_wait_s", "optimizer_s",
        "peak_mem_bytes", "peak_rss_bytes", "device_util",   # the gathered vector, in this
        "pool_peak_bytes", "device_used_bytes")    # order; the last two on CuPy (procmem.py)


class _Watched:
    """What the watchdog needs of a communicator (``mpi``, ``size``, ``hang_timeout``),
    for the monitor's plain mpi4py communicator."""

    def __init__(self, mpi):
        from minipar.comm import watchdog
        self.mpi, self.size = mpi, mpi.Get_size()
        self.hang_timeout = watchdog.get_hang_timeout()


def bits(nats):
    """nats -> bits: divide by ln 2."""
    return nats / math.log(2)


class RunMonitor:
    """Header, per-step log and summary of one run.  ``start`` and ``step`` are
    collective (every rank of ``world_comm`` calls them); rank 0 prints and writes."""

    def __init__(self, world_comm, *, rank=0, world_size=1, header, flops_per_step,
                 peak_tflops=None, log_path=None, progress=True, total_steps=None,
                 start_step=0, out=None, expert_load=None):
        self.mpi = getattr(world_comm, "mpi", world_comm)   # minipar Communicator or mpi4py
        self.rank, self.world_size = rank, world_size
        self.header = dict(header)
        self.tokens_per_step = self.header["tokens_per_step"]
        self.samples_per_step = self.header.get("batch_size") or (
            self.tokens_per_step / self.header["seq_len"] if "seq_len" in self.header else 0)
        self.flops_per_step, self.peak_tflops = flops_per_step, peak_tflops
        self.log_path, self.progress = log_path, progress
        self.total_steps, self.start_step = total_steps, start_step
        self.out = out or sys.stdout
        self.expert_load = expert_load      # an ExpertLoadLog (expert_load.py), or None
        self.records, self.log, self.bar = [], None, None
        self.process = None         # per-phase process peaks, once gathered
        self.nvml = _nvml_handle()
        self.bytes_per_token = float(self.header.get("bytes_per_token") or 1.0)
        self.loss_unit = "nats/byte" if self.bytes_per_token == 1.0 else "nats/token"

    def bits_per_byte(self, nats):
        """nats/token -> bits/byte: / ln 2 / (bytes per token)."""
        return None if nats is None else bits(nats) / self.bytes_per_token

    # ------------------------------------------------------------------ collective
    def _gather(self, values):
        """Rank 0 gets a (world_size, len(values)) array; the others get None."""
        mine = np.asarray(values, dtype=np.float64)
        if self.mpi is None or self.world_size == 1:
            return mine[None, :]
        from minipar.comm import watchdog
        everyone = np.empty((self.world_size, mine.size)) if self.rank == 0 else None
        # under the hang watchdog like every wait on a peer: rank 0 waits here for every
        # rank's numbers, and a stopped rank must end the job, not hang it
        peer = None if self.rank == 0 else 0
        rec = watchdog.begin(_Watched(self.mpi), peer, "the monitor's gather of step timings") \
            if watchdog.get_hang_timeout() is not None else None
        try:
            self.mpi.Gather(mine, everyone, root=0)
        finally:
            if rec is not None:
                watchdog.end(rec)
        return everyone

    def start(self):
        """Measure this machine (if needed) and print the header; writes the log's first line."""
        if self.mpi is not None and self.world_size > 1:
            self.mpi.Barrier()                 # measure together: ranks share the cores
        rate = self.peak_tflops * 1e12 if self.peak_tflops else measure_gemm_flops()
        facts = self._gather([rate, memory_budget_bytes()])
        self.t_start = time.perf_counter()
        if self.rank != 0:
            return
        self.peak_flops = facts[:, 0]
        self.mem_budget = facts[:, 1]
        if self.peak_tflops:
            self.mfu_basis = f"peak-tflops {self.peak_tflops:g} per rank"
        else:
            self.mfu_basis = f"measured GEMM rate {self.peak_flops.mean() / 1e9:.1f} GFLOP/s per rank"
        self.header.update(world_size=self.world_size, threads=describe_threads(),
                           flops_per_step=self.flops_per_step, mfu_basis=self.mfu_basis,
                           peak_flops_per_rank=self.peak_flops.tolist(),
                           mem_budget_bytes_per_rank=self.mem_budget.tolist(),
                           total_steps=self.total_steps, start_step=self.start_step,
                           time=time.time())
        for line in monitor_text.header_lines(self):
            self._print(line)
        if self.log_path:
            self.log = open(self.log_path, "w")
            self._write({"header": self.header})
        if self.progress:
            from minipar.observe.progress import progress
            self.bar = progress(total=self.total_steps, initial=self.start_step, desc="train",
                                unit="step", file=self.out)

    def step(self, step, *, shared, mine, extra=None):
        """Gather ``mine`` (this rank's times and memory) to rank 0, which logs one
        record with ``shared`` (the same on every rank: loss, lr, ...).  Returns the
        record on rank 0, None elsewhere."""
        mine = dict(mine)
        wait = mine.get("pipeline_wait_s")
        if mine.get("compute_s") is None:      # whatever is not waiting is computing
            mine["compute_s"] = max(0.0, mine["step_time_s"] - sum(
                mine.get(k) or 0.0 for k in ("comm_time_s", "pipeline_wait_s", "optimizer_s")))
        if self.nvml is not None:
            import pynvml
            mine["device_util"] = pynvml.nvmlDeviceGetUtilizationRates(self.nvml).gpu / 100
        values = [mine.get(k) if mine.get(k) is not None else math.nan for k in MINE]
        if self.expert_load is not None:
            values += self.expert_load.vector()
        rows = self._gather(values)
        if self.rank != 0:
            return None
        record = self._record(step, shared, rows[:, :len(MINE)], wait is not None)
        if self.expert_load is not None:
            record["experts"] = self.expert_load.fields(rows[:, len(MINE):])
        record.update(extra or {})
        self.records.append(record)
        if self.log:
            self._write(record)
        if self.bar:
            self.bar.set_postfix_str(f"loss {record['loss']:.3f} ({record['bits_per_byte']:.2f} bpb)"
                                     f" | {record['tokens_per_s']:,.0f} tok/s")
            self.bar.update(1)
        return record

    # ------------------------------------------------------------------ rank 0 only
    def _record(self, step, shared, rows, pipelined):
        per = {k: rows[:, i] for i, k in enumerate(MINE)}
        for k in ("comm_time_s", "pipeline_wait_s", "optimizer_s"):
            per[k] = np.nan_to_num(per[k])
        dt = float(per["step_time_s"].max())      # the step ends with the slowest rank
        with np.errstate(divide="ignore", invalid="ignore"):
            per["compute_share"] = per["compute_s"] / per["step_time_s"]
            per["comm_share"] = per["comm_time_s"] / per["step_time_s"]
        per["mem_share"] = np.where(self.mem_budget > 0, per["peak_mem_bytes"] /
                                    np.maximum(self.mem_budget, 1), math.nan)
        record = {"step": step}
        record.update({k: _plain(v) for k, v in shared.items() if v is not None})
        if "loss" in record:
            record["bits_per_byte"] = self.bits_per_byte(record["loss"])
        record.update(step_time_s=dt, tokens_per_s=self.tokens_per_step / dt,
                      samples_per_s=self.samples_per_step / dt,
                      comm_time_s=float(per["comm_time_s"].mean()),
                      comm_share=float(per["comm_share"].mean()))
        if pipelined:
            record["pipeline_wait_s"] = float(per["pipeline_wait_s"].mean())
        peaks = [int(p) for p in per["peak_mem_bytes"]]
        record.update(peak_mem_bytes=max(peaks), peak_mem_bytes_per_rank=peaks,
                      mfu=self.flops_per_step / dt / float(self.peak_flops.sum()),
                      mfu_basis=self.mfu_basis)
        keys = [k for k in MINE if k != "device_util"] + ["compute_share", "comm_share", "mem_share"]
        if not np.isnan(per["device_util"]).all():
            keys.append("device_util")
        record["per_rank"] = {k: [_plain(v) for v in per[k]] for k in keys}
        record["per_rank"]["peak_mem_bytes"] = peaks
        if not np.isnan(per["peak_rss_bytes"]).all():    # the process's own peak (procmem)
            rss = [int(v) for v in np.nan_to_num(per["peak_rss_bytes"])]
            record.update(peak_rss_bytes=max(rss), peak_rss_bytes_per_rank=rss)
        return record

    def process_memory(self, vector, exact=True, floor=0.0, predicted=math.nan):
        """Collective: gather every rank's per-phase peaks (``ProcessMemory.vector``), its
        runtime floor and the memory model's figure (train/fits.py) for it, for the summary."""
        rows = self._gather(list(vector) + [1.0 if exact else 0.0, floor, predicted])
        if self.rank == 0:
            self.process = procmem.summarize(rows[:, :-3].tolist(), bool(rows[:, -3].all()),
                                             rows[:, -2].tolist(), rows[:, -1].tolist())

    def finish(self, val_loss=None):
        """Rank 0 prints the summary and writes the ``final`` record; closes the log."""
        if self.rank != 0:
            return None
        if self.bar:
            self.bar.close()
            self.bar = None
        final = self.summary(val_loss)
        for line in monitor_text.summary_lines(self, final):
            self._print(line)
        if self.log:
            self._write({"final": final})
            self.log.close()
            self.log = None
        return final

    def summary(self, val_loss=None):
        """The run's figures over the steps logged so far."""
        recs = self.records
        time_s = sum(r["step_time_s"] for r in recs)
        losses = [r["loss"] for r in recs if "loss" in r]
        peaks = [int(max(col)) for col in zip(*(r["peak_mem_bytes_per_rank"] for r in recs))]
        return {
            "steps": len(recs),
            "train_loss": losses[-1] if losses else None,
            "train_loss_last10": float(np.mean(losses[-10:])) if losses else None,
            "val_loss": None if val_loss is None else float(val_loss),
            "train_bits_per_byte": self.bits_per_byte(losses[-1] if losses else None),
            "val_bits_per_byte": None if val_loss is None else self.bits_per_byte(float(val_loss)),
            "wall_s": time.perf_counter() - self.t_start,
            "tokens_per_s": self.tokens_per_step * len(recs) / time_s if time_s else None,
            "mfu": self.flops_per_step * len(recs) / time_s / float(self.peak_flops.sum())
            if time_s else None,
            "mfu_basis": self.mfu_basis,
            "comm_share": sum(r["comm_share"] * r["step_time_s"] for r in recs) / time_s
            if time_s else None,   # the steps' shares, weighted by their length
            "peak_mem_bytes_per_rank": peaks,
            "peak_rss_bytes_per_rank": (self.process or {}).get("peak_rss_bytes_per_rank") or [
                max((int(v) for v in col if v is not None), default=None)   # the steps' only
                for col in zip(*(r["per_rank"]["peak_rss_bytes"] for r in recs))],
            "mem_share_per_rank": [p / b if b else None for p, b in zip(peaks, self.mem_budget)],
            "skipped_steps": sum(int(r.get("skipped") or 0) for r in recs),
            "process_memory": self.process,   # peak RSS (+ CuPy pool) per phase and rank
        }

    def _write(self, obj):
        self.log.write(json.dumps(obj) + "\n")
        self.log.flush()

    def _print(self, text):
        print(text, file=self.out, flush=True)

def _plain(v):
    """JSON-ready: NumPy scalars to Python numbers, NaN to None."""
    v = v.item() if isinstance(v, np.generic) else v
    return None if isinstance(v, float) and math.isnan(v) else v
