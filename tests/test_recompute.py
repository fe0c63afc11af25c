"""Activation recomputation: bit-identical results, lower measured peak memory."""
import numpy as np
import pytest

from minipar import backend
from minipar.amp import MixedPrecision
from minipar.autograd import Tensor, ops
from minipar.data import Dataset, load_corpus
from minipar.nn import GPT, GPTConfig, attention_core
from minipar.optim import AdamW
from minipar.recompute import (apply_recompute, checkpoint, peak_activation_bytes, rng_state,
                               set_rng_state)

CFG = GPTConfig(n_layer=3, d_model=32, n_head=4, seq_len=48, dropout=0.1)


def _run(mode, steps=2, precision=None):
    """Losses, gradients, peaks of a few optimizer steps (dropout on, so the RNG matters)."""
    data = Dataset(load_corpus(max_bytes=60_000), CFG.seq_len)
    model = GPT(CFG, seed=0)
    named = model.named_parameters()
    if precision:
        amp = MixedPrecision(model, precision)
        named = amp.named_masters()
    opt = AdamW(named, lr=1e-2)
    apply_recompute(model, mode)
    losses, grads, peaks = [], [], []
    for step in range(steps):
        x, y = data.batch(0, step, 4)

        def fwd_bwd():
            _, loss = model(backend.to_device(x), backend.to_device(y))
            loss.backward()
            return loss.item()
        loss, peak = peak_activation_bytes(fwd_bwd)
        if precision:
            amp.grads_to_masters()
        losses.append(loss)
        peaks.append(peak)
        grads.append({n: p.grad.copy() for n, p in named})
        opt.step()
        opt.zero_grad()
        if precision:
            amp.masters_to_model()
    return losses, grads, peaks, model.dropout_rng.random()


def _assert_identical(a, b):
    assert a[0] == b[0]                                       # losses, bit for bit
    for ga, gb in zip(a[1], b[1]):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert np.array_equal(ga[name], gb[name]), name   # every gradient
    assert a[3] == b[3]                                       # the RNG continues alike


def test_recompute_bit_identical_float64_and_lowers_peak(fp64):
    none = _run("none")
    full = _run("full")
    selective = _run("selective")
    _assert_identical(none, full)
    _assert_identical(none, selective)
    assert full[2][0] < selective[2][0] < none[2][0]
    assert full[2][0] < 0.6 * none[2][0]


@pytest.mark.parametrize("precision", [None, "fp16"])
def test_recompute_bit_identical_fp32_and_fp16(precision):
    none = _run("none", steps=1, precision=precision)
    for mode in ("full", "selective"):
        _assert_identical(none, _run(mode, steps=1, precision=precision))


def test_apply_recompute_switches_and_restores():
    """Recomputation wraps child modules (no method patching); "none" gives back the very
    same block and core objects, and the parameters keep their names."""
    from minipar.recompute import Recompute
    model = GPT(GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8), seed=0)
    block, core = model.blocks[0], model.blocks[0].attn.core
    names = [n for n, _ in model.named_parameters()]
    apply_recompute(model, "full")
    assert isinstance(model.blocks[0], Recompute) and model.blocks[0].inner is block
    assert [n for n, _ in model.named_parameters()] == names
    apply_recompute(model, "selective")
    assert model.blocks[0] is block and isinstance(block.attn.core, Recompute)
    assert "forward" not in vars(block) and "forward" not in vars(block.attn)
    apply_recompute(model, "none")
    assert model.blocks[0] is block and block.attn.core is core
    assert len(model.parameters()) == len(GPT(model.config, seed=0).parameters())
    with pytest.raises(ValueError, match="none, full or selective"):
        apply_recompute(model, "some")
    block.attn.core = lambda q, k, v: attention_core(q, k, v)   # not a module: refused
    with pytest.raises(TypeError, match="core"):
        apply_recompute(model, "selective")


def test_checkpoint_of_a_function_with_dropout(fp64):
    rng = np.random.default_rng(0)
    gen = np.random.default_rng(7)
    w = Tensor(rng.standard_normal((5, 5)), requires_grad=True)
    a = rng.standard_normal((3, 5))

    def fn(x):
        return ops.dropout(ops.tanh(x @ w), 0.5, gen) * x

    def grads(use_checkpoint):
        set_rng_state(gen, start)
        x = Tensor(a, requires_grad=True)
        y = checkpoint(fn, x, generator=gen) if use_checkpoint else fn(x)
        ops.sum(y * y).backward()
        out = (y.data.copy(), x.grad.copy(), w.grad.copy())
        w.grad = None
        return out

    start = rng_state(gen)
    plain, ckpt = grads(False), grads(True)
    for p, c in zip(plain, ckpt):
        assert np.array_equal(p, c)
    legacy = np.random.RandomState(3)                # a generator with get_state/set_state
    state = rng_state(legacy)
    first = legacy.rand()
    set_rng_state(legacy, state)
    assert legacy.rand() == first


def test_generator_whose_state_is_a_method_is_refused_not_silently_kept():
    """CuPy's bit generator has a ``state()`` method (a device pointer), not NumPy's state
    property: taking the method for a state would replay different dropout masks."""
    class CupyLikeBits:
        def state(self):
            return 0

    class CupyLikeGenerator:
        bit_generator = CupyLikeBits()

    with pytest.raises(RuntimeError, match="cannot save the state of CupyLikeGenerator"):
        rng_state(CupyLikeGenerator())
    numpy_generator = np.random.default_rng(0)
    saved = rng_state(numpy_generator)
    first = numpy_generator.random(3)
    set_rng_state(numpy_generator, saved)
    np.testing.assert_array_equal(numpy_generator.random(3), first)


def test_recompute_without_dropout_needs_no_generator_state():
    model = GPT(GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8, dropout=0.0), seed=0)
    model.dropout_rng = object()  # a generator whose state cannot be saved
    apply_recompute(model, "full")
    ids = np.random.default_rng(0).integers(0, 256, (2, 9))
    _, loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()  # would raise if the recomputation tried to save the generator's state
