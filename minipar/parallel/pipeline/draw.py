"""Show a pipeline timeline: a matplotlib Gantt chart, or Chrome trace JSON.

Both take timelines in the shared format of `timeline.py` (``{rank: [Span or
(kind, microbatch, chunk, start, end) or dict, ...]}``), so a simulated run and
a measured one are drawn the same way. The white gaps between boxes are the
bubble.
"""
from __future__ import annotations

from .timeline import COMPUTE_KINDS, as_timelines, bubble_fraction

KIND_COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#C44E52",
               "send": "#8C8C8C", "recv": "#CCB974"}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight grad", "send": "send", "recv": "recv"}


def _shade(color: str, chunk: int, chunks: int):
    """Lighter for later model chunks, so interleaved chunks tell apart."""
    from matplotlib.colors import to_rgb

    mix = 0.5 * chunk / max(chunks - 1, 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(color))


def draw_timeline(timelines, ax=None, title: str | None = None, show_bubble: bool = True):
    """Draw one row per rank (rank 0 on top), one box per span, labelled with
    its micro-batch. Compute spans (F/B/W) fill the row, later model chunks in
    lighter shades; other kinds (send, recv, ...) are thin bars along the
    bottom of the row. The title gets the bubble fraction appended. Returns
    the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    timelines = as_timelines(timelines)
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 0.6 * max(len(timelines), 1) + 1.2))
    spans = [(rank, s) for rank, rank_spans in timelines.items() for s in rank_spans]
    chunks = 1 + max((s.chunk for _, s in spans), default=0)
    kinds = list(dict.fromkeys(s.kind for _, s in spans))
    for rank, s in spans:
        compute = s.kind in COMPUTE_KINDS
        y, height = (rank - 0.4, 0.8) if compute else (rank + 0.25, 0.15)
        color = _shade(KIND_COLORS.get(s.kind, "#999999"), s.chunk if compute else 0, chunks)
        ax.barh(y, s.end - s.start, left=s.start, height=height, align="edge",
                color=color, edgecolor="black", linewidth=0.4)
        if compute:
            ax.text((s.start + s.end) / 2, rank, str(s.microbatch), ha="center", va="center",
                    fontsize=7, color="white" if s.chunk == 0 else "black", clip_on=True)
    ax.set_yticks(list(timelines))
    ax.set_yticklabels([f"rank {r}" for r in timelines])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    if show_bubble and spans:
        label = f"bubble {bubble_fraction(timelines):.1%}"
        title = f"{title} ({label})" if title else label
    if title:
        ax.set_title(title)
    names = dict(KIND_NAMES, B="input grad") if "W" in kinds else KIND_NAMES
    if chunks > 1:
        names = {k: f"{v} (lighter: later chunks)" if k == "F" else v for k, v in names.items()}
    ax.legend(handles=[Patch(color=KIND_COLORS.get(k, "#999999"), label=names.get(k, k))
                       for k in kinds], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return ax


def to_chrome_trace(timelines, time_scale: float = 1e6) -> dict:
    """Chrome trace JSON (``json.dump`` it; opens in Perfetto / chrome://tracing).

    One complete event (ph "X") per span, pid 0, tid = rank, named like
    "F3" or "B3.1" (micro-batch 3, chunk 1). `time_scale` converts span times
    to the trace's microseconds: 1e6 for seconds (measured runs); for the
    simulator's abstract units any scale works, e.g. 1000.
    """
    timelines = as_timelines(timelines)
    events = []
    for rank in timelines:
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
    for rank, spans in timelines.items():
        for s in spans:
            suffix = f".{s.chunk}" if s.chunk else ""
            events.append({
                "name": f"{s.kind}{s.microbatch}{suffix}", "cat": s.kind, "ph": "X",
                "pid": 0, "tid": rank,
                "ts": s.start * time_scale, "dur": (s.end - s.start) * time_scale,
                "args": {"microbatch": s.microbatch, "chunk": s.chunk},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
