"""The whole parity matrix of the llama decoder (n_head 4, n_kv_head 2)
trained 5 steps in fp64 under each layout against the single process.

    PYTHONPATH=$PWD python tests/scripts/llama_parity.py [ROW ...]

Prints, per row, the largest relative difference of the losses and of the final
weights (relative to each array's largest entry) and whether both are <= 1e-9.
The test suite runs a subset (tests/test_llama_layouts.py); this is the whole matrix.
"""
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.cli import train  # noqa: E402

MODEL = ["--model", "llama-tiny", "--n-layer", "4", "--d-model", "32", "--n-head", "4",
         "--n-kv-head", "2", "--seq-len", "16"]
ROWS = {
    "dp2 zero3": (2, ["--dp", "2", "--zero", "3"]),
    "tp2 sp": (2, ["--tp", "2", "--sequence-parallel"]),
    "tp4 (KV heads copied on 2 ranks)": (4, ["--tp", "4"]),
    "tp4 sp (KV heads copied)": (4, ["--tp", "4", "--sequence-parallel"]),
    "pp2 1f1b": (2, ["--pp", "2", "--microbatches", "2"]),
    "pp2 afab": (2, ["--pp", "2", "--schedule", "afab", "--microbatches", "2"]),
    "pp2 zb-h1": (2, ["--pp", "2", "--schedule", "zb-h1", "--microbatches", "2"]),
    "pp2 interleaved": (2, ["--pp", "2", "--schedule", "interleaved", "--chunks", "2",
                            "--microbatches", "2"]),
    "cp2 zig-zag naive": (2, ["--cp", "2"]),
    "cp2 contiguous naive": (2, ["--cp", "2", "--cp-split", "contiguous"]),
    "cp2 zig-zag flash": (2, ["--cp", "2", "--attention", "flash"]),
    "cp2 contiguous flash": (2, ["--cp", "2", "--cp-split", "contiguous", "--attention", "flash"]),
    "flash (1 process)": (1, ["--attention", "flash"]),
    "dp2 zero1": (2, ["--dp", "2", "--zero", "1"]),
    "dp2 zero2": (2, ["--dp", "2", "--zero", "2"]),
    "dp2": (2, ["--dp", "2"]),
    "tp2·cp2 sp zig-zag": (4, ["--tp", "2", "--cp", "2", "--sequence-parallel"]),
    "dp2·tp4 zero3 (KV heads copied)": (8, ["--dp", "2", "--tp", "4", "--zero", "3"]),
    "dp2·tp2·pp2": (8, ["--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "2"]),
    "recompute selective": (1, ["--recompute", "selective"]),
    "recompute full": (1, ["--recompute", "full"]),
}


def max_relative(run, ref):
    (la, pa, _), (lb, pb, _) = run, ref
    loss = float(np.max(np.abs(np.array(la) - lb) / np.abs(lb)))
    weights = max(float(np.abs(pa[n] - pb[n]).max() / np.abs(pb[n]).max()) for n in pb)
    return loss, weights


def main(names):
    tmp = pathlib.Path(tempfile.mkdtemp())
    refs = {}
    print(f"{'layout':36s} {'ranks':>5s} {'loss rel diff':>14s} {'weight rel diff':>16s}  <=1e-9")
    for name in names:
        n, flags = ROWS[name]
        mha = "--n-kv-head" in flags
        key = "mha" if mha else "gqa"
        model = MODEL + (["--n-kv-head", "4"] if mha else [])
        flags = [f for i, f in enumerate(flags) if not (f == "--n-kv-head" or
                                                         (i and flags[i - 1] == "--n-kv-head"))]
        if key not in refs:
            refs[key] = train(tmp / f"single_{key}", "single", 1, model=model, batch=8, timeout=300)
        run = train(tmp / name.replace(" ", "_").replace("·", "x"), "run", n, *flags,
                    model=model, batch=8, timeout=300)
        loss, weights = max_relative(run, refs[key])
        print(f"{name:36s} {n:5d} {loss:14.2e} {weights:16.2e}  {max(loss, weights) <= 1e-9}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(ROWS))
