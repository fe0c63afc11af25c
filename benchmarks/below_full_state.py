"""A model whose full training state no rank ever holds: train, save, resume elsewhere.

    python benchmarks/below_full_state.py [--model gpt2] [--steps 4] [--data stdlib-bytes]

The full training state of an fp32 run with AdamW is 16 bytes a parameter (weights,
gradients, m, v).  Three runs of the same model and data:

    A  one process, --steps N, uninterrupted                       (the oracle)
    B  4 ranks, dp4 ZeRO-3, stops after N/2 steps and saves (sharded: every rank its part)
    C  4 ranks, tp2 x pp2, resumes B's checkpoint (each rank reads only its boxes), to N

Printed: the full state, each run's peak RSS per rank (``/usr/bin/time``), whether every
rank of B and C stayed below the full state, and the largest relative difference of
B + C's losses from A's (fp32: a different layout sums in another order, ~1e-6).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2 ** 20


def run(ranks, flags, log):
    cmd = ["mpiexec", "-n", str(ranks), "/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable,
           "-m", "minipar", "train", "--quiet", "--eval-batches", "0", "--log-json", log, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rss = [int(k) * 1024 for k in re.findall(r"maxrss_kb=(\d+)", proc.stderr)]
    losses = [r["loss"] for r in map(json.loads, open(log)) if "loss" in r]
    return rss, losses


def full_state_bytes(model, data):
    sys.path.insert(0, ROOT)
    from minipar.config import TrainConfig, preflight
    from minipar.nn import make_model
    cfg = preflight(TrainConfig(model=model, data=data)).resolve(1).model_config()
    return 16 * make_model(cfg, materialize=False).num_parameters()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--data", default="stdlib-bytes")
    args = ap.parse_args()
    common = ["--model", args.model, "--seq-len", "64", "--batch-size", "4", "--data", args.data,
              "--steps", str(args.steps)]
    state = full_state_bytes(args.model, args.data)
    print(f"{args.model}: full training state (fp32 weights, gradients, AdamW m and v) "
          f"{state / MiB:.0f} MiB\n")
    with tempfile.TemporaryDirectory() as work:
        ck = os.path.join(work, "ck")
        a_rss, a = run(1, common, os.path.join(work, "a.json"))
        b_rss, b = run(4, common + ["--zero", "3", "--stop-at", str(args.steps // 2), "--save", ck],
                       os.path.join(work, "b.json"))
        c_rss, c = run(4, common + ["--tp", "2", "--pp", "2", "--resume", ck], os.path.join(work, "c.json"))
    for name, rss in (("A one process", a_rss), ("B dp4 ZeRO-3 + save", b_rss),
                      ("C tp2 x pp2 from B's checkpoint", c_rss)):
        print(f"{name:<32} peak RSS per rank, MiB: {', '.join(f'{r / MiB:.0f}' for r in rss)}"
              f"   largest / full state {max(rss) / state:.2f}")
    below = max(b_rss + c_rss) < state
    print(f"\nevery rank of B and C below the full state: {below}")
    diff = max(abs(x - y) / abs(y) for x, y in zip(b + c, a))
    print(f"losses A:     {' '.join(f'{x:.6f}' for x in a)}\nlosses B + C: "
          f"{' '.join(f'{x:.6f}' for x in b + c)}\nlargest relative difference {diff:.1e} "
          f"({len(b)} + {len(c)} steps against {len(a)})")


if __name__ == "__main__":
    main()
