"""Loss-free bias balancing (``--moe-balance bias``, DeepSeek-V3; nn/moe.py): the bias picks
the experts and leaves their weights to the unbiased probabilities, moves ±rate toward
balance after each step by the global batch's load, is the same under every layout (fp64,
1e-9 against one process) and lives in the checkpoint, so a resume continues exactly."""
import numpy as np
import pytest

from minipar import checkpoint
from minipar.autograd import Tensor
from minipar.nn import GPTConfig
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU
from minipar.nn.moe import MoE, update_selection_bias
from minipar.observe.runlog import step_records
from tests.cli import assert_same_run, train
from tests.mpirun import run_mpi

D, WIDTH, E = 6, 5, 4


def bias_layer(rate=0.1):
    cfg = GPTConfig(arch="llama", d_model=8, n_head=2, moe_experts=E, moe_top_k=2,
                    moe_balance="bias", moe_bias_rate=rate)
    layer = MoE(D, lambda: SwiGLU(D, WIDTH, None, 0.02, Dropout(0.0, None)), None, cfg)
    rng = np.random.default_rng(0)
    for _, p in layer.named_parameters():
        p.data = rng.normal(size=p.shape)
    return layer


def test_the_bias_selects_and_the_unbiased_probabilities_weigh():
    layer = bias_layer()
    x = np.random.default_rng(1).normal(size=(1, 5, D))
    probs = layer.router_probs(Tensor(x)).data[0]                      # (T, E)
    layer.selection_bias = np.array([0.0, 0.0, 0.0, 10.0])            # expert 3 always chosen
    out = layer(Tensor(x)).data[0]
    assert all(3 in row for row in np.argsort(-(probs + layer.selection_bias), axis=-1)[:, :2])
    tokens = x[0]
    for t in range(5):
        pick = np.argsort(-(probs[t] + layer.selection_bias), kind="stable")[:2]
        weights = probs[t, pick] / probs[t, pick].sum()                # unbiased, renormalised
        expected = sum(w * layer.experts[e](Tensor(tokens[t:t + 1])).data[0]
                       for w, e in zip(weights, pick))
        np.testing.assert_allclose(out[t], expected, rtol=1e-12, atol=1e-14)
    assert layer.aux_loss is None                                      # no loss term at all


def test_the_bias_moves_by_rate_toward_the_under_loaded():
    layer = bias_layer(rate=0.1)
    layer.selection_bias = np.array([0.5, 0.0, 0.0, -0.2])
    update_selection_bias(layer, np.array([10.0, 2.0, 6.0, 6.0]))       # mean 6
    np.testing.assert_allclose(layer.selection_bias, [0.4, 0.1, 0.0, -0.2], rtol=0, atol=1e-15)


MODEL = ["--model", "llama-tiny", "--n-layer", "2", "--d-model", "32", "--n-head", "4",
         "--n-kv-head", "2", "--seq-len", "16", "--moe-experts", "4", "--moe-top-k", "2"]
BIAS = ["--moe-balance", "bias", "--moe-bias-rate", "0.05"]   # large: it reroutes in 5 steps


def biases(tmp_path, name):
    ckpt = checkpoint.open_checkpoint(str(tmp_path / name))
    return {n: ckpt.tensor(n, "moe_bias") for n in sorted(ckpt.names("moe_bias"))}


def test_bias_balancing_under_data_parallelism_and_accumulation_is_one_process(tmp_path):
    """fp64, 5 steps: dp 2 × 2 accumulated micro-batches gives the single process's losses,
    weights, Adam state and biases (the load is counted over the whole global batch), and
    the biases moved."""
    single = train(tmp_path, "single", 1, *BIAS, model=MODEL, batch=8)
    spread = train(tmp_path, "spread", 2, "--dp", "2", "--grad-accum", "2", *BIAS,
                   model=MODEL, batch=8)
    assert_same_run(spread, single, rtol=1e-9)
    mine, theirs = biases(tmp_path, "single"), biases(tmp_path, "spread")
    assert sorted(mine) == ["blocks.0.mlp", "blocks.1.mlp"] == sorted(theirs)
    for name in mine:
        np.testing.assert_array_equal(theirs[name], mine[name])
        steps = np.round(mine[name] / 0.05, 9)                  # whole numbers of ±rate
        assert np.all(steps == np.round(steps)) and np.abs(steps).max() > 0, mine[name]
    from minipar.nn.moe import moe_layers
    from minipar.sample import load_model
    model, _ = load_model(str(tmp_path / "single"))      # sampling routes with the bias too
    for name, moe in moe_layers(model):
        np.testing.assert_array_equal(moe.selection_bias, mine[name])


@pytest.mark.slow
def test_bias_balancing_resumes_exactly_under_another_layout(tmp_path):
    """One process stopped at step 3, resumed under dp 2: the losses of the uninterrupted
    run (the biases come back from the checkpoint; without them the losses differ: a
    run with balance none has others)."""
    common = ["-m", "minipar", "train", *MODEL, "--seed", "0", "--quiet", "--eval-batches",
              "0", "--data", "stdlib-bytes", "--precision", "fp64", "--batch-size", "8", "--steps", "6"]

    def losses(name, n, *flags):
        run_mpi(n, [*common, "--log-json", tmp_path / f"{name}.json", *flags], timeout=180)
        return [r["loss"] for r in step_records(tmp_path / f"{name}.json")]
    straight = losses("straight", 1, *BIAS)
    first = losses("first", 1, *BIAS, "--stop-at", "3", "--save", tmp_path / "ck")
    rest = losses("rest", 2, *BIAS, "--dp", "2", "--resume", tmp_path / "ck")
    np.testing.assert_allclose(first + rest, straight, rtol=1e-9, atol=0)
    saved = biases(tmp_path, "ck")
    assert saved and all(np.abs(b).max() > 0 for b in saved.values())
    unbalanced = losses("none", 1, "--moe-balance", "none")
    assert not np.allclose(unbalanced, straight, rtol=1e-6)


@pytest.mark.parametrize("flags, message", [
    (["--moe-bias-rate", "0.01"], "--moe-bias-rate moves the selection bias of --moe-balance bias"),
    (["--moe-balance", "bias", "--moe-bias-rate", "0"], "--moe-bias-rate must be a finite number > 0"),
    (["--moe-balance", "bias", "--moe-aux-coef", "0.1"], "--moe-aux-coef weighs the aux balancing loss"),
])
def test_bias_rate_refusals_are_one_line(flags, message):
    from minipar.cli import build_parser
    from minipar.cli.run_config import config_from_flags
    from minipar.cli_checks import as_flags
    from minipar.config import ConfigError
    args = build_parser().parse_args(["train", *MODEL, *flags])
    with pytest.raises(ConfigError) as refused:
        config_from_flags(args, rank_and_size=(0, 1))
    assert message in as_flags(refused.value) and "\n" not in str(refused.value)
