"""The gradient bucket size the performance model chooses (perf/bucket_size.py): small
buckets where a slow link makes the last bucket's all-reduce the exposed cost, the
largest where nothing is gained by cutting the gradient; decided from the configuration
and the profile only (no measurement), and recorded in the run's log and checkpoint."""
import dataclasses
import json
import os

from minipar import checkpoint

from minipar.config import TrainConfig
from minipar.parallel.buckets import DEFAULT_BUCKET_MB
from minipar.perf.bucket_size import CANDIDATES_MB, TIE
from minipar.perf.estimate import choose_bucket_mb, predict
from minipar.perf.profile import load_profile
from tests.cli import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "benchmarks", "recorded", "cluster_2026-12-07c", "profile_tokens.json")


def small_dp2():
    return TrainConfig(model="small", batch_size=16, dp=2, steps=25).resolve(2)


def test_across_a_slow_link_the_model_cuts_the_gradient_into_small_buckets():
    """2 nodes x 1 rank over the simulated 1 Gbit/s link (a calibrated profile): the small
    model's whole gradient in one 25 MiB bucket is all exposed; sub-MiB buckets hide most."""
    prof = load_profile(CLUSTER)
    chosen, steps = choose_bucket_mb(small_dp2(), prof, ranks_per_node=1)
    assert chosen <= 1.0, (chosen, steps)
    assert steps[chosen] < 0.9 * steps[DEFAULT_BUCKET_MB], steps


def test_on_one_node_nothing_is_gained_and_the_largest_is_kept():
    """Two ranks filling one node's cores: nothing overlaps, every bucket costs its α,
    so the fewest buckets win (what the run used before the model chose)."""
    chosen, steps = choose_bucket_mb(small_dp2(), load_profile("cpu"), ranks_per_node=2)
    assert chosen == DEFAULT_BUCKET_MB, steps


def test_the_choice_is_the_fastest_prediction_and_the_largest_of_the_ties():
    prof = load_profile(CLUSTER)
    config = small_dp2()
    chosen, steps = choose_bucket_mb(config, prof, ranks_per_node=1)
    assert set(steps) == set(CANDIDATES_MB)
    again = {mb: predict(dataclasses.replace(config, bucket_mb=mb), prof, 1).step_s
             for mb in CANDIDATES_MB}
    assert again == steps                       # nothing measured: the same numbers again
    best = min(steps.values())
    assert steps[chosen] <= best * (1 + TIE)
    assert all(steps[mb] > best * (1 + TIE) for mb in CANDIDATES_MB if mb > chosen)


def test_predict_without_a_size_prices_the_size_a_run_would_choose():
    prof = load_profile(CLUSTER)
    config = small_dp2()
    assert config.bucket_mb is None            # resolve leaves it to the run
    chosen, steps = choose_bucket_mb(config, prof, ranks_per_node=1)
    assert predict(config, prof, 1).step_s == steps[chosen]


def test_the_run_records_its_bucket_size(tmp_path):
    """The header says it, the JSON log's header and the checkpoint's config keep it."""
    proc = train(tmp_path, "run", 2, "--dp", "2", steps=1, batch=8, check=False)
    assert proc.returncode == 0, proc.stderr
    log = json.loads((tmp_path / "run.json").read_text().splitlines()[0])["header"]
    assert log["bucket_mb"] in CANDIDATES_MB, log
    assert log["bucket_source"] == "chosen by the performance model"
    assert log["config"]["bucket_mb"] == log["bucket_mb"]
    _, _, meta = checkpoint.load_full(tmp_path / "run")
    assert meta["config"]["bucket_mb"] == log["bucket_mb"]
