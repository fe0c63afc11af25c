"""Lesson 15's exercise: your supervisor loop, with failures injected, against one run.

    python lessons/15_yours.py --file MINE.py

``MINE.py`` defines ``supervise(mpiexec, train_args, run_dir, save_every, max_restarts)``:
run ``train`` under ``mpiexec(argv)`` (this check's: ``mpiexec -n 2 python -m minipar
train ARGV``, returning the exit status) until an attempt finishes, restarting after each
failure from the newest checkpoint (``--save DIR --save-every K`` writes it, ``--resume
DIR`` continues from it), giving up with an exception after ``max_restarts`` restarts,
and returning the run as one loss curve ``{step: loss}`` (a redone step's later record
wins).  The learner reads only the attempts' ``--log-json`` logs, never a checkpoint
file: the checkpoint format may change, the CLI stays.

Two scenarios:

1. 12 steps, checkpoints every 3; the first attempt fails at step 5 (rank 1 raises,
   ``MINIPAR_INJECT_FAILURE``), the second at step 10 (rank 0), the third finishes.
   Checked: three attempts; the second resumes at step 3 and the third at step 9 (the
   newest checkpoints); the curve equals one uninterrupted process's, step by step.
2. ``max_restarts=1`` and every attempt dies before its first step (no log at all;
   nothing is launched): ``supervise`` must raise after the second attempt.
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipar.observe.runlog import read_log, step_records
from yours import check_here, find_mpiexec, load

TINY = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "4", "--seq-len", "8",
        "--precision", "fp64", "--batch-size", "8", "--quiet", "--eval-batches", "0", "--steps", "12"]
EVERY, FAILURES = 3, ["1:5", "0:10"]            # attempt k fails as FAILURES[k], if any
RESUMES = [None, 3, 9]                           # where each attempt must start


def option(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


class Launcher:
    """The mpiexec the learner calls: runs the attempt, injecting the next failure."""

    def __init__(self, fail_at_once=False):
        self.attempts, self.statuses, self.fail_at_once = [], [], fail_at_once

    def __call__(self, argv):
        argv = [str(a) for a in argv]
        k = len(self.attempts)
        self.attempts.append(argv)
        if self.fail_at_once:
            assert k < 2, (f"attempt {k + 1} launched after {k} failures with max_restarts=1: "
                           "a supervisor gives up after max_restarts restarts")
            self.statuses.append(1)
            return 1                             # died before its first step: no log
        assert k < 3, f"attempt {k + 1} launched, but attempt 3 (no failure injected) had finished"
        assert option(argv, "--log-json"), f"attempt {k + 1}: no --log-json, so no record of its steps"
        env = dict(os.environ, MINIPAR_INJECT_FAILURE=FAILURES[k]) if k < len(FAILURES) else None
        cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "minipar", "train", *argv]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        fault = f"rank {FAILURES[k].replace(':', ' fails at step ')}" if k < len(FAILURES) else "no failure"
        resume = option(argv, "--resume")
        print(f"attempt {k + 1}: {'--resume ' + os.path.basename(resume) if resume else 'from scratch'}, "
              f"{fault} -> exit status {proc.returncode}", flush=True)
        self.statuses.append(proc.returncode)
        return proc.returncode


def uninterrupted(work, given, like):
    """{step: loss} of one process, never interrupted: read from ``given`` if that log is of
    the same training as the log ``like`` (the notebook has one already), else run here."""
    if given:
        header, records, final = read_log(given)
        same = ("model", "n_layer", "d_model", "n_head", "seq_len", "precision", "batch_size", "steps",
                "lr", "seed", "data")
        complete = header and final is not None and \
            [r["step"] for r in records] == list(range(header["config"]["steps"]))
        if complete and all(header["config"][k] == read_log(like)[0]["config"][k] for k in same):
            return {r["step"]: r["loss"] for r in records}
    single = os.path.join(work, "single.json")
    subprocess.run([sys.executable, "-m", "minipar", "train", *TINY, "--log-json", single],
                   check=True, capture_output=True, timeout=300)
    return {r["step"]: r["loss"] for r in step_records(single)}


def check(supervise, reference_log):
    work = tempfile.mkdtemp(prefix="minipar_l15_yours_")
    launch = Launcher()
    os.makedirs(os.path.join(work, "run"))
    curve = supervise(launch, list(TINY), os.path.join(work, "run"), EVERY, 3)
    assert len(launch.attempts) == 3, (
        f"{len(launch.attempts)} attempt(s), exit statuses {launch.statuses}: the injected failures end "
        "attempts 1 and 2, so finishing takes three")
    for k, (argv, resume) in enumerate(zip(launch.attempts, RESUMES), 1):
        records = step_records(option(argv, "--log-json"))
        first = records[0]["step"] if records else None
        assert first == (resume or 0), (
            f"attempt {k} started at step {first}; the newest checkpoint then was of step {resume} "
            f"(--save-every {EVERY}, the failure at step {FAILURES[k - 2].split(':')[1]})" if resume else
            f"attempt {k} started at step {first}, not 0")
    assert isinstance(curve, dict), f"supervise returned {type(curve).__name__}, not {{step: loss}}"
    reference = uninterrupted(work, reference_log, option(launch.attempts[-1], "--log-json"))
    missing = sorted(set(reference) - set(curve))
    assert not missing, f"your curve has no loss for steps {missing}"
    for step, want in reference.items():
        got = curve[step]
        assert abs(got - want) <= 1e-9 * abs(want), (
            f"step {step}: your curve says {got!r}, the uninterrupted run {want!r}")
    print(f"three attempts, resumed at steps 3 and 9; the {len(curve)} losses equal one uninterrupted "
          "process's", flush=True)

    launch = Launcher(fail_at_once=True)
    try:
        os.makedirs(os.path.join(work, "doomed"))
        supervise(launch, list(TINY), os.path.join(work, "doomed"), EVERY, 1)
    except AssertionError:
        raise
    except Exception as err:
        print(f"every attempt failing: gave up after {len(launch.attempts)} attempts ({err})", flush=True)
    else:
        raise AssertionError(f"supervise returned after {len(launch.attempts)} attempts that all failed; "
                             "it should raise once max_restarts restarts are spent")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True, help="the learner's supervise")
    parser.add_argument("--reference", help="the --log-json of `train " + " ".join(TINY) + "` on one "
                        "process, if you have it (else it is run here)")
    args = parser.parse_args()
    check_here(check, load(args.file, "supervise"), args.reference)


if __name__ == "__main__":
    main()
