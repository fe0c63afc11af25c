"""Load balancing: a rank slowed 2x, tokens/s without and with ``--balance``, and the ideal.

    python benchmarks/balance.py [--np 2] [--slow 1:2] [--steps 30] [--repeats 2]
                                 [--batch-size 24] [--seq-len 64] [--d-model 64]

A synchronous data-parallel step lasts as long as its slowest replica.  With rank 1
slowed by F (``MINIPAR_SLOW_RANK=1:F``: it sleeps (F-1)x its forward+backward), even
shares make every step wait for it; ``--balance`` gives each replica rows in proportion
to its measured speed (minipar/train/balance.py), so both finish together.

    speed of rank i       v_i = its rows / its forward+backward seconds
    ideal                 sum_i v_i            (nobody waits, communication free)
    even shares           dp * min_i v_i       (everyone at the slowest's pace)

For F = 2 on 2 ranks: ideal = 1.5 v, even = v, so balancing can win at most 1.5x.  The
speeds are measured in the run without balancing (per-rank ``compute_s`` of its log), so
the ideal and the two runs come from one invocation; the two runs are interleaved
``--repeats`` times so a load spike on a shared machine hits both alike, and the ratios are
taken within each repeat (a run and its baseline side by side), then their median.  The first
``--skip`` steps (warm-up, and the balancer's first measurements: it re-shares every 5
steps) are left out; figures are medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def run(np_, flags, slow, log, timeout=600):
    env = dict(os.environ, MINIPAR_SLOW_RANK=slow, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", str(np_), sys.executable, "-m", "minipar", "train", *flags,
           "--log-json", log, "--quiet", "--eval-batches", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    from minipar.observe.runlog import read_log
    header, steps, _ = read_log(log)
    return header, steps


def speeds(header, steps, np_):
    """Per-rank tokens/s of forward+backward alone, from an even-shares run's log."""
    per_rank_tokens = header["tokens_per_step"] / np_
    return [statistics.median(per_rank_tokens / r["per_rank"]["compute_s"][i] for r in steps)
            for i in range(np_)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--slow", default="1:2", help="MINIPAR_SLOW_RANK: RANK:FACTOR")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=4)
    a = ap.parse_args(argv)
    flags = ["--model", "tiny", "--n-layer", str(a.n_layer), "--d-model", str(a.d_model),
             "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
             "--steps", str(a.steps), "--precision", "fp32"]
    pairs = []                      # (even, balanced, ideal) tokens/s of one repeat
    shares = None
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            row = {}
            for name, extra in (("even", []), ("balanced", ["--balance"])):
                header, steps = run(a.np, flags + extra, a.slow, os.path.join(tmp, f"{name}{rep}.json"))
                kept = steps[a.skip:]
                row[name] = statistics.median(r["tokens_per_s"] for r in kept)
                if name == "even":
                    row["ideal"] = sum(speeds(header, kept, a.np))
                else:
                    shares = kept[-1].get("batch_shares")
            pairs.append((row["even"], row["balanced"], row["ideal"]))
    print(f"{a.np} ranks, MINIPAR_SLOW_RANK={a.slow}, batch {a.batch_size} x {a.seq_len} tokens, "
          f"d_model {a.d_model}, {a.n_layer} layers; median of steps {a.skip}..{a.steps - 1}")
    print(f"{'repeat':>6} {'even tok/s':>11} {'--balance':>10} {'ideal':>10} {'balance/even':>13} "
          f"{'balance/ideal':>14}")
    for i, (e, b, ideal) in enumerate(pairs):
        print(f"{i:>6} {e:11,.0f} {b:10,.0f} {ideal:10,.0f} {b / e:12.2f}x {b / ideal:13.0%}")
    med = lambda k: statistics.median(p[k] for p in pairs)        # noqa: E731
    ratio = statistics.median(b / e for e, b, _ in pairs)
    print(f"median {med(0):11,.0f} {med(1):10,.0f} {med(2):10,.0f} {ratio:12.2f}x "
          f"{statistics.median(b / i for _, b, i in pairs):13.0%}   (ideal/even "
          f"{statistics.median(i / e for e, _, i in pairs):.2f}x; at most 1.5x for one rank 2x slow)")
    print(f"--balance shares at the end of the last run: {shares}")

if __name__ == "__main__":
    main()
