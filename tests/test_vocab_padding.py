"""A vocabulary padded to a multiple of m (``GPTConfig.pad_vocab_to``, ``--pad-vocab-to``):
the embedding and the head hold Vp = m·ceil(V/m) rows for the head's GEMM, and the model
is the unpadded one — the same losses in fp64, the padding zero, never in the loss's
softmax, never sampled; tensor parallelism splits the Vp rows evenly and masks the
padding in its vocabulary-parallel cross-entropy, even on a rank that holds only padding.
"""
import numpy as np
import pytest

from minipar.config import TrainConfig
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from tests.cli import train

V = 100     # not a multiple of 64: padded to 128


def _train_plain(pad, tie, steps=4):
    cfg = GPTConfig(vocab_size=V, seq_len=16, n_layer=2, d_model=32, n_head=4,
                    tie_weights=tie, pad_vocab_to=pad)
    model = GPT(cfg, seed=3)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        ids = rng.integers(0, V, (3, 17))
        logits, loss = model(ids[:, :-1], ids[:, 1:])
        assert logits.shape == (3, 16, V)          # the padding's logits are never returned
        for p in model.parameters():
            p.grad = None
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, model


@pytest.mark.parametrize("tie", [False, True])
def test_padded_model_is_the_unpadded_model(fp64, tie):
    (losses, model), (padded, pmodel) = _train_plain(1, tie), _train_plain(64, tie)
    assert pmodel.wte.weight.shape == (128, 32) and model.wte.weight.shape == (V, 32)
    np.testing.assert_allclose(padded, losses, rtol=1e-12, atol=0)
    # the real rows are the unpadded model's; the padding got no gradient and no decay
    np.testing.assert_allclose(pmodel.wte.weight.data[:V], model.wte.weight.data, rtol=1e-12, atol=1e-15)
    assert not pmodel.wte.weight.data[V:].any()
    if not tie:
        assert pmodel.lm_head.weight.shape == (32, 128)
        assert not pmodel.lm_head.weight.data[:, V:].any()
    assert pmodel.num_parameters() - model.num_parameters() == 28 * 32 * (1 if tie else 2)


def test_padding_is_in_no_softmax_denominator(fp64):
    """Give the padding rows large weights: an unmasked padding column would take nearly
    all the probability mass and change the loss; the masked one changes nothing."""
    cfg = GPTConfig(vocab_size=V, seq_len=8, n_layer=1, d_model=16, n_head=2, pad_vocab_to=64)
    model = GPT(cfg, seed=1)
    ids = np.random.default_rng(2).integers(0, V, (2, 9))
    before = float(model(ids[:, :-1], ids[:, 1:])[1].item())
    model.lm_head.weight.data[:, V:] = 50.0
    logits, loss = model(ids[:, :-1], ids[:, 1:])
    assert float(loss.item()) == before and logits.shape[-1] == V


def test_default_is_64_on_cupy_and_1_on_numpy():
    assert TrainConfig(backend="cupy", model="tiny").model_config().pad_vocab_to == 64
    assert TrainConfig(backend="numpy", model="tiny").model_config().pad_vocab_to == 1
    assert TrainConfig(backend="cupy", pad_vocab_to=1).model_config().padded_vocab_size == 256
    assert GPTConfig(vocab_size=50257, pad_vocab_to=64).padded_vocab_size == 50304
    with pytest.raises(ValueError, match="pad_vocab_to"):
        GPTConfig(pad_vocab_to=0).validate()


def _real_rows(params, vocab=256):
    """The checkpoint's weights with the padding cut off (it must be zero)."""
    out = {}
    for name, w in params.items():
        if name == "wte.weight":
            assert not w[vocab:].any(), "padding rows of wte moved"
            w = w[:vocab]
        elif name == "lm_head.weight":
            assert not w[:, vocab:].any(), "padding columns of lm_head moved"
            w = w[:, :vocab]
        out[name] = w
    return out


def test_train_padded_single_and_tensor_parallel_match_unpadded(tmp_path):
    """The byte vocabulary (256) padded to 384 on one rank, and to 512 under tp=2 with
    sequence parallelism — rank 1 then holds ids 256..511, padding only — against the
    unpadded single process, fp64: the same losses and real weights; the padding stays 0."""
    data = ["--data", "stdlib-bytes"]          # the byte vocabulary, whatever the default data
    losses, params, _ = train(tmp_path, "plain", 1, *data, steps=3)
    for name, ranks, flags in (("pad384", 1, ["--pad-vocab-to", "384"]),
                               ("tp2pad512", 2, ["--pad-vocab-to", "512", "--tp", "2",
                                                 "--sequence-parallel"])):
        other, oparams, _ = train(tmp_path, name, ranks, *data, *flags, steps=3)
        np.testing.assert_allclose(other, losses, rtol=1e-12, atol=0, err_msg=name)
        real = _real_rows(oparams)
        for key, w in params.items():
            np.testing.assert_allclose(real[key], w, rtol=1e-9, atol=1e-12, err_msg=f"{name} {key}")


def test_a_checkpoint_is_compatible_when_the_rows_agree():
    """A run on CuPy (multiple 64) and one on NumPy (1) hold the same rows for the byte
    vocabulary, so either resumes the other's checkpoint; different rows are refused."""
    from minipar import checkpoint
    cupy_run = GPTConfig(pad_vocab_to=64).to_dict()
    checkpoint.check_compatible({"model": cupy_run}, GPTConfig(pad_vocab_to=1).to_dict())
    with pytest.raises(ValueError, match=r"vocabulary rows: checkpoint 384 vs run 256"):
        checkpoint.check_compatible({"model": GPTConfig(pad_vocab_to=384).to_dict()}, cupy_run)
