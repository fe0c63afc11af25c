"""Time a pipeline schedule without running it: the bubble, on paper.

Every action starts as soon as (a) its rank has finished the previous action in
its list and (b) every action it depends on has finished, plus `t_comm` when
that action ran on another rank (the message in flight):

    start(a) = max(end(previous on rank), max_d end(d) + t_comm·[rank(d) != rank(a)])
    end(a)   = start(a) + duration(a)

Sends never block (the engine's isend), so this is the exact makespan of an
idealised run. Durations per action, with v = chunks (each chunk holds 1/v of
the stage's layers, so each of its ops takes 1/v of the time):

* F: t_f / v
* non-split schedules, B (the full backward): (t_b + t_w) / v, or t_b / v
  when t_w is None;
* split schedules (ZB-H1), B (input gradient): t_b / v and W (weight gradient):
  t_w / v. With t_w None the backward is taken to cost t_b in all, half in B,
  half in W, so the same arguments compare schedules doing the same work.

For uniform op times the bubble fractions come out as

    AFAB, 1F1B (t_f = t_b):        (p-1) / (m + p - 1)
    interleaved, v chunks:         (p-1) / (v·m + p - 1)
    ZB-H1 (t_f = t_b = t_w, m>=p): (p-1) / (3m + p - 1)
"""
from __future__ import annotations

from dataclasses import dataclass

from .schedules import Action, dependencies, splits_backward
from .timeline import Span
from .validate import validate


@dataclass
class SimResult:
    """What `simulate` found.

    timelines: {rank: [Span(kind, microbatch, chunk, start, end), ...]}
    makespan: time from 0 to the last action's end.
    busy: {rank: time spent computing}.
    bubble_fraction: idle / (pp · makespan) = 1 - sum(busy) / (pp · makespan).
    peak_in_flight: {rank: most (micro-batch, chunk) pairs at once whose F has
        run and whose B has not: the activations a rank holds. For interleaved
        each pair is 1/v of a stage's activations; see `peak_activations`.
    peak_held: like peak_in_flight but released only by the last backward op
        (the W in split schedules, which still needs the layer inputs).
    """

    timelines: dict[int, list[Span]]
    makespan: float
    busy: dict[int, float]
    bubble_fraction: float
    peak_in_flight: dict[int, int]
    peak_held: dict[int, int]
    chunks: int = 1

    @property
    def peak_activations(self) -> dict[int, float]:
        """Peak in-flight activations in units of one micro-batch through a
        whole (non-interleaved) stage: peak_in_flight / chunks."""
        return {r: n / self.chunks for r, n in self.peak_in_flight.items()}


def _per_rank(value, rank):
    """An op cost: one number for every stage, or {rank: number} per stage."""
    return value.get(rank) if isinstance(value, dict) else value


def _durations(split: bool, chunks: int, t_f: float, t_b: float, t_w: float | None):
    if split:
        b, w = (t_b / 2, t_b / 2) if t_w is None else (t_b, t_w)
    else:
        b, w = (t_b if t_w is None else t_b + t_w), 0.0
    return {"F": t_f / chunks, "B": b / chunks, "W": w / chunks}


def _peak(actions: list[Action], release: str) -> int:
    """Walk a rank's list: +1 at each F, -1 when `release` frees that pair."""
    live = peak = 0
    for a in actions:
        if a.kind == "F":
            live += 1
            peak = max(peak, live)
        elif a.kind == release:
            live -= 1
    return peak


def simulate(schedule: dict, pp: int, chunks: int = 1, t_f: float = 1.0, t_b: float = 1.0,
             t_w: float | None = None, t_comm: float = 0.0) -> SimResult:
    """Validate `schedule`, then time it with the given op costs: numbers for every stage,
    or {rank: number} dicts when the stages differ (a slow stage)."""
    microbatches = 1 + max((a.microbatch for acts in schedule.values() for a in acts), default=-1)
    order = validate(schedule, pp, microbatches, chunks)
    split = splits_backward(schedule)
    costs = {r: _durations(split, chunks, _per_rank(t_f, r), _per_rank(t_b, r), _per_rank(t_w, r))
             for r in schedule}

    end: dict[tuple[int, Action], float] = {}
    clock = {rank: 0.0 for rank in schedule}
    timelines: dict[int, list[Span]] = {rank: [] for rank in schedule}
    for rank, action in order:
        ready = clock[rank]
        for dep in dependencies(rank, action, pp, chunks):
            ready = max(ready, end[dep] + (t_comm if dep[0] != rank else 0.0))
        finish = ready + costs[rank][action.kind]
        end[(rank, action)] = clock[rank] = finish
        timelines[rank].append(Span(action.kind, action.microbatch, action.chunk, ready, finish))

    total = max(clock.values(), default=0.0)
    busy = {rank: sum(s.end - s.start for s in spans) for rank, spans in timelines.items()}
    bubble = (pp * total - sum(busy.values())) / (pp * total) if total > 0 else 0.0
    return SimResult(
        timelines=timelines,
        makespan=total,
        busy=busy,
        bubble_fraction=bubble,
        peak_in_flight={r: _peak(acts, "B") for r, acts in schedule.items()},
        peak_held={r: _peak(acts, "W" if split else "B") for r, acts in schedule.items()},
        chunks=chunks,
    )
