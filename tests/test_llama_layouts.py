"""The llama decoder (n_head 4, n_kv_head 2) under the layouts, against one process, in
fp64: losses and final weights to 1e-9 relative (each array to its largest entry).
A fast subset (~45 s on 2 cores); tests/scripts/llama_parity.py runs the whole matrix
(dp and ZeRO 1/2/3, tp, pp under every schedule, cp, recompute, compositions).
Also: key/value heads copied over tp ranks cut and join back; refusals."""
import numpy as np
import pytest

from minipar.config import ConfigError, TrainConfig
from minipar.observe.runlog import step_records
from minipar.parallel.placement import Placement
from minipar.parallel.tensor.sharding import Shard
from tests.cli import train
from tests.scripts.llama_parity import MODEL, max_relative

@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single"), "single", 1, model=MODEL, batch=8)


@pytest.mark.parametrize("n,flags", [
    # tp 4 > n_kv_head 2: each KV head copied on two ranks, gradients summed over the pair
    (4, ["--tp", "4", "--sequence-parallel"]),
    (2, ["--pp", "2", "--schedule", "interleaved", "--chunks", "2", "--microbatches", "2",
         "--recompute", "selective"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_llama_layout_parity(tmp_path, single, n, flags):
    loss, weights = max_relative(train(tmp_path, "run", n, *flags, model=MODEL, batch=8,
                                       timeout=240), single)
    assert loss <= 1e-9 and weights <= 1e-9, (loss, weights)


@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_llama_context_parallel_rotates_true_positions(tmp_path, single, attention):
    """Zig-zag cp2 holds chunks (0, 3) and (1, 2): RoPE at local positions 0..7 would
    change the loss; at the true ones it is the single process's.  The ring carries K/V
    with their 2 KV heads (tests/scripts/ring_gqa.py counts the bytes)."""
    run = train(tmp_path, "cp", 2, "--cp", "2", "--attention", attention, model=MODEL, batch=8)
    loss, weights = max_relative(run, single)
    assert loss <= 1e-9 and weights <= 1e-9, (loss, weights)


@pytest.mark.parametrize("precision", ["fp16"])     # bf16: the same path, unscaled
def test_llama_trains_in_half_precision(tmp_path, single, precision):
    losses, _, _ = train(tmp_path, precision, 1, "--precision", precision, model=MODEL, batch=8)
    np.testing.assert_allclose(losses, single[0], rtol=2e-2)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("tp", [4, 8])
def test_copied_kv_heads_cut_and_join_back(tp):
    """n_kv_head 2 over tp ranks: rank r holds head r // (tp/2); join reads one copy."""
    full = np.arange(3 * 2 * 4, dtype=float).reshape(3, 8)      # 2 heads of 4 columns
    spec = Shard(1, replicas=tp // 2)
    pieces = [spec.local(full, r, tp, module=np) for r in range(tp)]
    for r, piece in enumerate(pieces):
        head = r // (tp // 2)
        np.testing.assert_array_equal(piece, full[:, 4 * head:4 * head + 4])
        box = Placement("k", (3, 8), spec, r, tp).boxes()
        assert box == [((0, 4 * head), (3, 4))]
    np.testing.assert_array_equal(spec.join(pieces), full)


BASE = dict(model="llama-tiny", n_layer=2, d_model=32, n_head=4, n_kv_head=2, seq_len=16,
            precision="fp64")


@pytest.mark.parametrize("overrides,world,message", [
    (dict(tp=3, n_head=6, d_model=48, n_kv_head=2, d_ff=96), 3, "one must divide the other"),
    (dict(tp=2, d_ff=33), 2, "the SwiGLU width `d_ff` = 33 is not divisible by `tp` 2"),
])
def test_llama_layouts_refused_before_any_message(overrides, world, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**{**BASE, **overrides}).resolve(world_size=world)


def test_llama_saved_with_copied_kv_heads_resumes_under_other_layouts(tmp_path):
    """tp4 with 2 KV heads holds each KV head on two ranks: the checkpoint keeps one copy
    (the first holder writes it) and a resume under dp2 ZeRO-3 or one process reads it
    back: the losses of the uninterrupted run."""
    from minipar.checkpoint import open_checkpoint
    from tests.mpirun import run_mpi
    common = ["-m", "minipar", "train", *MODEL, "--seed", "0", "--quiet", "--eval-batches", "0", "--data", "stdlib-bytes",
              "--precision", "fp64", "--batch-size", "8", "--steps", "6"]

    def losses(n, name, *flags):
        run_mpi(n, [*common, "--log-json", tmp_path / f"{name}.json", *flags], timeout=240)
        return [r["loss"] for r in step_records(tmp_path / f"{name}.json")]
    straight = losses(1, "straight")
    first = losses(4, "tp4", "--tp", "4", "--stop-at", "3", "--save", tmp_path / "ck")
    k_proj = open_checkpoint(tmp_path / "ck").entry("param", "blocks.0.attn.k_proj.weight")
    assert len(k_proj["pieces"]) == 2                     # 2 KV heads, each written once
    for n, flags in ((2, ["--dp", "2", "--zero", "3"]), (1, [])):
        rest = losses(n, f"resume{n}", *flags, "--resume", tmp_path / "ck")
        np.testing.assert_allclose(first + rest, straight, rtol=1e-9, atol=0)
