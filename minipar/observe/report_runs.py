"""The runs ``report`` draws: a ``train --log-json`` file read into a ``LoggedRun``.

A LoggedRun holds the log's header, step records, events (a merged ``launch`` log's failures and
restarts) and final figures, and answers the report's questions of one run: the table row
(``summary``), each rank's time split, the peak memory per rank, the loss in bits per byte,
a mixture of experts' load per layer.
``read_runs`` turns the command line's logs into Runs or one clear line.
"""
from __future__ import annotations

import math
import os

from minipar.cli_checks import CommandError, input_file

# what a rank's step time is made of, as the log's keys name it (with a label and a colour)
SPLIT = (("compute_s", "compute", "#4c72b0"), ("comm_time_s", "exposed communication", "#dd8452"),
         ("pipeline_wait_s", "pipeline wait", "#c44e52"), ("optimizer_s", "optimizer", "#55a868"))


class LoggedRun:
    """One log: its header (may be empty), step records and final figures."""

    def __init__(self, path, label=None):
        from minipar.observe.runlog import read_log_events
        self.path = path
        header, self.steps, self.events, self.final = read_log_events(path)
        self.header = header or {}
        name = os.path.splitext(os.path.basename(path))[0]
        self.label = label or self.header.get("layout") or name
        self.name = name

    def column(self, key):
        return [r.get(key) for r in self.steps]

    def summary(self):
        """The table row: the final record's figures, or the same computed from the steps."""
        f = dict(self.final or {})
        steps, time_s = self.steps, sum(r.get("step_time_s", 0.0) for r in self.steps)
        losses = [r["loss"] for r in steps if r.get("loss") is not None]

        def weighted(key):     # a per-step rate over the run: weighted by step length
            pairs = [(r[key], r.get("step_time_s") or 0.0) for r in steps if r.get(key) is not None]
            total = sum(t for _, t in pairs)
            if not pairs:
                return None
            return sum(v * t for v, t in pairs) / total if total else sum(v for v, _ in pairs) / len(pairs)
        f.setdefault("steps", len(steps))
        f.setdefault("train_loss", losses[-1] if losses else None)
        f.setdefault("train_loss_last10", sum(losses[-10:]) / len(losses[-10:]) if losses else None)
        f.setdefault("val_loss", None)
        if f.get("val_bits_per_byte") is None and f["val_loss"] is not None:
            f["val_bits_per_byte"] = bits_per_byte(self, f["val_loss"])
        f.setdefault("tokens_per_s", weighted("tokens_per_s"))
        f.setdefault("mfu", weighted("mfu"))
        f.setdefault("comm_share", weighted("comm_share"))
        f.setdefault("wall_s", None)
        f.setdefault("skipped_steps", sum(int(r.get("skipped") or 0) for r in steps))
        f["train_time_s"] = time_s
        f["peak_mem_bytes"] = max(self.peak_memory_per_rank() or [None])
        for phase, ranks in self.process_peaks().items():    # the process's own (procmem)
            f[f"{phase}_rss_bytes"] = max(ranks)
        return f

    def process_peaks(self):
        """{"peak" | "construction" | "steps" | "save": [peak RSS per rank]} (or {})."""
        process = (self.final or {}).get("process_memory") or {}
        out = {name: figures["rss"] for name, figures in process.get("phases", {}).items()}
        per = [r["peak_rss_bytes_per_rank"] for r in self.steps if r.get("peak_rss_bytes_per_rank")]
        if per and "steps" not in out:
            out["steps"] = [max(col) for col in zip(*per)]
        if out:
            out["peak"] = [max(col) for col in zip(*out.values())]
        return out

    def peak_memory_per_rank(self):
        if self.final and self.final.get("peak_mem_bytes_per_rank"):
            return self.final["peak_mem_bytes_per_rank"]
        per = [r.get("peak_mem_bytes_per_rank") or [r["peak_mem_bytes"]]
               for r in self.steps if r.get("peak_mem_bytes_per_rank") or r.get("peak_mem_bytes")]
        return [max(col) for col in zip(*per)] if per else []

    def expert_load(self):
        """{block: [(step, max/mean load, dropped share)]} of a mixture-of-experts run's
        MoE layers (the step records' ``experts``, ``expert_load.py``), or {} if dense."""
        out = {}
        for r in self.steps:
            for layer in r.get("experts") or ():
                out.setdefault(layer["block"], []).append(
                    (r["step"], layer["load_max_mean"], layer["dropped_share"]))
        return out

    def loss_by_cost(self):
        """[(wall seconds, bytes sent between replicas, loss)] at the steps where every
        replica agrees on the model: each step of data parallelism (bytes: rank 0's
        gradient sync times the ranks — in a ring all-reduce every rank sends the same),
        each outer step of DiLoCo (``loss_global``, the mean over groups; bytes: what
        every rank sent across groups).  Cumulative from the first step; empty for a
        log without those fields."""
        points, seconds, sent = [], 0.0, 0
        ranks = self.header.get("world_size") or len(self.steps[0].get("peak_mem_bytes_per_rank", [1]))
        diloco = any("outer_step" in r for r in self.steps)
        for r in self.steps:
            seconds += r.get("step_time_s", 0.0)
            if diloco:
                sent += r.get("outer_bytes", 0)
                if r.get("outer_step"):
                    points.append((seconds, sent, r["loss_global"]))
            elif "dp_bytes_sent" in r:
                sent += r["dp_bytes_sent"] * ranks
                points.append((seconds, sent, r["loss"]))
        return points

    def time_split(self):
        """{key: [mean seconds per rank]} over the steps after the first; a log without
        ``per_rank`` gives one bar from its whole-run figures."""
        steps = self.steps[1:] if len(self.steps) > 1 else self.steps
        if not steps:
            return {}
        if all("per_rank" in r for r in steps):
            n = len(steps[-1]["per_rank"]["step_time_s"])      # an elastic run: its last size
            steps = [r for r in steps if len(r["per_rank"]["step_time_s"]) == n]
            mean = lambda key: [sum((r["per_rank"].get(key) or [0.0] * n)[i] or 0.0  # noqa: E731
                                    for r in steps) / len(steps) for i in range(n)]
            return {key: mean(key) for key in ("step_time_s",) + tuple(k for k, _, _ in SPLIT)}
        avg = lambda key: [sum(r.get(key) or 0.0 for r in steps) / len(steps)]  # noqa: E731
        split = {key: avg(key) for key in ("step_time_s", "comm_time_s", "pipeline_wait_s")}
        split["optimizer_s"] = [0.0]
        split["compute_s"] = [max(0.0, split["step_time_s"][0] - split["comm_time_s"][0]
                                  - split["pipeline_wait_s"][0])]
        return split


def _tell_apart(runs):
    """Runs of the same layout: add the precision if that tells them apart, else the file."""
    for extra in (lambda r: r.header.get("precision"), lambda r: f"({r.name})"):
        labels = [r.label for r in runs]
        dupes = [r for r in runs if labels.count(r.label) > 1]
        tags = [extra(r) for r in dupes]
        if dupes and all(tags) and len(set(tags)) == len(tags):
            for r, tag in zip(dupes, tags):
                r.label = f"{r.label} {tag}"


def bits_per_byte(run, nats):
    """A run's loss in bits per byte (nats/token / ln 2 / bytes per token), the unit in
    which runs with different tokenizers compare."""
    return nats / math.log(2) / float(run.header.get("bytes_per_token") or 1.0)


def read_runs(logs, labels=None):
    """A LoggedRun per log, or CommandError (one line): a label count that does not match, a
    missing or unreadable file, a line that is not JSON, a log without step records."""
    if labels and len(labels) != len(logs):
        raise CommandError(f"{len(labels)} --label for {len(logs)} logs: give one per log")
    runs = []
    for i, path in enumerate(logs):
        input_file("LOG", path)
        try:
            run = LoggedRun(path, (labels or [None] * len(logs))[i])
        except (ValueError, UnicodeDecodeError) as err:
            raise CommandError(f"LOG {path}: not a train --log-json file ({err})") from None
        if not run.steps:
            raise CommandError(f"LOG {path}: no step records (not a train --log-json file?)")
        runs.append(run)
    return runs
