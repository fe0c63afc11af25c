"""Kill -9 one rank inside a sharded save, N times: the previous checkpoint must stay the
latest and load, and no partial checkpoint may ever be taken for the latest.

    python tests/scripts/kill_during_save.py [--trials 20] [--ranks 4]

Each trial trains dp·ZeRO-3 with --save-every 2 for 6 steps and kills (SIGKILL, via
``MINIPAR_SAVE_FAULT``, ``minipar/train/faults.py``) a random rank at a random point of the save of
step 4 or 6: half way through its file, after its file before the ranks agree, or —
rank 0 — after the index before the rename, or after the rename before ``latest``.
Then: ``latest`` names the step saved before, every committed directory has all the
files its index names, the latest checkpoint loads (all finite), and every 5th trial a
run resumes from it and trains a step.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from minipar import checkpoint  # noqa: E402
from minipar.checkpoint import layout  # noqa: E402

FLAGS = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16", "--seed", "0",
         "--quiet", "--eval-batches", "0", "--batch-size", "8", "--steps", "6", "--zero", "3"]
POINTS = ["file", "report", "commit", "latest"]


def train(ranks, flags, env=None):
    full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO, **(env or {}))
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "minipar", "train", *FLAGS, *flags]
    return subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=300)


def trial(i, ranks, work, rng):
    point = rng.choice(POINTS)
    rank = 0 if point in ("commit", "latest") else rng.randrange(ranks)
    step = rng.choice([4, 6])
    save = os.path.join(work, f"trial{i}")
    proc = train(ranks, ["--save-every", "2", "--save", save],
                 {"MINIPAR_SAVE_FAULT": f"{rank}:{step}:{point}"})
    killed = proc.returncode != 0
    newest = checkpoint.latest(save)
    expected = layout.step_name(step - 2)
    problems = []
    if not killed:
        problems.append("the run was not killed")
    if newest is None or os.path.basename(newest) != expected:
        problems.append(f"latest is {newest}, not {expected}")
    for _, path in layout.committed(save):         # a committed checkpoint is whole
        index = checkpoint.open_checkpoint(path).index
        if sorted(index["files"]) != sorted(f for f in os.listdir(path) if f.endswith(".bin")):
            problems.append(f"{path} lacks files its index names")
    try:
        params, _, meta = checkpoint.load_full(save)
        loads = meta["step"] == step - 2 and all(np.isfinite(a).all() for a in params.values())
    except (OSError, ValueError) as err:
        loads = False
        problems.append(str(err))
    if not loads:
        problems.append("the previous checkpoint does not load")
    resumed = ""
    if i % 5 == 0 and not problems:
        back = train(ranks, ["--resume", save, "--stop-at", str(step - 1)])
        resumed = "resumed ok" if back.returncode == 0 else "RESUME FAILED"
        if back.returncode:
            problems.append(back.stderr[-300:])
    committed = [os.path.basename(p) for _, p in layout.committed(save)]
    print(f"trial {i:2d}: kill rank {rank} at '{point}' of step {step}: latest "
          f"{os.path.basename(newest or 'none')}, committed {committed} {resumed}"
          f"{'  ' + '; '.join(problems) if problems else '  ok'}", flush=True)
    return not problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as work:
        good = sum(trial(i, args.ranks, work, rng) for i in range(args.trials))
    print(f"{good}/{args.trials} trials: the previous checkpoint stayed the latest and loaded")
    return 0 if good == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
