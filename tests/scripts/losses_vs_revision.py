"""The training losses of this tree against another git revision's, same flags, NumPy backend:

    PYTHONPATH=. python tests/scripts/losses_vs_revision.py main [--precisions fp16,bf16] [--steps 50]

The revision is unpacked with ``git archive`` into a temporary folder (nothing in this
checkout changes) and both trees run ``python -m minipar train --model tiny`` with the
same flags, each from its own root.  Prints, per precision, the largest relative
difference of the per-step losses and whether they are bit-identical; exits 1 if any
exceeds ``--rtol`` (issue 36: a change to where the GPU reads the device must leave the
NumPy numerics as they were).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def losses(root, precision, steps, log):
    env = dict(os.environ, PYTHONPATH=root, MINIPAR_BACKEND="numpy")
    subprocess.run([sys.executable, "-m", "minipar", "train", "--model", "tiny", "--precision", precision,
                    "--steps", str(steps), "--quiet", "--eval-batches", "0", "--log-json", log],
                   cwd=root, env=env, check=True, capture_output=True)
    sys.path.insert(0, HERE)
    from minipar.runlog import step_records
    return np.array([r["loss"] for r in step_records(log)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("revision")
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rtol", type=float, default=1e-6)
    args = ap.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        os.mkdir(base)
        archive = subprocess.run(["git", "archive", args.revision], cwd=HERE, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        for precision in args.precisions.split(","):
            before = losses(base, precision, args.steps, os.path.join(tmp, f"before_{precision}.json"))
            after = losses(HERE, precision, args.steps, os.path.join(tmp, f"after_{precision}.json"))
            rel = float(np.max(np.abs(after - before) / np.abs(before)))
            worst = max(worst, rel)
            print(f"{precision}: {len(after)} steps, max relative loss difference vs {args.revision} "
                  f"{rel:.1e}{' (bit-identical)' if np.array_equal(after, before) else ''}; "
                  f"last loss {after[-1]:.6f}")
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
