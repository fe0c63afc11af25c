"""What a new user sees: the README's first command, then what thread budgeting buys.

    python benchmarks/first_run.py [--steps N] [--compare-steps K] [--save DIR] [--warm-cache]

1. The README's first command, install excluded, from a clean environment (no
   OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS, as on a fresh machine) and an
   empty cache (XDG_CACHE_HOME a new temporary folder), so the first tokenization of the
   standard library counts; ``--warm-cache`` keeps the user's cache (a second run):

       mpiexec -n 2 python -m minipar train --save DIR --log-json DIR.json
       python -m minipar sample --resume DIR --prompt "def "

   printing the wall time of each, the validation loss and the sample.
2. The same training for K steps on 2 ranks twice: once as minipar budgets the
   threads (cores // ranks per rank), once forced to 2 BLAS threads per rank
   (OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 - what an unbudgeted BLAS does on a
   2-core machine: 4 threads fight over 2 cores), and the ratio of their step times.

The machine may be shared: the load average is printed beside every timing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "MINIPAR_BLAS_THREADS")
FIRST_RUN_LIMIT_S = 180


def clean_env(**extra):
    """This environment without any thread setting: a fresh machine's."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(extra)
    return env


def run(cmd, env, timeout):
    """(wall seconds, stdout+stderr); a failure stops the benchmark with the output."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout + proc.stderr


def load():
    return "load %.1f %.1f %.1f" % os.getloadavg()


def final_record(log):
    with open(log) as f:
        return [json.loads(line) for line in f][-1].get("final", {})


def first_run(args):
    save = args.save or tempfile.mkdtemp(prefix="minipar_first_run_")
    steps = ["--steps", str(args.steps)] if args.steps else []
    train = ["mpiexec", "-n", "2", sys.executable, "-m", "minipar", "train", "--save", save,
             "--log-json", save + ".json", *steps]
    sample = [sys.executable, "-m", "minipar", "sample", "--resume", save, "--prompt", "def "]
    print("1. the README's first command, thread variables unset")
    print("   $ " + " ".join(train[:2] + ["2", "python"] + train[4:]))
    print(f"   ({load()})")
    cache = None if args.warm_cache else tempfile.mkdtemp(prefix="minipar_cache_")
    env = clean_env(**({"XDG_CACHE_HOME": cache} if cache else {}))
    print("   cache: " + (f"empty ({cache})" if cache else "the user's (--warm-cache)"))
    train_s, out = run(train, env, timeout=1800)
    for line in out.splitlines():
        if line.lstrip().startswith("threads:"):
            print("   " + line.strip())
    print(f'   $ python -m minipar sample --resume {save} --prompt "def "')
    sample_s, text = run(sample, env, timeout=600)
    total = train_s + sample_s
    verdict = "within" if total <= FIRST_RUN_LIMIT_S else "OVER"
    print(f"   train {train_s:.1f} s + sample {sample_s:.1f} s = {total:.1f} s "
          f"({verdict} the {FIRST_RUN_LIMIT_S} s a first run may take; {load()})")
    for line in out.splitlines():
        if line.startswith("tokenize:"):
            print("   " + line.strip())
    final = final_record(save + ".json")
    if "val_bits_per_byte" not in final:
        print("   val loss: not logged (evaluation skipped?)")
    else:
        print(f"   val {final['val_loss']:.4f} nats/token, {final['val_bits_per_byte']:.3f} bits/byte "
              f"after {final['steps']} steps ({final['wall_s']:.1f} s of training)")
    print("   sample:")
    print("\n".join("   | " + line for line in text.rstrip().splitlines()))
    if not args.save:
        shutil.rmtree(save, ignore_errors=True)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)


def timed_steps(args, env, log):
    """(wall s, median step s) of a short 2-rank run under ``env``."""
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "minipar", "train", "--quiet",
           "--steps", str(args.compare_steps), "--eval-batches", "0", "--log-json", log]
    wall, _ = run(cmd, env, timeout=1800)
    steps = [json.loads(line) for line in open(log)]
    times = [r["step_time_s"] for r in steps if "step_time_s" in r][1:]   # first: warm-up
    # (header and final records have no step_time_s)
    return wall, statistics.median(times)


def compare(args):
    k = args.compare_steps
    print(f"\n2. {k} steps on 2 ranks: minipar's thread budget against 2 BLAS threads per rank")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("budgeted (cores // ranks)", clean_env()),
                ("forced: OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2",
                 clean_env(OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2"))]
        results = []
        for i, (name, env) in enumerate(runs):
            wall, step = timed_steps(args, env, os.path.join(tmp, f"{i}.json"))
            results.append((wall, step))
            print(f"   {name:<50} {wall:6.1f} s wall, {step:.3f} s/step median ({load()})")
    (wall_b, step_b), (wall_f, step_f) = results
    print(f"   ratio forced / budgeted: {step_f / step_b:.2f}x per step, {wall_f / wall_b:.2f}x wall")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, help="training steps of the first run (default: train's)")
    p.add_argument("--compare-steps", type=int, default=15, help="steps of each timed run")
    p.add_argument("--save", help="checkpoint folder of the first run (default: a temporary one)")
    p.add_argument("--skip-first-run", action="store_true", help="only the thread comparison")
    p.add_argument("--skip-compare", action="store_true", help="only the first run")
    p.add_argument("--warm-cache", action="store_true",
                   help="keep the user's cache (default: an empty one, so tokenizing counts)")
    args = p.parse_args(argv)
    if not args.skip_first_run:
        first_run(args)
    if not args.skip_compare:
        compare(args)


if __name__ == "__main__":
    main()
