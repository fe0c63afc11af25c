"""Resuming equals not stopping, on the paths the layout tests leave out: an fp16 run's
dynamic loss scaler (its scale, overflow run and clean-step count), and a checkpoint
written in the background (``--save-async``) under tensor parallelism, a pipeline and
ZeRO-3.

Each uninterrupted run saves as it goes; a second run resumes from one of those
checkpoints and must log the same steps and end with the same checkpoint."""
import os

import numpy as np
import pytest

from minipar import checkpoint
from minipar.observe.runlog import step_records
from tests.cli import assert_same_run, train

STEPS = 8


def _step_dir(save, step):
    return os.path.join(save, f"step-{step:07d}")


def _fixed_corpus(tmp_path):
    """A corpus of the test's own (printable bytes from a seeded generator): which steps
    overflow fp16 depends on the data, and the default text, Python's own standard library,
    differs between Python builds."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(np.random.default_rng(0).integers(32, 127, 20_000, dtype=np.uint8).tobytes())
    return str(path)


def test_an_fp16_runs_loss_scaler_resumes_where_it_stopped(tmp_path):
    """A scale of 1e6 overflows fp16 gradients for 3 steps (hysteresis 2: the first
    overflow is tolerated, each later one halves the scale), then a clean step resets the
    hysteresis, one more overflow is tolerated, and clean steps follow.  Resumed after
    step 2 (in an overflow run: 1 overflow left before the next backoff) and after step 7
    (2 clean steps counted towards growth), the scaler goes on as if the run had never
    stopped: the same scale and skips at every step, the same final state."""
    fp16 = ["--precision", "fp16", "--initial-loss-scale", "1e6", "--data", _fixed_corpus(tmp_path)]
    straight = train(tmp_path, "straight", 1, *fp16, "--save-every", "1", "--keep", "0",
                     steps=STEPS)
    scales = [(r["loss_scale"], r["skipped"]) for r in step_records(tmp_path / "straight.json")]
    assert scales == [(1e6, True), (1e6, True), (5e5, True), (2.5e5, False), (2.5e5, True),
                      (2.5e5, False), (2.5e5, False), (2.5e5, False)]
    final = checkpoint.load_full(tmp_path / "straight")[2]["loss_scaler"]
    for stop, state in ((2, dict(scale=5e5, skipped=2, clean_steps=0, overflows_left=1)),
                        (7, dict(scale=2.5e5, skipped=4, clean_steps=2, overflows_left=2))):
        saved = checkpoint.load_full(_step_dir(tmp_path / "straight", stop))[2]["loss_scaler"]
        assert saved == state
        name = f"from{stop}"
        resumed = train(tmp_path, name, 1, *fp16, "--resume", _step_dir(tmp_path / "straight", stop),
                        steps=STEPS)
        assert [(r["loss_scale"], r["skipped"]) for r in step_records(tmp_path / f"{name}.json")] \
            == scales[stop:]
        assert checkpoint.load_full(tmp_path / name)[2]["loss_scaler"] == final
        assert_same_run(resumed, (straight[0][stop:],) + straight[1:])


@pytest.mark.parametrize("n,layout", [
    (2, ["--tp", "2"]),
    (2, ["--pp", "2", "--microbatches", "2"]),
    (2, ["--dp", "2", "--zero", "3"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_an_async_checkpoint_resumes_like_the_run_that_wrote_it(tmp_path, n, layout):
    """The run saves every 2 steps in the background on a slow disk (the write of each
    checkpoint spans the next step, whose optimizer update must wait for it); resumed
    from step 4's, the last 4 steps and the final state equal the run's own."""
    stop = 4
    straight = train(tmp_path, "straight", n, *layout, "--save-async", "--save-every", "2",
                     "--keep", "0", steps=STEPS, batch=8, env={"MINIPAR_SAVE_SLOW_S": "0.2"})
    resumed = train(tmp_path, "resumed", n, *layout, "--resume",
                    _step_dir(tmp_path / "straight", stop), steps=STEPS, batch=8)
    assert_same_run(resumed, (straight[0][stop:],) + straight[1:])
