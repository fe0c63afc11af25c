"""Mixed precision: the half-precision op contract, master weights, loss scaling."""
import numpy as np
import pytest

from minipar import backend
from minipar.amp import (MixedPrecision, DynamicLossScaler, make_scaler, amp_train_step,
                         amp_optimizer_step)
from minipar.autograd import Tensor, ops
from minipar.data import Dataset, load_corpus
from minipar.nn import GPT, GPTConfig, Linear
from minipar.optim import AdamW, clip_grad_norm
from tests.mpirun import run_mpi
from tests.tolerance import assert_sums_close

HALF = ["fp16", "bf16"]


def _rand(rng, shape, prec):
    return rng.standard_normal(shape).astype(np.float32).astype(backend.dtype_of(prec))


@pytest.mark.parametrize("prec", HALF)
def test_matmul_is_fp32_accumulated_then_rounded(prec):
    rng = np.random.default_rng(0)
    half = backend.dtype_of(prec)
    a, b = _rand(rng, (2, 5, 48), prec), _rand(rng, (2, 48, 7), prec)
    bias = _rand(rng, (7,), prec)
    ref = lambda u, v: (u.astype(np.float32) @ v.astype(np.float32)).astype(half)
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    y = ops.matmul(ta, tb)
    assert y.dtype == half and np.array_equal(y.data, ref(a, b))
    g = _rand(rng, y.shape, prec)
    y.backward(g)
    assert np.array_equal(ta.grad, ref(g, np.swapaxes(b, -1, -2)))
    assert np.array_equal(tb.grad, ref(np.swapaxes(a, -1, -2), g))
    # the fused linear layer: bias added in fp32 before the single rounding
    x, w = Tensor(a, requires_grad=True), Tensor(b[0], requires_grad=True)
    tbias = Tensor(bias, requires_grad=True)
    y = ops.linear(x, w, tbias)
    want = (a.astype(np.float32) @ b[0].astype(np.float32) + bias.astype(np.float32)).astype(half)
    assert y.dtype == half and np.array_equal(y.data, want)
    y.backward(g)
    gy = g.reshape(-1, 7)
    assert np.array_equal(w.grad, ref(a.reshape(-1, 48).T, gy))
    assert np.array_equal(tbias.grad, gy.astype(np.float32).sum(0).astype(half))


def test_fp32_matmul_path_unchanged():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    assert np.array_equal(ops.matmul(Tensor(a), Tensor(b)).data, a @ b)
    assert ops.linear(Tensor(a), Tensor(b)).dtype == np.float32


@pytest.mark.parametrize("prec", HALF)
def test_reductions_and_loss_are_fp32(prec):
    half = backend.dtype_of(prec)
    x = Tensor(np.ones(70_000, dtype=half), requires_grad=True)   # the sum overflows fp16
    s = ops.sum(x)
    assert s.dtype == np.float32 and s.item() == 70_000
    s.backward()
    assert x.grad.dtype == half
    logits = Tensor(_rand(np.random.default_rng(2), (3, 4, 11), prec), requires_grad=True)
    loss = ops.cross_entropy(logits, np.zeros((3, 4), dtype=np.int64))
    assert loss.dtype == np.float32


def test_masters_keep_updates_that_half_weights_lose():
    layer = Linear(1, 1, np.random.default_rng(0), bias=False)
    layer.weight.data[...] = 1.0
    amp = MixedPrecision(layer, "fp16")
    assert layer.weight.dtype == np.float16 and amp.masters[0].dtype == np.float32
    for _ in range(100):        # 1e-4 is below half an fp16 ulp at 1.0 (4.9e-4)
        assert (layer.weight.data.astype(np.float16) + np.float16(1e-4)) == layer.weight.data
        amp.masters[0].data += 1e-4
    amp.masters_to_model()
    assert abs(float(amp.masters[0].data[0, 0]) - 1.01) < 1e-5
    assert abs(float(layer.weight.data[0, 0]) - 1.01) < 1e-3
    state = amp.state_dict()
    assert state["weight"].dtype == np.float32
    amp.masters[0].data[...] = 0
    amp.load_state_dict(state)
    assert float(layer.weight.data[0, 0]) == float(np.float16(state["weight"][0, 0]))


def test_loss_scaling_rescues_an_underflowing_gradient():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 3)).astype(np.float32)
    tiny = 1e-8                     # gradients ~1e-8: below fp16's smallest subnormal 6e-8
    want = tiny * x.sum(0)[:, None].repeat(4, 1)

    def master_grad(scale):
        layer = Linear(3, 4, np.random.default_rng(0), bias=False)
        amp = MixedPrecision(layer, "fp16")
        scaler = DynamicLossScaler(init_scale=scale, min_scale=scale)
        loss = ops.sum(layer(Tensor(x.astype(np.float16)))) * tiny
        scaler.scale_loss(loss).backward()
        amp.grads_to_masters()
        scaler.unscale_(amp.master_grads())
        return amp.master_grads()[0]

    assert not np.any(master_grad(1.0))                 # all lost without scaling
    rescued = master_grad(2.0 ** 16)
    # each of the 8 terms rounded twice to fp16 (x, dL/dy), then added: 10 roundings in all
    assert_sums_close(rescued, want, dtype=np.float16, terms=10,
                      abs_sum=tiny * np.abs(x).sum(0)[:, None].repeat(4, 1))


def test_scaler_growth_backoff_hysteresis_min_scale():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3, hysteresis=2, min_scale=2.0)
    for _ in range(3):
        s.update(False)
    assert s.scale == 16.0
    s.update(True)
    assert s.scale == 16.0 and s.skipped == 1           # first overflow absorbed
    s.update(False)                                     # a clean step forgets it
    s.update(True)
    assert s.scale == 16.0
    s.update(True)
    assert s.scale == 8.0                               # second in a row: backoff
    s.update(True)
    assert s.scale == 4.0                               # and every further one
    for _ in range(5):
        s.update(True)
    assert s.scale == 2.0 and s.skipped == 9            # floor
    s.update(False)
    s.update(False)
    assert s.scale == 2.0                               # overflow restarted the growth count
    s.update(False)
    assert s.scale == 4.0
    t = DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    one = DynamicLossScaler(init_scale=8.0, hysteresis=1, backoff_factor=0.25)
    one.update(True)
    assert one.scale == 2.0
    assert DynamicLossScaler().scale == 2.0 ** 16 and DynamicLossScaler().growth_interval == 2000


def test_found_inf_and_disabled_scaler():
    s = DynamicLossScaler()
    assert not s.found_inf([np.ones(3), None])
    assert s.found_inf([np.ones(3), np.array([1.0, np.nan])])
    assert s.found_inf([np.array([np.inf], dtype=np.float16)])
    bf = make_scaler("bf16")
    assert bf.scale == 1.0 and not bf.enabled
    assert not bf.found_inf([np.array([np.inf])])
    bf.update(True)
    assert bf.scale == 1.0 and bf.skipped == 0
    assert make_scaler("fp16").enabled


CFG = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=32)


def _train(prec, steps=25):
    data = Dataset(load_corpus(max_bytes=100_000), CFG.seq_len)
    model = GPT(CFG, seed=0)
    if prec == "fp32":
        opt = AdamW(model.named_parameters(), lr=3e-3, weight_decay=0.0)
    else:
        amp = MixedPrecision(model, prec)
        scaler = make_scaler(prec)
        opt = AdamW(amp.named_masters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, y = data.batch(0, step, 8)
        if prec == "fp32":
            _, loss = model(x, y)
            loss.backward()
            clip_grad_norm(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        else:
            loss, norm, skipped, _ = amp_train_step(model, amp, opt, scaler, x, y, 1, 1.0)
            assert not skipped and norm > 0
            losses.append(loss)
    return float(np.mean(losses[-5:])), losses


def test_fp16_and_bf16_training_track_fp32():
    ref, ref_curve = _train("fp32")
    assert ref < ref_curve[0] - 1.5                     # it learned something
    for prec in HALF:
        got, _ = _train(prec)
        assert abs(got - ref) / ref < 0.03, (prec, got, ref)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the overflow is the point
def test_skipped_step_changes_nothing_single_rank():
    model = GPT(GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8), seed=0)
    amp = MixedPrecision(model, "fp16")
    opt = AdamW(amp.named_masters(), lr=1e-2)
    scaler = DynamicLossScaler(init_scale=2.0 ** 40)   # loss·2^40 overflows fp16 at once
    x = np.arange(16).reshape(2, 8) % 7
    before = [p.data.copy() for p in amp.params + amp.masters]
    loss, norm, skipped, scale = amp_train_step(model, amp, opt, scaler, x, x, 1, 1.0)
    assert skipped and norm is None and scale == 2.0 ** 40 and opt.step_count == 0
    assert all(np.array_equal(a, p.data) for a, p in zip(before, amp.params + amp.masters))
    assert all(m.grad is None for m in amp.masters) and all(p.grad is None for p in amp.params)
    assert scaler.scale == 2.0 ** 40                   # hysteresis 2: not lowered yet
    _, _, skipped, _ = amp_train_step(model, amp, opt, scaler, x, x, 1, 1.0)
    assert skipped and scaler.scale == 2.0 ** 39 and scaler.skipped == 2
    _, skipped, _ = amp_optimizer_step(amp, opt, scaler)   # no gradients at all: clean
    assert not skipped and opt.step_count == 1


def test_the_trainers_step_is_the_same_fp16_step():
    """The one optimizer step (parallel.step.Optimizer over a DDP synchroniser holding the
    fp32 masters) gives bit for bit the weights of lesson 09's amp_train_step."""
    from minipar.comm import Communicator
    from minipar.parallel.step import Optimizer
    from minipar.parallel.sync import DDPSync
    cfg = GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8)
    x = np.arange(32).reshape(4, 8) % 11

    def run(trainer_step):
        model = GPT(cfg, seed=0)
        scaler = make_scaler("fp16")
        if trainer_step:
            sync = DDPSync(model, Communicator(), half_dtype=np.float16)
            opt = Optimizer(sync, lr=1e-2, scaler=scaler)
            for _ in range(3):
                _, loss = model(x, x)
                opt.scale_loss(loss).backward()
                norm = opt.step(1.0)
            assert opt.last_scale == 2.0 ** 16 and not opt.last_skipped and norm > 0
            assert opt.memory_bytes()["params"] == 6 * model.num_parameters()
            return sync.to_named([s.master for s in sync.slots])
        amp = MixedPrecision(model, "fp16")
        opt = AdamW(amp.named_masters(), lr=1e-2)
        for _ in range(3):
            amp_train_step(model, amp, opt, scaler, x, x, 1, 1.0)
        return amp.state_dict()

    flat, per_parameter = run(True), run(False)
    assert flat.keys() == per_parameter.keys()
    for name in flat:
        assert np.array_equal(flat[name], per_parameter[name]), name


def test_norm_fn_sees_named_unscaled_master_grads():
    model = GPT(GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8), seed=0)
    amp = MixedPrecision(model, "fp16")
    opt = AdamW(amp.named_masters(), lr=1e-2)
    seen = {}

    def norm_fn(named):
        seen.update(named)
        return 123.0
    x = np.arange(16).reshape(2, 8) % 7
    _, norm, _, _ = amp_train_step(model, amp, opt, make_scaler("fp16"), x, x, 1, 0.0, norm_fn)
    assert norm == 123.0 and list(seen) == [n for n, _ in model.named_parameters()]
    assert all(g.dtype == np.float32 and np.abs(g).max() < 10 for g in seen.values())


@pytest.mark.parametrize("nprocs", [2])
def test_overflow_on_one_rank_skips_every_rank(nprocs):
    proc = run_mpi(nprocs, ["tests/scripts/amp_overflow.py"], timeout=120)
    assert proc.stdout.count("OK ") == nprocs, proc.stdout


def test_trainer_step_skips_on_every_rank_when_one_rank_overflows():
    """The trainer's step (``parallel.step.Optimizer``) under dp2 x tp2 DDP and dp2 x pp2
    ZeRO-1: an inf in the last rank's gradient after the synchroniser makes every rank skip
    and halve the scale, through the one all-reduce that also sums ||g||² (which matches
    the group-by-group sum on clean steps)."""
    proc = run_mpi(4, ["tests/scripts/overflow_one_rank.py"], timeout=180)
    assert proc.stdout.count("OK ") == 8, proc.stdout


def test_fp16_data_parallel_matches_single_process():
    proc = run_mpi(2, ["tests/scripts/amp_ddp.py"], timeout=120)
    assert proc.stdout.count("OK ") == 2, proc.stdout
