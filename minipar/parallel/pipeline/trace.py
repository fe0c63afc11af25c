"""A measured pipeline step as a trace: gathered from the stages, written as
Chrome trace JSON (opens in Perfetto), with its bubble fraction and the
simulator's prediction for the measured mean op times alongside."""
from __future__ import annotations

import json
import os
import statistics

from minipar.parallel.pipeline.draw import to_chrome_trace
from minipar.parallel.pipeline.schedules import build_schedule
from minipar.parallel.pipeline.simulate import simulate
from minipar.parallel.pipeline.timeline import bubble_fraction


def gather_spans(pp_comm, spans):
    """{stage rank: spans} on pp rank 0 (pickled: once per step, off the hot path)."""
    everyone = pp_comm.mpi.gather([tuple(s) for s in spans], root=0)
    return None if everyone is None else dict(enumerate(everyone))


def summarize(timelines, kind, pp, microbatches, chunks):
    """Measured bubble (1 - compute / wall, per rank) and the simulator's, fed with each
    stage's measured mean F/B/W times (a slow stage is simulated slow)."""
    def mean(k, rank):
        d = [s[4] - s[3] for s in timelines[rank] if s[0] == k]
        return statistics.mean(d) * chunks if d else None
    per = {k: {r: mean(k, r) for r in timelines} for k in "FBW"}
    t_w = None if any(v is None for v in per["W"].values()) else per["W"]
    sim = simulate(build_schedule(kind, pp, microbatches, chunks), pp, chunks,
                   t_f=per["F"], t_b=per["B"], t_w=t_w)
    overall = {k: statistics.mean(v for v in per[k].values() if v is not None) / chunks
               if any(v is not None for v in per[k].values()) else None for k in "FBW"}
    return {"measured_bubble": bubble_fraction(timelines), "simulated_bubble": sim.bubble_fraction,
            "mean_op_s": overall, "mean_op_s_per_stage": {k: {str(r): v for r, v in d.items()}
                                                          for k, d in per.items()}}


def write_trace(path, timelines, summary):
    trace = to_chrome_trace(timelines)
    trace["metadata"] = summary
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:          # written whole, then renamed: never read half-done
        json.dump(trace, f)
    os.replace(tmp, path)
