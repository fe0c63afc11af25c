"""Tensor (and sequence) parallelism: validation, sharding, layer and whole-GPT parity.

Layer checks run as one ``mpiexec`` launch per tp size (tests/scripts/tp_layers.py), each
batching many comparisons against the single-process layers in float64; whole-GPT
training runs ``minipar train`` (tests/cli.py) against one process.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipar.observe.runlog import step_records
from minipar.nn import GPT, GPTConfig
from minipar.parallel.tensor import Shard, check_tensor_parallel, to_tensor_parallel
from tests.cli import assert_same_run, train
from tests.mpirun import run_mpi


class NoMessages:
    """A stand-in communicator: any attempt to communicate fails (AttributeError)."""

    def __init__(self, size, rank=0):
        self.size, self.rank = size, rank


CFG = GPTConfig(vocab_size=64, seq_len=8, n_layer=1, d_model=16, n_head=4)


@pytest.mark.parametrize("overrides,tp,sp,match", [
    ({}, 3, False, "`n_head` 4 is not divisible by `tp` 3"),
    ({"n_head": 6, "d_model": 18}, 4, False, r"`tp` in \[1, 2, 3, 6\]"),
    ({"vocab_size": 3}, 4, False, "`tp` <= 3"),
    ({"seq_len": 6}, 4, True, "`seq_len` to a multiple of 4"),
])
def test_impossible_layouts_refused_before_any_message(overrides, tp, sp, match):
    cfg = GPTConfig(**{**CFG.to_dict(), **overrides})
    with pytest.raises(ValueError, match=match):
        check_tensor_parallel(cfg, tp, sp)
    if overrides.get("vocab_size") != 3:   # tp > vocab is also refused by the grid size
        with pytest.raises(ValueError, match=match):
            to_tensor_parallel(GPT(cfg), NoMessages(tp), sequence_parallel=sp)


def test_uneven_vocab_and_seq_without_sp_are_fine():
    check_tensor_parallel(GPTConfig(**{**CFG.to_dict(), "vocab_size": 61, "seq_len": 7}), 4)


@pytest.mark.parametrize("shape,spec,t", [((6, 12), Shard(1, 3), 2), ((61, 4), Shard(0), 4),
                                          ((7,), Shard(0), 3), ((5, 9), Shard(1, 3), 3)])
def test_shard_pieces_join_back(shape, spec, t):
    full = np.arange(np.prod(shape), dtype=float).reshape(shape)
    pieces = [spec.local(full, r, t) for r in range(t)]
    assert [p.shape for p in pieces] == [spec.piece_shape(shape, r, t) for r in range(t)]
    np.testing.assert_array_equal(spec.join(pieces), full)


@settings(max_examples=50, deadline=None)
@given(t=st.integers(1, 5), groups=st.sampled_from([1, 3]), extra=st.integers(0, 4),
       other=st.integers(1, 3), axis=st.integers(0, 1))
def test_shard_property_pieces_cover_once_and_differ_by_at_most_one(t, groups, extra, other, axis):
    n = t + extra
    shape = (groups * n, other) if axis == 0 else (other, groups * n)
    spec = Shard(axis, groups)
    full = np.arange(np.prod(shape)).reshape(shape)
    pieces = [spec.local(full, r, t) for r in range(t)]
    np.testing.assert_array_equal(spec.join(pieces), full)
    seen = np.sort(np.concatenate([p.ravel() for p in pieces]))
    np.testing.assert_array_equal(seen, np.arange(full.size))
    widths = [p.shape[axis] for p in pieces]
    assert max(widths) - min(widths) <= groups


def test_qkv_slice_keeps_q_k_v_of_my_heads():
    d, t = 4, 2   # columns [q0 q1 q2 q3 | k0..k3 | v0..v3]; rank 1 gets q2 q3 k2 k3 v2 v3
    full = np.tile(np.arange(3 * d), (2, 1))
    np.testing.assert_array_equal(Shard(1, 3).local(full, 1, t)[0], [2, 3, 6, 7, 10, 11])


def test_single_rank_conversion_is_the_plain_model():
    """tp = 1 (no message is ever sent) gives the plain model's loss and state dict."""
    cfg = GPTConfig(vocab_size=13, seq_len=4, n_layer=1, d_model=8, n_head=2)
    plain = GPT(cfg, seed=2)
    ids = np.random.default_rng(0).integers(0, 13, (2, 4))
    tp_model = to_tensor_parallel(plain, NoMessages(1))
    assert float(tp_model(ids, ids)[1].item()) == float(plain(ids, ids)[1].item())
    assert list(tp_model.state_dict()) == list(plain.state_dict())
    assert all(np.array_equal(a, b) for a, b in zip(tp_model.state_dict().values(),
                                                    plain.state_dict().values()))


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_layer_parity_and_block_traffic(tp):
    """Column, row, embedding, cross-entropy, MLP, attention, block (with dropout), with and
    without sequence parallelism; one block moves 8(t-1)/t·b·s·h elements in 8(t-1) messages."""
    out = run_mpi(tp, ["tests/scripts/tp_layers.py"], timeout=120)
    assert f"tp={tp}: 77 checks ok on every rank" in out.stdout, out.stdout


# 256 byte-vocabulary rows: uneven slices for tp 3; 6 heads so that tp 3 divides them
TIED_DROPOUT = ["--model", "tiny", "--n-layer", "2", "--d-model", "24", "--n-head", "6",
                "--seq-len", "12", "--tie-weights", "--dropout", "0.1"]
TIED = TIED_DROPOUT[:-2]
CLIP = 0.05                 # below these runs' gradient norms: every step is clipped


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process's run of a model, trained once for every layout compared to it."""
    runs = {}

    def run(model):
        key = " ".join(model)
        if key not in runs:
            runs[key] = train(tmp_path_factory.mktemp("single"), "single", 1,
                              "--grad-clip", str(CLIP), model=model, batch=4)
        return runs[key]
    return run


@pytest.mark.parametrize("n,flags,model", [
    (2, ["--tp", "2", "--sequence-parallel"], TIED_DROPOUT),
    (3, ["--tp", "3", "--sequence-parallel"], TIED_DROPOUT),
    (3, ["--tp", "3"], TIED_DROPOUT),
    (4, ["--dp", "2", "--tp", "2", "--sequence-parallel"], TIED),   # dp ranks draw their own masks
], ids=["tp2 sp tied dropout", "tp3 sp tied dropout", "tp3 tied dropout", "dp2 tp2 sp tied"])
def test_gpt_training_parity(tmp_path, single, n, flags, model):
    """``train`` with a tied head, dropout and global-norm clipping on uneven vocabulary
    slices: losses, weights and AdamW moments match the single-process run in float64."""
    run = train(tmp_path, "run", n, *flags, "--grad-clip", str(CLIP), model=model, batch=4,
                timeout=240)
    assert min(r["grad_norm"] for r in step_records(tmp_path / "run.json")) > CLIP
    assert_same_run(run, single(model))
