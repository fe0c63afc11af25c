"""Run layouts and print, per layout, what was measured next to what the model predicts.

    mpiexec -n N python tests/scripts/perf_layouts.py '<json list of TrainConfig kwargs>' \
        [--steps K] [--profile P]

Rank 0 prints one JSON line per layout: each rank's ``model_state_bytes`` (measured,
``Optimizer.memory_bytes``) and the memory model's value for that rank's coordinates,
each rank's measured peak of live arrays and ``tracked_peak_bytes``, the median step
time over the steps after the first (train's own, the slowest rank's: what the model
predicts) and, with ``--profile``, the predicted step time.
"""
import argparse
import gc
import json
import statistics

from mpi4py import MPI

from minipar import backend
from minipar.config import TrainConfig
from minipar.perf.estimate import predict, tracked_peak_bytes
from minipar.perf.memory import model_state_bytes
from minipar.train import setup


def run_layout(kw, steps, prof):
    # the byte corpus unless a case names its data: at the default's 4,096 tokens the memory
    # model under-predicts the tiny model's tracked peak (14.5 MB against 22.0 MB measured)
    config = TrainConfig(quiet=True, eval_batches=0, steps=max(steps, 2),
                         **{"data": "stdlib-bytes", **kw})
    run = setup(config)
    run.warmup = 1
    grid, resolved = run.grid, run.config
    times, peaks = [], []
    for s in range(steps):
        gc.collect()
        grid.world.mpi.Barrier()
        shared, mine = run.step(s)
        # the step time train reports (forward to the loss's reduction; the model predicts
        # it), the slowest rank's; not run.step's wall time, which adds the batch and the
        # monitor's bookkeeping (12.5 against 8-10 ms for the tiny model)
        times.append(grid.world.mpi.allreduce(mine["step_time_s"], op=MPI.MAX))
        peaks.append(mine["peak_mem_bytes"])
    c = grid.coords
    coords = (c.dp, c.tp, c.pp)
    mine = {"coords": coords, "state": run.optimizer.memory_bytes(),
            "state_model": model_state_bytes(resolved.model_config(), resolved, coords),
            "peak": max(peaks), "peak_model": tracked_peak_bytes(resolved, coords)}
    everyone = grid.world.mpi.gather(mine, root=0)
    out = None
    if grid.rank == 0:
        later = times[1:] or times
        out = {"layout": kw, "ranks": everyone, "step_s": statistics.median(later),
               "step_s_all": later}
        if prof is not None:
            p = predict(resolved, prof)
            out.update(pred_step_s=p.step_s, breakdown={k: v for k, v in p.breakdown.items()})
    del run
    gc.collect()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("layouts")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--profile", default=None)
    a = ap.parse_args()
    prof = None
    if a.profile:
        from minipar.perf.profile import load_profile
        prof = load_profile(a.profile)
    for kw in json.loads(a.layouts):
        out = run_layout(kw, a.steps, prof)
        if MPI.COMM_WORLD.rank == 0:
            print(json.dumps(out), flush=True)
    backend.sync()


if __name__ == "__main__":
    main()
