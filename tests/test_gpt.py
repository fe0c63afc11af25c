"""The whole GPT: gradient against finite differences, overfitting, init, state dicts."""
import numpy as np
import pytest

from minipar.autograd import Tensor
from minipar.nn import GPT, GPTConfig, config_from_preset
from minipar.optim import AdamW, SGD, clip_grad_norm, lr_at
from tests.gradcheck import numeric_grad

TINY = GPTConfig(vocab_size=11, seq_len=5, n_layer=2, d_model=8, n_head=2)


@pytest.mark.parametrize("tie", [False, True])
def test_gpt_gradient_matches_finite_differences(fp64, tie):
    cfg = GPTConfig(**{**TINY.to_dict(), "tie_weights": tie})
    model = GPT(cfg, seed=1)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    params = model.parameters()
    for p in params:   # move off the symmetric init so every path carries signal
        p.data += rng.normal(0, 0.05, p.shape)
    model(ids, targets)[1].backward()
    analytic = [p.grad.copy() for p in params]

    def loss_of(*_):
        return model(ids, targets)[1].item()

    for p, g in zip(params, analytic):
        (expected,) = numeric_grad(loss_of, [p.data], eps=1e-5)
        np.testing.assert_allclose(g, expected, atol=1e-8, rtol=1e-5)


def test_tiny_gpt_overfits_a_fixed_batch():
    model = GPT(GPTConfig(vocab_size=32, seq_len=16, n_layer=2, d_model=32, n_head=4), seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.0)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 32, (4, 16)), rng.integers(0, 32, (4, 16))
    for _ in range(150):
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.05, loss.item()   # from ln(32) = 3.47


def test_sgd_momentum_matches_formula():
    p = GPT(TINY).parameters()[0]
    before = p.data.copy()
    opt = SGD([("w", p)], lr=0.5, momentum=0.9)
    for k in range(2):
        p.grad = np.ones_like(p.data)
        opt.step()
    np.testing.assert_allclose(p.data, before - 0.5 * 1 - 0.5 * 1.9, rtol=1e-6)


def test_clip_and_schedule():
    params = [Tensor(np.zeros(3), requires_grad=True) for _ in range(2)]
    params[0].grad, params[1].grad = np.array([3.0, 0, 0]), np.array([0, 4.0, 0])
    assert clip_grad_norm(params, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(params[0].grad, [0.6, 0, 0], rtol=1e-5)
    assert lr_at(0, 1.0, 10, 100) == pytest.approx(0.1)
    assert lr_at(10, 1.0, 10, 100) == pytest.approx(1.0)
    assert lr_at(100, 1.0, 10, 100) == pytest.approx(0.1)


def test_init_follows_gpt2_and_is_seeded():
    cfg = config_from_preset("tiny", n_layer=8)
    a, b = GPT(cfg, seed=3), GPT(cfg, seed=3)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=name)
    assert abs(a.blocks[0].mlp.fc.weight.data.std() - 0.02) < 0.002
    assert abs(a.blocks[0].mlp.proj.weight.data.std() - 0.02 / 4) < 0.0005   # 0.02/sqrt(2·8)
    assert not a.blocks[0].attn.qkv.bias.data.any()


def test_state_dict_roundtrip_and_mismatch():
    a, b = GPT(TINY, seed=0), GPT(TINY, seed=1)
    b.load_state_dict(a.state_dict())
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=n)
    state = a.state_dict()
    state["wte.weight"] = state["wte.weight"][:3]
    with pytest.raises(ValueError, match="wte.weight: checkpoint shape"):
        b.load_state_dict(state)
    del state["wte.weight"]
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict(state)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        config_from_preset("tiny", n_head=3)
    with pytest.raises(ValueError, match="unknown `model`"):
        config_from_preset("huge")
    with pytest.raises(ValueError, match="longer than seq_len"):
        GPT(TINY)(np.zeros((1, 6), dtype=np.int64))
