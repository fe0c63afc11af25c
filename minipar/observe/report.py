"""``python -m minipar report LOG.json [LOG2.json ...] --out DIR``: one HTML page of runs.

Reads the JSON logs ``train --log-json`` writes (format: monitor.py; parsing: runlog.py; one run:
report_runs.py) and draws,
with matplotlib's file-only Agg backend, one PNG per question a run answers:

    loss.png          did it learn?  train loss per step, val loss at the end, runs overlaid,
                      in bits per byte (runs with different tokenizers compare)
    throughput.png    how fast?  tokens/s per step
    loss_cost.png     what did the loss cost?  loss against wall time and against bytes
                      sent between replicas: data parallelism and DiLoCo on one figure
    time_split_K.png  where did each rank's step go?  compute / exposed communication /
                      pipeline wait / optimizer, stacked per rank (mean over the steps
                      after the first, which pays for warm-up)
    memory.png        how full?  peak memory of every rank (tracked arrays, and the
                      process's peak RSS around them), runs side by side
    loss_scale.png    fp16 only: the dynamic loss scale, skipped steps marked
    expert_load_K.png a mixture of experts only: are the experts used evenly?  per MoE
                      layer, max/mean of the tokens its experts received in each step
                      (1: even; E: all on one expert), the dropped share in the legend

A log merged by ``minipar launch`` also holds ``{"event": ...}`` records (a failure, a
hang, a scale-up): the loss and throughput plots mark each one with a dotted line at the
step the job resumed from, and the page lists them.

and ``index.html`` beside them: the figures and a table comparing the runs.  The
table's numbers are the log's own (the ``final`` record, or the step records of a run
stopped before writing one), each cell carrying the exact value in ``data-value``.
Runs are labelled by ``--label``, else the header's layout, else the file name.
"""
from __future__ import annotations

import argparse
import html
import math
import os

from minipar.cli_checks import OneLineParser, output_dir
from minipar.observe.report_runs import SPLIT, _tell_apart, bits_per_byte, read_runs

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("minipar report needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")          # files only: no display, works on any server
    import matplotlib.pyplot as plt
    return plt


def plot_lines(plt, runs, key, ylabel, path, title):
    """Per-step values of ``key``; the loss is drawn in bits per byte."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(runs):
        unit = (lambda v: bits_per_byte(run, v)) if key == "loss" else (lambda v: v)
        points = [(r["step"], unit(r[key])) for r in run.steps if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), color=COLORS[i % len(COLORS)], label=f"{run.label} train"
                    if key == "loss" else run.label)
        val = run.summary().get("val_bits_per_byte") if key == "loss" else None
        if val is not None and run.steps:
            ax.scatter([run.steps[-1]["step"]], [val], marker="*", s=120, zorder=3,
                       color=COLORS[i % len(COLORS)], label=f"{run.label} val {val:.3f}")
    for i, run in enumerate(runs):      # elastic events: where the job resumed
        for e in run.events:
            ax.axvline(e.get("resume_step", 0), color=COLORS[i % len(COLORS)], ls=":", lw=1)
            ax.annotate(_event_label(e), (e.get("resume_step", 0), 1), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=7)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _event_label(e):
    return f"{e.get('what', e.get('kind'))} -> {e.get('world_after', '?')} ranks"


def plot_loss_by_cost(plt, runs, path):
    """Loss against wall time and against bytes sent between replicas, runs overlaid:
    data parallelism at every step, DiLoCo at its outer steps (the mean over groups)."""
    fig, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(11, 4))
    for i, run in enumerate(runs):
        points = run.loss_by_cost()
        if not points:
            continue
        seconds, sent, loss = zip(*points)
        bits = [bits_per_byte(run, v) for v in loss]
        style = dict(color=COLORS[i % len(COLORS)], label=run.label,
                     marker="o" if len(points) < 60 else None, ms=3)
        by_time.plot(seconds, bits, **style)
        by_bytes.plot([b / 2 ** 20 for b in sent], bits, **style)
    by_time.set(xlabel="wall time, s", ylabel="loss, bits / byte", title="loss against wall time")
    by_bytes.set(xlabel="MiB sent between replicas (DiLoCo: between groups)",
                 ylabel="loss, bits / byte", title="loss against bytes sent")
    by_bytes.set_xscale("log")
    for ax in (by_time, by_bytes):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time_split(plt, run, path):
    split = run.time_split()
    fig, ax = plt.subplots(figsize=(max(6, 3 + 0.6 * len(split["step_time_s"])), 4))
    ranks = list(range(len(split["step_time_s"])))
    bottom = [0.0] * len(ranks)
    for key, name, color in SPLIT:
        values = [v * 1e3 for v in split[key]]
        if any(values):
            ax.bar(ranks, values, bottom=bottom, color=color, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    other = [t * 1e3 - b for t, b in zip(split["step_time_s"], bottom)]
    if any(o > 0.01 * t * 1e3 for o, t in zip(other, split["step_time_s"])):   # unaccounted
        ax.bar(ranks, [max(o, 0.0) for o in other], bottom=bottom, color="#bbbbbb", label="other")
    ax.set(xlabel="rank", ylabel="ms per step", title=f"{run.label}: where a step goes",
           xticks=ranks)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(plt, runs, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        peaks, rss = run.peak_memory_per_rank(), run.process_peaks().get("peak")
        if rss:     # what the process held (outline) around what a step's arrays held
            ax.bar([r + i * width for r in range(len(rss))], [p / 2 ** 20 for p in rss], width,
                   fill=False, edgecolor=COLORS[i % len(COLORS)], label=f"{run.label}: process RSS")
        ax.bar([r + i * width for r in range(len(peaks))], [p / 2 ** 20 for p in peaks], width,
               color=COLORS[i % len(COLORS)], label=f"{run.label}: tracked arrays")
    ax.set(xlabel="rank", ylabel="peak MiB", title="peak memory per rank: tracked arrays, process")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss_scale(plt, runs, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(runs):
        points = [(r["step"], r["loss_scale"]) for r in run.steps if r.get("loss_scale")]
        if not points:
            continue
        ax.plot(*zip(*points), color=COLORS[i % len(COLORS)], label=run.label)
        skipped = [(r["step"], r["loss_scale"]) for r in run.steps if r.get("skipped")]
        if skipped:
            ax.scatter(*zip(*skipped), marker="x", color="red", zorder=3,
                       label=f"{run.label}: skipped ({len(skipped)})")
    ax.set_yscale("log", base=2)
    ax.set(xlabel="step", ylabel="loss scale", title="fp16 dynamic loss scale")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_expert_load(plt, run, path):
    """Max/mean expert load per MoE layer over the steps of one run."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (block, points) in enumerate(sorted(run.expert_load().items())):
        steps = [p[0] for p in points]
        ratio = [math.nan if p[1] is None else p[1] for p in points]
        dropped = sum(p[2] for p in points) / len(points)
        ax.plot(steps, ratio, color=COLORS[i % len(COLORS)],
                label=f"block {block}" + (f" (dropped {dropped:.1%})" if dropped else ""))
    ax.axhline(1.0, color="#888888", ls=":", lw=1)
    ax.set(xlabel="step", ylabel="max / mean tokens per expert",
           title=f"{run.label}: expert load per MoE layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# (key, column title, how to show it) — the exact value goes into data-value
COLUMNS = (("steps", "steps", "{:d}"), ("train_loss", "train loss (last)", "{:.4f}"),
           ("train_loss_last10", "train loss (last 10)", "{:.4f}"),
           ("val_loss", "val loss nats/token", "{:.4f}"), ("val_bits_per_byte", "bits/byte", "{:.3f}"),
           ("tokens_per_s", "tokens/s", "{:,.0f}"), ("mfu", "MFU", "{:.2%}"),
           ("comm_share", "comm share", "{:.1%}"), ("peak_mem_bytes", "peak memory (max rank)", None),
           ("peak_rss_bytes", "process peak RSS", None),
           ("construction_rss_bytes", "RSS construction", None), ("save_rss_bytes", "RSS save", None),
           ("train_time_s", "train time s", "{:.1f}"), ("wall_s", "wall s", "{:.1f}"),
           ("skipped_steps", "skipped steps", "{:d}"))


def _cell(value, fmt):
    if value is None:
        return '<td data-value="">&ndash;</td>'
    text = f"{value / 2 ** 20:.1f} MiB" if fmt is None else fmt.format(value)
    return f'<td data-value="{html.escape(repr(value))}">{html.escape(text)}</td>'


def write_html(runs, figures, path):
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in COLUMNS)
    rows = []
    for run in runs:
        s = run.summary()
        cells = "".join(_cell(s.get(key), fmt) for key, _, fmt in COLUMNS)
        rows.append(f'<tr data-log="{html.escape(run.path)}"><th>{html.escape(run.label)}</th>{cells}</tr>')
    notes = "".join(f"<li><b>{html.escape(r.label)}</b>: {html.escape(r.path)}"
                    + (f" &mdash; threads: {html.escape(str(r.header['threads']))}" if "threads" in r.header else "")
                    + (f" &mdash; MFU against {html.escape(str(r.header['mfu_basis']))}" if "mfu_basis" in r.header else "")
                    + "".join(f"<br>event at step {e.get('resume_step')}: {html.escape(_event_label(e))}"
                              for e in r.events)
                    + "</li>" for r in runs)
    imgs = "".join(f'<figure><img src="{name}" alt="{html.escape(caption)}">'
                   f"<figcaption>{html.escape(caption)}</figcaption></figure>" for name, caption in figures)
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>minipar report</title>
<style>body{{font-family:sans-serif;margin:2em;}} table{{border-collapse:collapse;}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right;}} figure{{display:inline-block;margin:1em;}}
img{{max-width:700px;}}</style></head><body>
<h1>minipar report</h1>
<table id="summary"><tr><th>run</th>{head}</tr>
{chr(10).join(rows)}
</table>
<p>Loss in nats per token; bits per byte = nats / ln 2 / (bytes per token), which compares
runs whatever their tokenizer (bytes: 1 byte per token).</p>
<ul>{notes}</ul>
{imgs}
</body></html>
"""
    with open(path, "w") as f:
        f.write(page)


def main(argv=None):
    parser = OneLineParser(prog="python -m minipar report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", help="JSON logs written by train --log-json")
    parser.add_argument("--out", required=True, help="folder for index.html and the PNGs")
    parser.add_argument("--label", action="append", help="a name per log, in order")
    args = parser.parse_args(argv)
    runs = read_runs(args.logs, args.label)
    plt = _plt()                              # matplotlib missing: said before --out is made
    output_dir("--out", args.out)             # before any figure is drawn
    if not args.label:
        _tell_apart(runs)
    figures = [("loss.png", "loss per step (train), val loss at the end"),
               ("throughput.png", "tokens per second")]
    plot_lines(plt, runs, "loss", "loss, bits / byte", os.path.join(args.out, "loss.png"), "loss")
    plot_lines(plt, runs, "tokens_per_s", "tokens / s", os.path.join(args.out, "throughput.png"),
               "throughput")
    if any(run.loss_by_cost() for run in runs):
        plot_loss_by_cost(plt, runs, os.path.join(args.out, "loss_cost.png"))
        figures.append(("loss_cost.png", "loss against wall time and bytes sent between "
                                         "replicas (DiLoCo: between groups, at outer steps)"))
    for i, run in enumerate(runs):
        if run.time_split():
            name = f"time_split_{i + 1}.png"
            plot_time_split(plt, run, os.path.join(args.out, name))
            figures.append((name, f"{run.label}: time split per rank"))
    if any(r.peak_memory_per_rank() for r in runs):
        plot_memory(plt, runs, os.path.join(args.out, "memory.png"))
        figures.append(("memory.png", "peak memory per rank"))
    if any(r.get("loss_scale") for run in runs for r in run.steps):
        plot_loss_scale(plt, runs, os.path.join(args.out, "loss_scale.png"))
        figures.append(("loss_scale.png", "fp16 loss scale and skipped steps"))
    for i, run in enumerate(runs):
        if run.expert_load():
            name = f"expert_load_{i + 1}.png"
            plot_expert_load(plt, run, os.path.join(args.out, name))
            figures.append((name, f"{run.label}: expert load (max/mean) per MoE layer"))
    write_html(runs, figures, os.path.join(args.out, "index.html"))
    print(f"wrote {os.path.join(args.out, 'index.html')} and {len(figures)} figures")
    return 0
