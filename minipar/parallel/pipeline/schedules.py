"""Pipeline schedules as data: each rank gets an ordered list of `Action`s.

A schedule is the pure function

    build_schedule(kind, pp, microbatches, chunks=1) -> {rank: [Action, ...]}

and nothing else: no MPI, no tensors. The validator checks it, the simulator
times it, the engine executes it and the trace draws it.

Actions
-------
``Action(kind, microbatch, chunk)`` with kind one of

* ``"F"``  forward of one micro-batch through one model chunk;
* ``"B"``  backward: the gradient w.r.t. the chunk's *input* (what the previous
  stage waits for). If the schedule has no ``"W"`` actions, ``"B"`` also computes
  the weight gradients (a full backward, as in AFAB / 1F1B / interleaved);
* ``"W"``  the weight gradients of a micro-batch whose ``"B"`` already ran
  (only in split-backward schedules, i.e. ZB-H1). Needs no communication.

A schedule is either split (every B has a matching W on that rank) or not (no W
at all); `splits_backward` tells which.

Layout (Megatron style)
-----------------------
The model is cut into ``S = pp * chunks`` *virtual stages*. Rank r holds chunk c,
which is virtual stage ``s = c * pp + r``, so rank r holds stages r, r+pp,
r+2pp, ... Micro-batches flow through s = 0, 1, ..., S-1 forward and back.

Communication is implicit: ``F`` on stage s receives activations from stage
s-1 and sends its output to s+1; ``B`` receives the output gradient from s+1
and sends the input gradient to s-1 (`peers` gives those as (rank, chunk)).
The first stage reads the micro-batch from the data, the last computes the loss.
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("F", "B", "W")
SCHEDULES = ("afab", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on a rank: `kind` ("F", "B" or "W") of `microbatch` on
    the rank's model chunk `chunk` (0 unless the schedule is interleaved)."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Action kind must be one of {KINDS}, got {self.kind!r}")

    def __repr__(self) -> str:
        tail = f".{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.microbatch}{tail}"


# ---------------------------------------------------------------- layout
def virtual_stage(rank: int, chunk: int, pp: int) -> int:
    """Virtual stage held by `rank` as its `chunk`: s = chunk * pp + rank."""
    return chunk * pp + rank


def stage_location(stage: int, pp: int) -> tuple[int, int]:
    """Inverse of `virtual_stage`: stage s lives on rank s % pp as chunk s // pp."""
    return stage % pp, stage // pp


def peers(rank: int, action: Action, pp: int, chunks: int = 1):
    """Who `action` on `rank` talks to: ``(recv_from, send_to)``.

    Each is a ``(rank, chunk)`` pair or None (first/last stage, or a "W").
    F receives activations from stage s-1 and sends to s+1; B receives the
    output gradient from s+1 and sends the input gradient to s-1. With pp=1
    and chunks>1 the peer is the same rank: hand the array over in memory.
    """
    last = pp * chunks - 1
    s = virtual_stage(rank, action.chunk, pp)
    if action.kind == "W":
        return None, None
    before = stage_location(s - 1, pp) if s > 0 else None
    after = stage_location(s + 1, pp) if s < last else None
    return (before, after) if action.kind == "F" else (after, before)


def dependencies(rank: int, action: Action, pp: int, chunks: int = 1):
    """The ``(rank, Action)`` pairs that must finish before `action` may start.

    F(m) on stage s needs F(m) on s-1. B(m) on s needs F(m) on s (its saved
    activations) and B(m) on s+1 (its output gradient). W(m) needs B(m) on s.
    """
    mb, c = action.microbatch, action.chunk
    if action.kind == "W":
        return [(rank, Action("B", mb, c))]
    recv_from, _ = peers(rank, action, pp, chunks)
    deps = [(rank, Action("F", mb, c))] if action.kind == "B" else []
    if recv_from is not None:
        peer_rank, peer_chunk = recv_from
        deps.append((peer_rank, Action(action.kind, mb, peer_chunk)))
    return deps


def splits_backward(schedule: dict) -> bool:
    """True when B computes only input gradients and W the weight gradients."""
    return any(a.kind == "W" for actions in schedule.values() for a in actions)


# ---------------------------------------------------------------- schedules
def _afab(pp: int, m: int, rank: int) -> list[Action]:
    """GPipe: all m forwards, then all m backwards. Holds m micro-batches of
    activations; bubble (p-1)/(m+p-1) of wall time when t_F = t_B."""
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def _1f1b(pp: int, m: int, rank: int) -> list[Action]:
    """1F1B (PipeDream-Flush): w = min(p-r-1, m) warm-up forwards, then
    alternate F(w+i), B(i), then the remaining backwards. Same bubble as AFAB,
    but rank r holds at most p-r micro-batches of activations instead of m."""
    warmup = min(pp - rank - 1, m)
    actions = [Action("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [Action("F", warmup + i), Action("B", i)]
    actions += [Action("B", i) for i in range(m - warmup, m)]
    return actions


def _interleaved(pp: int, m: int, rank: int, chunks: int) -> list[Action]:
    """Megatron's interleaved 1F1B with v = `chunks` chunks per rank.

    The k-th forward (k = 0 .. v*m-1) on a rank runs chunk (k // p) % v on
    micro-batch (k // (p*v)) * p + k % p: groups of p micro-batches go through
    chunk 0, then chunk 1, ... The k-th backward walks the chunks in reverse.
    Warm-up is 2(p-r-1) + (v-1)p forwards, then 1F1B, then cool-down.
    Each op is 1/v as long, so the bubble shrinks to (p-1)/(v*m + p-1).
    """
    total = m * chunks

    def nth(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k // pp) % chunks
        if not forward:
            chunk = chunks - 1 - chunk
        return (k // (pp * chunks)) * pp + k % pp, chunk

    warmup = min(2 * (pp - rank - 1) + (chunks - 1) * pp, total)
    actions = [Action("F", *nth(k, True)) for k in range(warmup)]
    for k in range(total - warmup):
        actions += [Action("F", *nth(warmup + k, True)), Action("B", *nth(k, False))]
    actions += [Action("B", *nth(k, False)) for k in range(total - warmup, total)]
    return actions


def _zb_h1(pp: int, m: int, rank: int) -> list[Action]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).

    The backward is split into B (input gradient, on the critical path between
    stages) and W (weight gradient, needed by nobody downstream). F and B
    follow 1F1B exactly, so activations held until B stay at p-r on rank r.
    Rank r runs W(j) right after B(j+r), i.e. it keeps r weight gradients
    pending, and flushes them at the end where 1F1B's cool-down bubble was.
    With t_F = t_B = t_W = 1 and m >= p every rank idles p-1 units, against
    3(p-1) for 1F1B: makespan 3m + p - 1, bubble (p-1)/(3m+p-1).
    """
    lag = rank
    actions = []
    for action in _1f1b(pp, m, rank):
        actions.append(action)
        if action.kind == "B" and action.microbatch >= lag:
            actions.append(Action("W", action.microbatch - lag))
    actions += [Action("W", j) for j in range(max(0, m - lag), m)]
    return actions


def build_schedule(kind: str, pp: int, microbatches: int, chunks: int = 1) -> dict[int, list[Action]]:
    """Return ``{rank: [Action, ...]}`` for schedule `kind` on `pp` ranks.

    kind: "afab" (GPipe), "1f1b", "interleaved" (needs chunks >= 2 and
    microbatches % pp == 0) or "zb-h1". Any microbatches >= 1 is accepted by
    the others; with microbatches < pp the pipeline never fills (most of the
    time is bubble), and ZB-H1 reaches its (p-1)/(3m+p-1) only when m >= p.
    """
    for name, value in (("pp", pp), ("microbatches", microbatches), ("chunks", chunks)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    if kind == "interleaved":
        if chunks < 2:
            raise ValueError(
                f"interleaved needs chunks >= 2 model chunks per rank, got chunks={chunks}; "
                "use chunks=2 or more, or schedule '1f1b' for one chunk")
        if microbatches % pp:
            lo = max(pp, microbatches - microbatches % pp)
            raise ValueError(
                f"interleaved needs microbatches divisible by pp: got microbatches={microbatches}, "
                f"pp={pp}; use a multiple of {pp}, e.g. {lo} or {lo + pp}")
        return {r: _interleaved(pp, microbatches, r, chunks) for r in range(pp)}
    if chunks != 1:
        raise ValueError(
            f"schedule {kind!r} runs one model chunk per rank, got chunks={chunks}; "
            "use chunks=1, or kind='interleaved' for several chunks per rank")
    builder = {"afab": _afab, "1f1b": _1f1b, "zb-h1": _zb_h1}[kind]
    return {r: builder(pp, microbatches, r) for r in range(pp)}
