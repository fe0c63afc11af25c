"""Choosing the first command's defaults: val bits per byte of candidates at equal wall time.

    python benchmarks/first_command.py [--budget 100] [--only NAME ...]
    python benchmarks/first_command.py --steps 1500 --only NAME ...

Each candidate is the README's first command (``mpiexec -n 2 python -m minipar train``)
with other data, model or learning rate.  For each, back to back on the same machine:

    1. a 12-step calibration run gives its seconds per step (median after the first);
    2. the real run gets the steps that fill ``--budget`` seconds of training, so every
       candidate trains for about the same wall time (the LR schedule spans its steps);
    3. its val bits per byte (same validation text for bytes and every tokenizer) and its
       wall time are printed with the load average around it.

The tokenized stdlib is built (or found in the cache) first; its time is not in the
budget.  On a shared machine the load changes between candidates and with it the seconds
a step costs, so equal wall time is only roughly equal work: compare a row's s/step with
its load, and rerun close calls.  ``--steps N`` skips the calibration and gives every
candidate N steps: equal work for candidates of one model and data (learning rates),
whatever the load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# name: (data, extra flags); data "bpe:V" is the stdlib tokenized at vocabulary V
CANDIDATES = {
    "bytes small lr 5e-3 (old default)": ("stdlib-bytes", []),
    "bpe 4096 small lr 5e-3": ("bpe:4096", []),
    "bpe 4096 small lr 1e-2": ("bpe:4096", ["--lr", "1e-2"]),
    "bpe 4096 small lr 3e-3": ("bpe:4096", ["--lr", "3e-3"]),
    "bpe 2048 small lr 5e-3": ("bpe:2048", []),
    "bpe 4096 small d192 lr 5e-3": ("bpe:4096", ["--d-model", "192", "--n-head", "6"]),
    "bpe 4096 small batch 16 lr 5e-3": ("bpe:4096", ["--batch-size", "16"]),
    "bpe 4096 llama-small lr 5e-3": ("bpe:4096", ["--model", "llama-small"]),
}


def load():
    return "%.1f" % os.getloadavg()[0]


def train(data, extra, steps, log, eval_batches=None):
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "minipar", "train", "--quiet", "--data",
           data, "--steps", str(steps), "--log-json", log, *extra]
    if eval_batches is not None:
        cmd += ["--eval-batches", str(eval_batches)]
    env = dict(os.environ, PYTHONPATH=REPO)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in open(log)]
    return time.perf_counter() - t0, records


def seconds_per_step(data, extra, log):
    _, records = train(data, extra, 12, log, eval_batches=0)
    return statistics.median(r["step_time_s"] for r in records[2:] if "step_time_s" in r)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, default=100.0, help="seconds of training per candidate")
    p.add_argument("--only", nargs="+", help="candidate names (default: all)")
    p.add_argument("--steps", type=int, help="the same steps for every candidate (no calibration)")
    args = p.parse_args(argv)
    from minipar.data.named import tokenized
    names = args.only or list(CANDIDATES)
    folders = {}
    for name in names:
        data = CANDIDATES[name][0]
        if data.startswith("bpe:") and data not in folders:
            t0 = time.perf_counter()
            folders[data] = tokenized("stdlib", int(data[4:]), quiet=True)
            print(f"{data}: {folders[data]} ({time.perf_counter() - t0:.1f} s, load {load()})")
    each = f"{args.steps} steps" if args.steps else f"{args.budget:.0f} s of training"
    print(f"each candidate: {each} on 2 ranks; {os.cpu_count()} cores")
    print(f"{'candidate':36s} {'s/step':>7s} {'steps':>6s} {'train s':>8s} {'all s':>6s} "
          f"{'val bits/byte':>14s}  load before/after")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            data, extra = CANDIDATES[name]
            data = folders.get(data, data)
            before = load()
            if args.steps:
                steps, cost = args.steps, float("nan")
            else:
                cost = seconds_per_step(data, extra, os.path.join(tmp, "calibrate.json"))
                steps = max(10, round(args.budget / cost))
            wall, records = train(data, extra, steps, os.path.join(tmp, "run.json"))
            final = records[-1]["final"]
            print(f"{name:36s} {cost:7.3f} {steps:6d} {final['wall_s']:8.1f} {wall:6.1f} "
                  f"{final['val_bits_per_byte']:14.3f}  {before}/{load()}", flush=True)


if __name__ == "__main__":
    main()
