"""Goodput: the share of the wall time that made progress, and the checkpoint interval
that maximises it.

A job checkpoints every τ seconds of training; one checkpoint costs C seconds; a failure
comes on average every M seconds (the MTBF) and costs R seconds to detect and restart,
plus the work done since the last checkpoint — on average half an interval.  Per
second of wall time the waste is then, to first order,

    waste(τ) = C / τ  +  (τ / 2 + R) / M            goodput(τ) = 1 - waste(τ)

The first term falls with τ, the second grows with it; d waste / dτ = 0 gives
**Young's interval** (1974)

    τ* = √(2·C·M)

and Daly (2006) refined it for C not small against M:
τ* = √(2CM)·(1 + ⅓·√(C/2M) + ⅑·(C/2M)) - C.  A 30 s checkpoint and one failure a day:
τ* = √(2·30·86400) ≈ 38 min; with 1000 GPUs failing independently at one per 1000 days
each, M = 1 day too.  ``simulate`` checks the formula with random (exponential) failures.
"""
from __future__ import annotations

import math
import random


def young_daly_interval(checkpoint_s, mtbf_s, daly=False):
    """The checkpoint interval (seconds of training between checkpoints) that maximises
    goodput: Young's √(2·C·M), or Daly's higher-order form (Daly 2006):

        τ = √(2CM)·[1 + ⅓·√(C/2M) + (C/2M)/9] − C     for C < 2M,    else τ = M"""
    if checkpoint_s <= 0 or mtbf_s <= 0:
        raise ValueError("the checkpoint cost and the MTBF must be positive")
    tau = math.sqrt(2.0 * checkpoint_s * mtbf_s)
    if daly:
        if checkpoint_s >= 2.0 * mtbf_s:
            return float(mtbf_s)
        x = checkpoint_s / (2.0 * mtbf_s)
        tau = tau * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_s
    return tau


def model_goodput(interval_s, checkpoint_s, mtbf_s, restart_s=0.0):
    """1 - C/τ - (τ/2 + R)/M: the first-order goodput of checkpointing every τ seconds."""
    return 1.0 - checkpoint_s / interval_s - (interval_s / 2.0 + restart_s) / mtbf_s


def simulate(interval_s, checkpoint_s, mtbf_s, restart_s=0.0, work_s=None, seed=0):
    """Goodput of a simulated job: ``work_s`` seconds of training (default 200 MTBFs),
    a checkpoint after every ``interval_s`` of it, failures at exponential times.  A
    failure loses the segment in progress and costs ``restart_s``."""
    rng = random.Random(seed)
    work_s = 200.0 * mtbf_s if work_s is None else work_s
    done, wall = 0.0, 0.0
    next_failure = rng.expovariate(1.0 / mtbf_s)
    while done < work_s:
        segment = min(interval_s, work_s - done)
        cost = segment + checkpoint_s
        if wall + cost <= next_failure:
            wall += cost
            done += segment
        else:
            wall = next_failure + restart_s
            next_failure = wall + rng.expovariate(1.0 / mtbf_s)
    return work_s / wall


def summary(steps, events, checkpoints, wall_s, mtbf_s):
    """The measured figures of a supervised run: goodput, the mean checkpoint cost C, the
    median step, the failures' redone steps and lost seconds, and Young's interval for
    the measured C and the given MTBF (in seconds and in steps)."""
    times = sorted(r["step_time_s"] for r in steps if r.get("step_time_s") is not None)
    step_s = times[len(times) // 2] if times else None
    useful = sum(times)
    costs = [s for _, s in checkpoints]
    c = sum(costs) / len(costs) if costs else None
    out = {"wall_s": wall_s, "useful_s": useful, "goodput": useful / wall_s if wall_s else None,
           "step_s": step_s, "checkpoint_s": c, "checkpoints_measured": len(costs),
           "failures": sum(1 for e in events if e["kind"] in ("failure", "hang")),
           "scale_ups": sum(1 for e in events if e["kind"] == "scale_up"),
           "steps_redone": sum(e.get("steps_redone", 0) for e in events),
           "seconds_lost": sum(e.get("seconds_lost") or 0.0 for e in events),
           "mtbf_s": mtbf_s, "young_daly_interval_s": None, "young_daly_interval_steps": None}
    if c:
        tau = young_daly_interval(c, mtbf_s)
        out["young_daly_interval_s"] = tau
        out["young_daly_interval_steps"] = tau / step_s if step_s else None
    return out


def format_summary(g):
    lines = [f"goodput {g['goodput']:.1%}: {g['useful_s']:.2f} s of steps in {g['wall_s']:.2f} s wall"
             if g["goodput"] is not None else "goodput: no steps"]
    lines.append(f"  {g['failures']} failure(s), {g['scale_ups']} scale-up(s): "
                 f"{g['steps_redone']} step(s) redone, {g['seconds_lost']:.2f} s lost")
    if g["checkpoint_s"] is not None:
        lines.append(f"  checkpoint cost C = {g['checkpoint_s'] * 1e3:.1f} ms (mean of "
                     f"{g['checkpoints_measured']}), median step {g['step_s'] * 1e3:.1f} ms")
        lines.append(f"  Young/Daly interval for an MTBF of {g['mtbf_s']:g} s: "
                     f"sqrt(2*C*MTBF) = {g['young_daly_interval_s']:.1f} s"
                     + (f" = every {g['young_daly_interval_steps']:.0f} steps"
                        if g["young_daly_interval_steps"] else ""))
    return "\n".join(lines)
