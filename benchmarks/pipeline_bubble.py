"""The bubble of a real pipeline step against the simulator's prediction.

    python benchmarks/pipeline_bubble.py [--schedule 1f1b] [--microbatches 4] [--repeats 3]

Runs ``mpiexec -n 2 python -m minipar train --pp 2 --trace ...`` (4 layers, d = 64, 64
tokens, batch 16, fp32: ops of milliseconds, so Python overhead and message latency, which
the simulator takes as zero, stay small) ``--repeats`` times and prints, for the traced
step of each run, the measured bubble (idle share of the two ranks' time, from the trace),
the simulator's bubble for the measured mean F/B(/W) times, the formula's for equal times,
and the difference in percentage points.  A timing: it is reported here, never asserted
by a test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedule", default="1f1b", choices=["afab", "1f1b", "zb-h1"])
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    m, pp = args.microbatches, 2
    formula = (pp - 1) / ((3 if args.schedule == "zb-h1" else 1) * m + pp - 1)
    print(f"pp={pp}, {args.schedule}, m={m}: formula for equal op times {formula:.1%}")
    print(f"{'run':>3} {'F ms':>7} {'B ms':>7} {'measured':>9} {'simulated':>10} {'diff (points)':>14}")
    with tempfile.TemporaryDirectory() as work:
        for run in range(args.repeats):
            trace, log = os.path.join(work, "t.json"), os.path.join(work, "l.json")
            cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "minipar", "train", "--model", "tiny",
                   "--n-layer", "4", "--d-model", "64", "--seq-len", "64", "--batch-size", "16",
                   "--steps", "3", "--quiet", "--eval-batches", "0", "--pp", "2",
                   "--schedule", args.schedule, "--microbatches", str(m), "--trace", trace,
                   "--log-json", log]
            subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=300)
            meta = json.load(open(trace))["metadata"]
            ops = meta["mean_op_s"]
            diff = (meta["measured_bubble"] - meta["simulated_bubble"]) * 100
            print(f"{run:3d} {ops['F'] * 1e3:7.2f} {ops['B'] * 1e3:7.2f} {meta['measured_bubble']:9.1%} "
                  f"{meta['simulated_bubble']:10.1%} {diff:+14.1f}")


if __name__ == "__main__":
    main()
