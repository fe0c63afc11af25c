"""The reshard matrix: save under one layout, resume under others, compare with the
uninterrupted single process (fp64, relative difference of every loss).

    python tests/scripts/reshard_matrix.py [--quick] [--out DIR]

Each of the six layouts trains steps 0-2 and saves at step 3 (``--stop-at 3``); the
checkpoint is resumed under the next two layouts in the list (and, without --quick, a
third), steps 3-5; all six losses must equal the single process's to 1e-9.  The test
suite runs ``--quick`` on a subset (tests/test_checkpoint_reshard.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = ["--model", "tiny", "--n-layer", "4", "--d-model", "32", "--seq-len", "16"]
COMMON = ["--seed", "0", "--quiet", "--eval-batches", "0", "--precision", "fp64",
          "--batch-size", "8", "--steps", "6"]
LAYOUTS = {   # name: (ranks, flags)
    "dp4 z3": (4, ["--dp", "4", "--zero", "3"]),
    "tp2 pp2": (4, ["--tp", "2", "--pp", "2"]),
    "dp2 tp2 sp z2": (4, ["--dp", "2", "--tp", "2", "--sequence-parallel", "--zero", "2"]),
    "cp2 dp2": (4, ["--cp", "2", "--dp", "2"]),
    "pp2 chunks2": (2, ["--pp", "2", "--chunks", "2", "--schedule", "interleaved", "--microbatches", "4"]),
    "single": (1, []),
}
TOLERANCE = 1e-9


def train(name, flags, log, timeout=600):
    n, layout = LAYOUTS[name]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    cmd = ["mpiexec", "-n", str(n), sys.executable, "-m", "minipar", "train", *MODEL, *COMMON,
           *layout, "--log-json", str(log), *map(str, flags)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{name} {' '.join(map(str, flags))}: exit {proc.returncode}\n"
                           f"{proc.stderr[-3000:]}")
    from minipar.observe.runlog import step_records
    return [r["loss"] for r in step_records(log)]


def run(pairs, work):
    """[(saved under, resumed under, max relative difference)] of ``pairs``."""
    reference = train("single", [], os.path.join(work, "reference.json"))
    saved, out = {}, []
    for source, target in pairs:
        if source not in saved:
            ckpt = os.path.join(work, source.replace(" ", "_"))
            first = train(source, ["--stop-at", "3", "--save", ckpt], ckpt + ".json")
            saved[source] = (ckpt, first)
        ckpt, first = saved[source]
        log = os.path.join(work, f"{source}->{target}.json".replace(" ", "_"))
        second = train(target, ["--resume", ckpt], log)
        diff = np.abs(np.array(first + second) / np.array(reference) - 1).max()
        out.append((source, target, float(diff)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one resume per saved layout")
    ap.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args(argv)
    names = list(LAYOUTS)
    hops = (1,) if args.quick else (1, 2, 3)
    pairs = [(a, names[(i + h) % len(names)]) for i, a in enumerate(names) for h in hops]
    with tempfile.TemporaryDirectory() as tmp:
        results = run(pairs, args.out or tmp)
    print(f"{'saved under':<16}{'resumed under':<16}max |loss/single - 1|")
    for a, b, d in results:
        print(f"{a:<16}{b:<16}{d:.2e}  {'ok' if d <= TOLERANCE else 'FAIL'}")
    bad = [r for r in results if r[2] > TOLERANCE]
    print(f"{len(results) - len(bad)}/{len(results)} pairs within {TOLERANCE:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
