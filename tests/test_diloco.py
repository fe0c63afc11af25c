"""DiLoCo (``--outer diloco``): the outer step against NumPy's Algorithm 1, one group as
the plain run, two groups independent of the layout inside them, the log's outer fields,
and the refusals.  All in fp64: the exact cases agree to 1e-9 or better."""
import re

import numpy as np
import pytest

from minipar.config import ConfigError, TrainConfig
from minipar.observe.runlog import step_records
from tests.mpirun import run_mpi

MODEL = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16",
         "--precision", "fp64", "--batch-size", "8", "--quiet", "--eval-batches", "1"]
DILOCO = ["--outer", "diloco", "--diloco-groups", "2", "--inner-steps", "3"]


def run(tmp_path, name, n, *flags, steps=7):
    log = tmp_path / f"{name}.json"
    proc = run_mpi(n, ["-m", "minipar", "train", *MODEL, "--steps", str(steps),
                       "--log-json", log, *flags], timeout=240)
    return step_records(log), proc.stdout


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("plain"), "plain", 1)[0]


@pytest.fixture(scope="module")
def one_rank_per_group(tmp_path_factory):
    """2 groups of one rank, 9 steps, H = 3: outer steps after steps 2, 5 and 8."""
    return run(tmp_path_factory.mktemp("diloco"), "g2", 2, *DILOCO, steps=9)


def test_outer_step_is_algorithm_1_in_numpy():
    """H = 5, lr 0.7, Nesterov 0.9, given the groups' weights: replicated and sharded
    inner layouts, and the streaming form (2 fragments, tau 1, alpha 0.5); int8 and bf16
    outer compression keep error feedback's identity (the script exits 1 otherwise)."""
    proc = run_mpi(4, ["tests/scripts/diloco_outer.py"], timeout=120)
    assert proc.stdout.count("max |minipar - numpy| = 0") == 3, proc.stdout
    sent = dict(re.findall(r"(\w+) error feedback: .* bytes per outer step (\d+)", proc.stdout))
    assert int(sent["int8"]) < int(sent["bf16"]), proc.stdout   # 1 byte (+ scales) vs 2


@pytest.mark.parametrize("inner_steps", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_one_group_at_outer_lr_1_without_momentum_is_the_plain_run(tmp_path, plain_run,
                                                                   inner_steps):
    plain = plain_run
    one, _ = run(tmp_path, f"one{inner_steps}", 1, "--outer", "diloco", "--diloco-groups", "1",
                 "--inner-steps", str(inner_steps), "--outer-lr", "1", "--outer-momentum", "0")
    np.testing.assert_allclose([r["loss"] for r in one], [r["loss"] for r in plain],
                               rtol=0, atol=1e-9)
    assert [r["outer_step"] for r in one] == [(s + 1) % inner_steps == 0 or s == 6
                                             for s in range(7)]


def _compare(base, other):
    np.testing.assert_allclose([r["loss"] for r in other], [r["loss"] for r in base],
                               rtol=0, atol=1e-9)
    outer = [r for r in base if r["outer_step"]]
    np.testing.assert_allclose([r["loss_global"] for r in other if r["outer_step"]],
                               [r["loss_global"] for r in outer], rtol=0, atol=1e-9)


def _predicted_state(path, world_size):
    """The memory model's model-state bytes for the run logged at ``path``."""
    from minipar.observe.runlog import read_log
    from minipar.perf.memory import model_state_bytes
    config = TrainConfig(**read_log(path)[0]["config"]).resolve(world_size)
    return model_state_bytes(config.model_config(), config)


def test_two_groups_dp2_inside_equal_one_rank_per_group(tmp_path, one_rank_per_group):
    base, _ = one_rank_per_group
    dp2, _ = run(tmp_path, "g2dp2", 4, *DILOCO, steps=9)
    _compare(base, dp2)
    # the memory model counts the outer θ and momentum: each replica keeps half of them
    assert dp2[0]["model_state_bytes"] == _predicted_state(tmp_path / "g2dp2.json", 4)
    # the groups differ between outer steps (each on its own rows), and the log says so
    assert any(r["outer_step"] and r["group_loss"] != r["loss_global"] for r in base)
    assert [r["outer_step"] for r in base] == [False, False, True] * 3
    # the first outer step: each of the 2 ranks sends its weights' bytes once (a ring
    # all-reduce over 2 ranks sends one half and receives the other, twice)
    assert base[2]["outer_bytes"] == 2 * base[2]["model_state_bytes"]["params"]
    assert "outer_bytes" not in base[0]         # nothing crossed between groups


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--tp", "2"], ["--zero", "1"], ["--pp", "2"], ["--cp", "2"]],
                         ids=["tp2", "zero1", "pp2", "cp2"])
def test_two_groups_other_layouts_inside(tmp_path, one_rank_per_group, layout):
    base, _ = one_rank_per_group
    other, _ = run(tmp_path, "other", 4, *DILOCO, *layout, steps=9)
    _compare(base, other)
    assert other[0]["model_state_bytes"] == _predicted_state(tmp_path / "other.json", 4)


@pytest.mark.parametrize("fields,world,message", [
    (dict(inner_steps=0), 2, "`inner_steps` must be >= 1"),
    (dict(diloco_groups=3), 4, "`diloco_groups` 3 must divide the data-parallel size dp = 4"),
    (dict(diloco_fragments=3, inner_steps=6, n_layer=2), 2, "`diloco_fragments` 3 is more than the model's 2 layers"),
    (dict(balance=True), 2, "`outer` diloco with `balance` is not supported"),
])
def test_bad_diloco_settings_are_refused(fields, world, message):
    config = TrainConfig(model="tiny", outer="diloco", **fields)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.resolve(world_size=world)


def test_diloco_settings_need_outer_diloco():
    with pytest.raises(ConfigError, match="`inner_steps` belongs to DiLoCo; add `outer` diloco"):
        TrainConfig(model="tiny", inner_steps=10).resolve(world_size=2)


def test_refused_in_one_line_before_any_message(tmp_path):
    """Under mpiexec every rank stops at the check, before the first collective: one
    line, exit 2."""
    proc = run_mpi(2, ["-m", "minipar", "train", *MODEL, "--steps", "2", "--outer", "diloco",
                       "--diloco-groups", "2", "--inner-steps", "0"], timeout=120, check=False)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if "inner-steps" in ln or "inner_steps" in ln]
    assert lines and "must be >= 1" in lines[0], proc.stderr


def test_resume_under_another_inner_layout_continues_exactly(tmp_path, one_rank_per_group):
    """Stopped at outer step 6 with one rank per group, resumed with dp2 inside each
    group: steps 6-8 are those of the uninterrupted run."""
    full, _ = one_rank_per_group
    run(tmp_path, "first", 2, *DILOCO, "--stop-at", "6", "--save", tmp_path / "ckpt", steps=9)
    second, _ = run(tmp_path, "second", 4, *DILOCO, "--resume", tmp_path / "ckpt", steps=9)
    assert [r["step"] for r in second] == [6, 7, 8]
    _compare(full[6:], second)


@pytest.mark.slow
def test_resume_under_another_group_count_keeps_the_outer_state(tmp_path):
    """A checkpoint of 2 groups resumed as one group: the weights are the saved global
    weights and the outer momentum the saved one (and nonzero)."""
    from minipar.checkpoint import open_checkpoint
    from minipar.config import prepare
    from minipar.train import setup
    run(tmp_path, "first", 2, *DILOCO, "--stop-at", "6", "--save", tmp_path / "ckpt", steps=9)
    config = TrainConfig(model="tiny", n_layer=2, d_model=32, seq_len=16, precision="fp64",
                         batch_size=8, steps=9, quiet=True, outer="diloco", diloco_groups=1,
                         inner_steps=3, resume=str(tmp_path / "ckpt"))
    resumed = setup(prepare(config, 1), prepared=True)
    ckpt = open_checkpoint(str(tmp_path / "ckpt"))
    momentum, slots = resumed.outer.slot_momentum(), resumed.optimizer.sync.slots
    for name, r in resumed.optimizer.sync.slot_ranges().items():
        n = r.hi - r.lo
        np.testing.assert_array_equal(momentum[r.slot][r.start:r.start + n],
                                      ckpt.tensor(name, "outer_momentum").reshape(-1))
        np.testing.assert_array_equal(slots[r.slot].master[r.start:r.start + n],
                                      ckpt.tensor(name, "param").reshape(-1))
    assert any(np.abs(m).max() > 0 for m in momentum)
    ckpt.close()


def test_performance_model_prices_the_outer_step_on_the_slow_link():
    """On a profile whose link between nodes is 100 Mbit/s, DiLoCo's step approaches its
    inner step as H grows and beats data parallelism, whose all-reduce crosses the link
    every step; the bytes of an outer step are a ring all-reduce's of the fp32 model
    over 2 groups, from every rank."""
    import dataclasses
    from minipar.perf.diloco import compare, price
    from minipar.perf.estimate import predict
    from minipar.perf.memory import numel
    from minipar.perf.profile import load_profile
    cpu = load_profile("cpu")
    slow = dataclasses.replace(cpu, ranks_per_node=2, collectives={},
                               links=dict(cpu.links, inter={"alpha": 1e-3, "bw": 100e6 / 8}))
    config = TrainConfig(model="tiny", vocab_size=256, outer="diloco", diloco_groups=2,
                         inner_steps=10).resolve(4)
    steps = [price(dataclasses.replace(config, inner_steps=H), slow, 2) for H in (10, 100)]
    assert steps[0].where == "inter"
    assert steps[0].step_s > steps[1].step_s > steps[1].inner_s
    ddp = predict(dataclasses.replace(config, outer="none"), slow, 2).step_s
    assert steps[1].step_s < ddp
    psi = numel(config.model_config())
    assert steps[0].outer_bytes == pytest.approx(4 * 2 * (1 / 2) * (psi / 2) * 4)
    assert "DiLoCo H=50" in compare(config, slow, 2)
