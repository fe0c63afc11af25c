"""What a run prints for a person: the header before the first step and the summary after
the last (``monitor.RunMonitor`` writes the JSON log; these are its lines of text)."""
from __future__ import annotations

import os

from minipar import backend
from minipar.observe import procmem


def fmt_bytes(n):
    return f"{n / 2 ** 20:.1f} MiB"


def header_lines(m):
    """The run's header: layout, parameters, ranks, tokens per step, threads, MFU basis
    (``m``: the RunMonitor)."""
    h = m.header
    params = f" | {h['params'] / 1e6:.2f}M parameters" if h.get("params") else ""
    lines = [f"minipar train | layout {h.get('layout', '?')}{params} | "
             f"{m.world_size} rank{'s' if m.world_size != 1 else ''}",
             f"  {m.tokens_per_step:,} tokens/step | backend {h.get('backend', '?')}, "
             f"{h.get('precision', '?')}",
             f"  threads: {h['threads']}"]
    if h.get("gpus"):
        lines.append(f"  GPUs: {gpu_map(h['gpus'])}")
    if h.get("config", {}).get("attention") == "flash":   # a kernel, or which code runs instead and why
        lines.append(f"  attention: {flash_path(h)}")
    if h.get("bucket_mb") is not None:
        lines.append(f"  gradient buckets: {h['bucket_mb']:g} MiB ({h.get('bucket_source', 'given')})")
    if m.bytes_per_token != 1.0:
        lines.append(f"  tokens: a vocabulary of {h.get('vocab_size', '?')}, {m.bytes_per_token:.3f} "
                     "bytes/token on the validation text (bits/byte = nats/token / ln 2 / that)")
    note = "" if m.peak_tflops else " (no --peak-tflops given)"
    lines.append(f"  MFU against {m.mfu_basis}{note}")
    return lines


def flash_path(h):
    """What runs this run's flash attention (``kernels.flash_attention.describe``): its
    dtype from the precision, its head dim from the config's model (preset and sizes)."""
    from minipar.kernels.flash_attention import describe
    from minipar.nn.gpt import config_from_preset
    c = h["config"]
    model = config_from_preset(c["model"], d_model=c.get("d_model"), n_head=c.get("n_head"))
    return describe(h.get("backend"), backend.dtype_of(h["precision"]), model.d_model // model.n_head)


# up to this many ranks the GPU map names each rank; beyond, one range per node
GPU_MAP_EACH_RANK = 8


def _runs(numbers):
    """[0, 1, 2, 3, 0, 1] -> "0-3,0-1": consecutive runs as ranges."""
    parts, start = [], 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            a, b = numbers[start], numbers[i - 1]
            parts.append(f"{a}" if a == b else f"{a}-{b}")
            start = i
    return ",".join(parts)


def gpu_map(gpus):
    """Where each rank computes (``gpus``: the header's list of ``process.devices``
    placements): ``rank 0 -> node-a GPU 0 (0000:01:00.0), rank 1 -> ...``, or for many
    ranks ``node-a ranks 0-7 -> GPUs 0-7; node-b ranks 8-15 -> GPUs 0-7``."""
    from minipar.process.devices import Placement, node_label
    placements = [Placement(**g) for g in gpus]
    if len(placements) <= GPU_MAP_EACH_RANK:
        return ", ".join(f"rank {p.rank} -> {node_label(placements, p.node)} GPU {p.device}"
                         + (f" ({p.bus_id})" if p.bus_id else "") for p in placements)
    nodes = {}
    for p in placements:
        nodes.setdefault(p.node, []).append(p)
    return "; ".join(f"{node_label(placements, node)} ranks {_runs([p.rank for p in ranks])} -> "
                     f"GPUs {_runs([p.device for p in ranks])}" for node, ranks in nodes.items())


def summary_lines(m, f):
    """The run's summary from its final record ``f``: losses, tokens/s and MFU, memory,
    skipped steps, and how to draw the log."""
    lines = [f"done: {f['steps']} steps in {f['wall_s']:.1f} s wall"]
    if f["train_loss"] is not None:
        lines.append(f"  train loss {f['train_loss']:.4f} {m.loss_unit} ({f['train_bits_per_byte']:.3f} "
                     f"bits/byte), mean of last 10 {f['train_loss_last10']:.4f}")
    if f["val_loss"] is not None:
        lines.append(f"  val loss   {f['val_loss']:.4f} {m.loss_unit} ({f['val_bits_per_byte']:.3f} bits/byte)")
    else:
        lines.append("  val loss   not measured (evaluation skipped)")
    if f["tokens_per_s"]:
        lines.append(f"  {f['tokens_per_s']:,.0f} tokens/s | MFU {100 * f['mfu']:.1f}% of {f['mfu_basis']}"
                     f" | communication {100 * f['comm_share']:.1f}% of step time")
    if f["peak_mem_bytes_per_rank"]:
        shares = [f"{100 * s:.1f}%" for s in f["mem_share_per_rank"] if s is not None]
        of = " of GPU memory" if backend.backend_name() == "cupy" else " of the RAM budget"
        lines.append("  peak memory per rank (tracked arrays of a step): "
                     + ", ".join(map(fmt_bytes, f["peak_mem_bytes_per_rank"]))
                     + (f" ({', '.join(shares)}{of})" if shares else ""))
    lines += list(procmem.summary_lines(f.get("process_memory"), fmt_bytes))
    if f["skipped_steps"]:
        lines.append(f"  skipped steps (fp16 overflow): {f['skipped_steps']}")
    if m.log_path:
        out = os.path.splitext(m.log_path)[0] + "_report"
        lines.append(f"  draw it: python -m minipar report {m.log_path} --out {out}")
    return lines
