"""The llama block's pieces on one process: finite-difference gradients of RMSNorm,
RoPE, SiLU, SwiGLU and grouped-query attention; half-precision RMSNorm against float32; RoPE's relative-position property; GQA equal
to multi-head attention over repeated K/V; the config's refusals."""
import numpy as np
import pytest

from minipar.autograd import Tensor, ops
from minipar.nn import config_from_preset, make_model
from minipar.nn.attention import naive_attention
from minipar.nn.rope import RotaryEmbedding, rope_angles
from minipar.optim import AdamW
from tests.gradcheck import check_grad

pytestmark = pytest.mark.usefixtures("fp64")   # every test here in float64 (tests/conftest.py)

RNG = np.random.default_rng(0)


def test_rms_norm_gradient():
    check_grad(ops.rms_norm, RNG.normal(size=(2, 3, 6)), RNG.normal(size=6))


def test_rms_norm_value():
    x, g = RNG.normal(size=(3, 8)), RNG.normal(size=8)
    expected = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(ops.rms_norm(Tensor(x), Tensor(g)).numpy(), expected, rtol=1e-13)


def test_silu_gradient():
    check_grad(ops.silu, RNG.normal(scale=4.0, size=(3, 5)))


def test_rms_norm_half_precision_normalises_in_float32():
    x = (RNG.normal(size=(4, 64)) * 300).astype(np.float16)      # x² overflows fp16
    g = np.ones(64, dtype=np.float16)
    y = ops.rms_norm(Tensor(x), Tensor(g))
    want = ops.rms_norm(Tensor(x.astype(np.float32)), Tensor(g.astype(np.float32))).numpy()
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.numpy().astype(np.float32), want, rtol=1e-3, atol=1e-3)


def test_swiglu_gradient():
    def swiglu(x, gate, up, down):
        return ops.matmul(ops.silu(ops.matmul(x, gate)) * ops.matmul(x, up), down)
    check_grad(swiglu, RNG.normal(size=(2, 4, 6)), RNG.normal(size=(6, 10)),
               RNG.normal(size=(6, 10)), RNG.normal(size=(10, 6)))


def test_silu_is_z_sigmoid_z():
    z = np.linspace(-30, 30, 61)
    np.testing.assert_allclose(ops.silu(Tensor(z)).numpy(), z / (1 + np.exp(-z)), rtol=1e-12,
                               atol=1e-14)
    half = ops.silu(Tensor(z.astype(np.float16))).numpy()       # computed in float32
    assert half.dtype == np.float16 and np.isfinite(half).all()


def test_rope_gradient_at_given_positions():
    rope = RotaryEmbedding(8, base=100.0)
    rope.positions = np.array([5, 0, 7, 2])       # a context-parallel rank's positions
    check_grad(rope, RNG.normal(size=(2, 3, 4, 8)))


def test_rope_is_hf_rotate_half():
    """Feature i pairs with i + d/2 and turns by m·base^(-2i/d) (Hugging Face's layout)."""
    d, m = 8, 3
    x = RNG.normal(size=(1, 1, 4, d))
    out = RotaryEmbedding(d, 10000.0)(Tensor(x)).numpy()[0, 0, m]
    for i in range(d // 2):
        angle = m * 10000.0 ** (-2 * i / d)
        a, b = x[0, 0, m, i], x[0, 0, m, i + d // 2]
        np.testing.assert_allclose(out[[i, i + d // 2]],
                                   [a * np.cos(angle) - b * np.sin(angle),
                                    b * np.cos(angle) + a * np.sin(angle)], rtol=1e-12)


def test_rope_dot_product_depends_on_relative_position_only():
    d = 16
    q, k = RNG.normal(size=d), RNG.normal(size=d)
    rope = RotaryEmbedding(d)

    def score(m, n):
        rope.positions = np.array([m, n])
        x = rope(Tensor(np.stack([q, k])[None, None])).numpy()[0, 0]
        return x[0] @ x[1]
    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-10)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)
    assert rope_angles([0, 1], d, 10000.0).shape == (2, d)


@pytest.mark.parametrize("h,h_kv", [(4, 2), (4, 1), (6, 3)])
def test_grouped_attention_gradient(h, h_kv):
    check_grad(naive_attention, RNG.normal(size=(1, h, 5, 4)), RNG.normal(size=(1, h_kv, 5, 4)),
               RNG.normal(size=(1, h_kv, 5, 4)))


def test_grouped_attention_equals_repeated_kv():
    """Query head h reads KV head h // (H/Hkv): the same as MHA on K/V repeated per group."""
    q = RNG.normal(size=(2, 6, 7, 4))
    k, v = RNG.normal(size=(2, 2, 7, 4)), RNG.normal(size=(2, 2, 7, 4))
    grouped = naive_attention(Tensor(q), Tensor(k), Tensor(v)).numpy()
    repeated = naive_attention(Tensor(q), Tensor(np.repeat(k, 3, axis=1)),
                               Tensor(np.repeat(v, 3, axis=1))).numpy()
    np.testing.assert_allclose(grouped, repeated, rtol=1e-13)


def test_llama_model_parameters_and_flops():
    cfg = config_from_preset("llama-tiny", n_layer=2, d_model=32, seq_len=16)
    assert (cfg.arch, cfg.kv_heads, cfg.ffn_width) == ("llama", 2, 128)   # 8/3·32 -> 64·2
    model = make_model(cfg, seed=0)
    names = dict(model.named_parameters())
    assert names["blocks.0.attn.k_proj.weight"].shape == (32, 16)        # 2 of 4 heads
    assert names["blocks.1.mlp.gate_proj.weight"].shape == (32, 128)
    assert not any(n.endswith("bias") for n in names) and "wpe.weight" not in names
    n_matmul = sum(p.size for n, p in names.items() if n != "wte.weight")
    assert model.flops_per_token() == 6 * n_matmul + 12 * 2 * 32 * 16


def test_llama_loss_starts_near_uniform_and_trains():
    """Untrained, the loss is ln V (every token equally likely); AdamW on one fixed batch
    (fp64, seed 0) then lowers it at every step, by more than 2 nats in 8 steps (from
    5.5 to 2.6: the 32 next tokens are memorised)."""
    cfg = config_from_preset("llama-tiny", n_layer=2, d_model=32, seq_len=16)
    model = make_model(cfg, seed=0)
    ids = np.random.default_rng(1).integers(0, 256, size=(2, 17))
    x, y = ids[:, :-1], ids[:, 1:]
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for step in range(9):
        _, loss = model(x, y)
        losses.append(float(loss.data))
        opt.zero_grad()
        loss.backward()
        if step == 0:                        # every parameter has a part in the loss
            assert all(p.grad is not None and np.abs(p.grad).max() > 0 for p in model.parameters())
        opt.step()
    assert abs(losses[0] - np.log(256)) < 0.1
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 2.0, losses


@pytest.mark.parametrize("overrides,message", [
    (dict(n_kv_head=3), "multiple of `n_kv_head`"),
    (dict(d_model=36, n_head=4, n_kv_head=2), "must be even"),
    (dict(arch="gpt2"), "drop `arch` gpt2"),
])
def test_llama_config_refusals(overrides, message):
    with pytest.raises(ValueError, match=message):
        config_from_preset("llama-tiny", **overrides)


def test_gpt2_refuses_llama_fields():
    with pytest.raises(ValueError, match="belongs to `arch` llama"):
        config_from_preset("tiny", n_kv_head=2)
    assert config_from_preset("tiny", arch="llama").kv_heads == 4


def test_a_gpt2_checkpoint_does_not_resume_as_llama():
    from minipar import checkpoint
    gpt2 = config_from_preset("tiny").to_dict()
    checkpoint.check_compatible({"model": gpt2}, gpt2)
    with pytest.raises(ValueError, match="arch: checkpoint 'gpt2' vs run 'llama'"):
        checkpoint.check_compatible({"model": gpt2}, config_from_preset("tiny", arch="llama").to_dict())
