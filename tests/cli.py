"""Run ``python -m minipar train`` (under mpiexec) and read back its log and checkpoint."""
import json

import numpy as np

from minipar import checkpoint
from minipar.monitor import step_records
from tests.mpirun import run_mpi

SMALL = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16"]
COMMON = ["--seed", "0", "--quiet", "--eval-batches", "0"]


def train(tmp_path, name, nprocs, *flags, steps=5, batch=12, timeout=180, check=True, model=SMALL):
    """Run train; returns (losses, params, optimizer state), or the CompletedProcess
    when check=False."""
    log, ckpt = tmp_path / f"{name}.json", tmp_path / name
    precision = [] if "--precision" in flags else ["--precision", "fp64"]
    args = ["-m", "minipar", "train", *model, *COMMON, *precision, "--steps", str(steps),
            "--batch-size", str(batch), "--log-json", log, "--save", ckpt, *flags]
    proc = run_mpi(nprocs, args, timeout=timeout, check=check)
    if not check:
        return proc
    losses = [r["loss"] for r in step_records(log)]
    params, state, meta = checkpoint.load(ckpt)
    return losses, params, state


def assert_same_run(a, b, rtol=1e-12):
    """Same losses and the same final weights and Adam moments, to ``rtol``.  Weights are
    compared relative to each array's scale (rtol · max|w|, at least 1e-14): a bias that
    is ~1e-15 after a few steps from zero has no relative precision of its own."""
    (la, pa, sa), (lb, pb, sb) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=0)
    for name in pa:
        scale = max(float(np.abs(pb[name]).max(initial=0.0)) * rtol, 1e-14)
        np.testing.assert_allclose(pa[name], pb[name], rtol=rtol, atol=scale, err_msg=name)
        np.testing.assert_allclose(sa["m"][name], sb["m"][name], rtol=1e-9, atol=1e-15, err_msg=name)
