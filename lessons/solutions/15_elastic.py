"""Solutions of lesson 15's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "young": r'''
def my_interval(C, M):
    return np.sqrt(2 * C * M)          # -C/tau^2 + 1/(2M) = 0
''',
    "largest": r'''
def my_largest_world(config, slots, min_np=1):
    dp_only = replace(config, dp=None, tp=1, pp=1, cp=1, chunks=1, schedule=None,
                      microbatches=None, sequence_parallel=False)
    for w in range(slots, min_np - 1, -1):
        for candidate in (replace(config, dp=None), dp_only):
            try:
                candidate.resolve(w)
                return w
            except ConfigError:
                pass
    return None
''',
    "supervise": r'''
%%writefile {MINE}/supervise.py
"""Your supervisor loop (lesson 15): run by 15_yours.py, which launches the mpiexec jobs."""
import os

from minipar.observe.runlog import step_records


def supervise(mpiexec, train_args, run_dir, save_every, max_restarts):
    """Run train until an attempt finishes, from the newest checkpoint after each
    failure; return {step: loss} of the run as one curve."""
    checkpoint = os.path.join(run_dir, "checkpoint")
    curve, newest, failures = {}, None, 0     # newest: the step of the newest checkpoint
    while True:
        log = os.path.join(run_dir, f"attempt{failures + 1}.json")
        argv = [*train_args, "--save", checkpoint, "--save-every", save_every, "--log-json", log]
        if newest is not None:
            argv += ["--resume", checkpoint]
        status = mpiexec(argv)
        for record in step_records(log) if os.path.exists(log) else []:
            curve[record["step"]] = record["loss"]     # a redone step: the later attempt wins
            if (record["step"] + 1) % save_every == 0:  # a checkpoint followed this step
                newest = record["step"] + 1
        if status == 0:
            return curve
        failures += 1
        if failures > max_restarts:
            raise RuntimeError(f"{failures} attempts failed; giving up (max_restarts={max_restarts})")
''',
}
