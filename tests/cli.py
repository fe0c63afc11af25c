"""Run ``python -m minipar train`` (under mpiexec) and read back its log and checkpoint."""
import json

import numpy as np

from minipar import checkpoint
from minipar.observe.runlog import step_records
from tests.mpirun import run_mpi

SMALL = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16"]
COMMON = ["--seed", "0", "--quiet", "--eval-batches", "0"]


def write_full(directory, params, state, meta):
    """A one-file checkpoint of whole arrays (tests edit checkpoints this way)."""
    whole = lambda a: ((0,) * a.ndim, a.shape)  # noqa: E731
    pieces = [("param", n, a.shape, whole(a), a) for n, a in params.items()]
    for kind, slot in (("adam_m", "m"), ("adam_v", "v")):
        pieces += [(kind, n, a.shape, whole(a), a) for n, a in state.get(slot, {}).items()]
    meta = dict(meta, optimizer_step=state.get("step", 0))
    failure = checkpoint.save(None, directory, meta["step"], meta, pieces)
    assert failure is None, failure


def train(tmp_path, name, nprocs, *flags, steps=5, batch=12, timeout=180, check=True, model=SMALL,
          env=None):
    """Run train (``env``: variables for its ranks); returns (losses, params, optimizer
    state), or the CompletedProcess when check=False."""
    log, ckpt = tmp_path / f"{name}.json", tmp_path / name
    precision = [] if "--precision" in flags else ["--precision", "fp64"]
    # layouts are checked on the byte corpus (a 256-row head: fast); the token data has its own
    data = [] if "--data" in flags else ["--data", "stdlib-bytes"]
    args = ["-m", "minipar", "train", *model, *COMMON, *precision, *data, "--steps", str(steps),
            "--batch-size", str(batch), "--log-json", log, "--save", ckpt, *flags]
    proc = run_mpi(nprocs, args, timeout=timeout, env=env, check=check)
    if not check:
        return proc
    losses = [r["loss"] for r in step_records(log)]
    params, state, meta = checkpoint.load_full(ckpt)
    return losses, params, state


# AdamW's update lr·g/(|g| + eps) is steepest where |g| ≈ eps: there a gradient's
# reduction-order rounding δg (~1e-18 for fp64 sums of ~1e-3 terms) moves the weight by
# up to lr·δg/eps ≈ 5e-3·1e-18/1e-8 = 5e-13.  Seed 0's first step has such a gradient
# (blocks.0.mlp.proj.weight[69, 5]: g = -2.5e-9), so weights agree to 1e-12, not better.
ADAM_EPS_FLOOR = 1e-12
MOMENT_RTOL = 1e-9


def assert_same_run(a, b, rtol=1e-12):
    """The same run, two ways: the same losses (at least one step logged), the same final
    weights and the same optimizer state — its step count, and Adam's m and v for every
    parameter, the same names on both sides.

    Losses to ``rtol``.  Weights relative to each array's scale (rtol · max|w|, at least
    ADAM_EPS_FLOOR): a bias that is ~1e-15 after a few steps from zero has no relative
    precision of its own.  The moments to MOMENT_RTOL of each entry, and in absolute
    terms m to 1e-15 (a gradient's reduction-order rounding is ~1e-18, see above) and
    v to MOMENT_RTOL · max|v| (v sums g², so an entry whose gradient cancels to ~0 keeps
    the square of that rounding)."""
    (la, pa, sa), (lb, pb, sb) = a, b
    assert len(la) > 0 and len(lb) > 0, "a run logged no step"
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=0)
    assert sa["step"] == sb["step"], ("optimizer step", sa["step"], sb["step"])
    names = sorted(pb)
    for what, x, y in (("weights", pa, pb), ("adam m", sa["m"], sb["m"]), ("adam v", sa["v"], sb["v"])):
        assert sorted(x) == names == sorted(y), (what, "names differ", set(x) ^ set(y))
    for name in pb:
        scale = max(float(np.abs(pb[name]).max(initial=0.0)) * rtol, ADAM_EPS_FLOOR)
        np.testing.assert_allclose(pa[name], pb[name], rtol=rtol, atol=scale, err_msg=name)
        np.testing.assert_allclose(sa["m"][name], sb["m"][name], rtol=MOMENT_RTOL, atol=1e-15,
                                   err_msg=f"adam m {name}")
        v_scale = MOMENT_RTOL * float(np.abs(sb["v"][name]).max(initial=0.0))
        np.testing.assert_allclose(sa["v"][name], sb["v"][name], rtol=MOMENT_RTOL, atol=v_scale,
                                   err_msg=f"adam v {name}")
