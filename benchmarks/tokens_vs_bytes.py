"""Bytes or BPE tokens for the first run?  Validation bits per byte at equal wall time.

    python benchmarks/tokens_vs_bytes.py [--steps 600] [--vocab 1024 4096] [--model small]

Tokenizes the standard library at each vocabulary (``minipar tokenize``, cached in
``--cache``), then trains one single-process run per vocabulary and one on bytes *at
the same time* (so they share the machine alike), each with a step count scaled by its
measured cost per step so the runs take about the same wall time.  Prints wall time,
steps and val bits per byte (nats/token / ln 2 / bytes per token, the same validation
text for all).  Timing is noisy on a shared machine; the costs are measured first.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO)


def minipar(*args, wait=True):
    cmd = [sys.executable, "-m", "minipar", *map(str, args)]
    if wait:
        return subprocess.run(cmd, env=ENV, check=True, capture_output=True, text=True)
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def step_cost(data, model):
    """Seconds per step (the profiler's mean, without its bookkeeping)."""
    out = minipar("profile", "--data", data, "--model", model, "--steps", 5, "--top", 1).stdout
    line = next(x for x in out.splitlines() if "a step without the profiler" in x)
    return float(line.split("a step without the profiler: ")[1].split()[0]) / 1e3


def final_of(log):
    with open(log) as f:
        return [json.loads(line) for line in f][-1]["final"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600, help="steps of the byte run")
    p.add_argument("--vocab", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--model", default="small")
    p.add_argument("--cache", default=os.path.join(REPO, "runs", "tokens"))
    args = p.parse_args()
    datasets = {"bytes": "stdlib-bytes"}
    for v in args.vocab:
        out = os.path.join(args.cache, f"stdlib-{v}")
        minipar("tokenize", "--data", "stdlib", "--vocab", v, "--out", out, "--quiet")
        datasets[f"bpe {v}"] = out
    costs = {name: step_cost(data, args.model) for name, data in datasets.items()}
    runs = {}
    for name, data in datasets.items():
        steps = max(1, round(args.steps * costs["bytes"] / costs[name]))
        log = os.path.join(args.cache, f"run-{name.replace(' ', '')}.json")
        runs[name] = (steps, log, minipar("train", "--data", data, "--model", args.model, "--steps",
                                          steps, "--quiet", "--log-json", log, wait=False))
    print(f"{'':10s} {'s/step':>7s} {'steps':>6s} {'wall s':>7s} {'val bits/byte':>14s}")
    for name, (steps, log, proc) in runs.items():
        if proc.wait():
            raise SystemExit(f"{name}: {proc.stderr.read()[-2000:]}")
        f = final_of(log)
        print(f"{name:10s} {costs[name]:7.3f} {steps:6d} {f['wall_s']:7.1f} {f['val_bits_per_byte']:14.3f}")


if __name__ == "__main__":
    main()
