"""A mixture of experts against the dense llama of equal active parameters, on the
standard library's BPE tokens: equal steps, then equal wall time.

    python benchmarks/moe_vs_dense.py [--steps 300] [--model llama-tiny] [--experts 8] [--top-k 2]

The MoE model routes each token to k of E SwiGLU experts of width f (the preset's
d_ff); the dense model has one SwiGLU of width k·f, so a token meets the same weights
in both (the router's d·E aside) while the MoE holds E/k times the MLP parameters.
Runs, one process each, one after the other (each has the machine to itself, as far as
the machine is idle): dense, MoE with each balancing mode (aux, bias, none), all for
``--steps``; then dense again for as many steps as fit in the aux run's wall time.
Prints val bits per byte, wall time and, per MoE run, the expert load (max/mean tokens
per expert, per layer, over the last fifth of the steps: 1 is even, E/k is every token
on the same k experts).  Timing is the machine's: say how loaded it was.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(log, steps, model, extra):
    cmd = [sys.executable, "-m", "minipar", "train", "--model", model, "--steps", str(steps),
           "--quiet", "--log-json", log, *map(str, extra)]
    subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=REPO), check=True, capture_output=True,
                   text=True)
    with open(log) as f:
        records = [json.loads(line) for line in f]
    final = records[-1]["final"]
    steps_rec = [r for r in records if "step" in r and "loss" in r]
    return final, steps_rec


def load_table(steps_rec):
    """Per MoE layer, the mean over the last fifth of the steps of max/mean load."""
    tail = steps_rec[-max(len(steps_rec) // 5, 1):]
    layers = [r["experts"] for r in tail if r.get("experts")]
    if not layers:
        return None
    return [float(np.mean([step[i]["load_max_mean"] for step in layers]))
            for i in range(len(layers[0]))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--model", default="llama-tiny")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    a = ap.parse_args()
    from minipar.nn.gpt import config_from_preset
    width = config_from_preset(a.model).ffn_width
    moe = ["--moe-experts", a.experts, "--moe-top-k", a.top_k]
    runs = [("dense, d_ff k·f", ["--d-ff", a.top_k * width]),
            ("MoE aux", moe + ["--moe-balance", "aux"]),
            ("MoE bias", moe + ["--moe-balance", "bias"]),
            ("MoE none", moe + ["--moe-balance", "none"])]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in runs:
            out[name] = train(os.path.join(tmp, "run.json"), a.steps, a.model, extra)
            print(f"  {name}: done", file=sys.stderr, flush=True)
        wall = out["MoE aux"][0]["wall_s"]
        per_step = out["dense, d_ff k·f"][0]["wall_s"] / a.steps
        same_time = max(int(wall / per_step), 1)
        out[f"dense, {same_time} steps (aux's wall time)"] = train(
            os.path.join(tmp, "run.json"), same_time, a.model, runs[0][1])
    print(f"{a.model}: MoE {a.experts} experts top-{a.top_k} of width {width} against a dense "
          f"SwiGLU of width {a.top_k * width}; {a.steps} steps, one process each")
    print(f"{'run':42s} {'val bits/byte':>13s} {'wall s':>8s}  expert load max/mean per layer")
    for name, (final, steps_rec) in out.items():
        load = load_table(steps_rec)
        shown = "" if load is None else " ".join(f"{x:.2f}" for x in load)
        print(f"{name:42s} {final['val_bits_per_byte']:13.3f} {final['wall_s']:8.1f}  {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
