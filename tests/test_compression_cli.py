"""Gradient compression through `train`: the flags, the per-step bytes in the log, the
per-rank state in checkpoints (a resumed run continues exactly), and what is refused."""
import numpy as np
import pytest

from minipar.config import ConfigError, TrainConfig
from minipar.observe.runlog import step_records
from tests.cli import train

FLAGS = ["--compression-start", "1"]


@pytest.mark.parametrize("method", ["topk", "powersgd"])
def test_resume_with_compression_state_is_exact(tmp_path, method):
    full = train(tmp_path, "full", 2, "--grad-compression", method, *FLAGS, steps=6)
    train(tmp_path, "first", 2, "--grad-compression", method, *FLAGS, "--stop-at", "3", steps=6)
    second = train(tmp_path, "second", 2, "--grad-compression", method, *FLAGS,
                   "--resume", tmp_path / "first", steps=6)
    np.testing.assert_allclose(second[0], full[0][3:], rtol=1e-12)
    records = step_records(tmp_path / "full.json")
    assert records[-1]["wire_bytes"] > 0 and records[-1]["compression_ratio"] > 2


@pytest.mark.parametrize("fields,message", [
    (dict(grad_compression="int8", zero=1), "with `zero` 1 is not supported"),
    (dict(grad_compression="topk", precision="fp16"), "with `precision` fp16 is not supported"),
    (dict(grad_compression="topk", compression_ratio=0.0), "`compression_ratio` must be in (0, 1]"),
    (dict(grad_compression="powersgd", powersgd_rank=0), "`powersgd_rank` must be >= 1"),
    (dict(powersgd_rank=8), "`powersgd_rank` sets gradient compression"),
    (dict(grad_compression="zip"), "`grad_compression` must be one of"),
])
def test_bad_compression_settings_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(model="tiny", **fields).resolve(world_size=2)
