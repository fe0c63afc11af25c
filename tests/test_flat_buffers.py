"""DDP's flat buffers (parallel/sync/flat.py): parameters and gradients are views of one
array per bucket, backward accumulates into them, zeroing keeps the views, a replaced
gradient is caught, checkpoints round-trip by name — and training is the same as with
per-parameter AdamW on plain arrays."""
import numpy as np
import pytest

from minipar.comm import Communicator
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync
from tests.tolerance import assert_close_normwise

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, d_model=16, n_head=2)


def batch(step):
    rng = np.random.default_rng(step)
    return rng.integers(0, 32, (4, 8)), rng.integers(0, 32, (4, 8))


def test_views_of_one_buffer_per_bucket():
    model = GPT(CFG, seed=0)
    sync = DDPSync(model, Communicator(), bucket_bytes=4096)
    assert len(sync.buckets) > 1 and len(sync.slots) == len(sync.buckets)
    flat = sync.flat
    for i, b in enumerate(sync.buckets):
        for p, view in zip(b.params, flat.grad_views[i]):
            assert p.data.base is flat.weights[i] and p.grad is view
            assert view.base is flat.grad_flats[i]
    x, y = batch(0)
    _, loss = model(x, y)
    loss.backward()
    assert np.any(flat.grad_flats[0] != 0)             # backward wrote into the buffer
    sync.zero_grad()
    assert all(not np.any(g) for g in flat.grad_flats)
    assert all(p.grad is v for b, views in zip(sync.buckets, flat.grad_views)
               for p, v in zip(b.params, views))


def test_a_replaced_gradient_is_caught():
    model = GPT(CFG, seed=0)
    sync = DDPSync(model, Communicator(), bucket_bytes=4096)
    x, y = batch(0)
    _, loss = model(x, y)
    loss.backward()
    expected = [p.grad.copy() for p in sync.params]
    model.zero_grad()                                  # sets every p.grad to None
    _, loss = model(x, y)
    loss.backward()                                    # new arrays, outside the buffers
    slots = sync.finish()
    got = [p.grad for p in sync.params]
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)
    flat = sync.flat
    assert all(p.grad is v for b, views in zip(sync.buckets, flat.grad_views)
               for p, v in zip(b.params, views))
    assert all(s.grad is g for s, g in zip(slots, flat.grad_flats))


def test_same_training_as_per_parameter_adamw():
    """Flat slots (masks for decay) against minipar.optim.AdamW on each parameter."""
    a, b = GPT(CFG, seed=0), GPT(CFG, seed=0)
    opt_a = Optimizer(DDPSync(a, Communicator(), bucket_bytes=4096), lr=1e-2, weight_decay=0.1)
    opt_b = AdamW(b.named_parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(4):
        x, y = batch(step)
        for model in (a, b):
            _, loss = model(x, y)
            loss.backward()
        opt_a.step(None)
        opt_b.step()
        opt_b.zero_grad()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert_close_normwise(pa.data, pb.data, 1e-5, err_msg=n)


def test_checkpoint_round_trip_by_name():
    model = GPT(CFG, seed=0)
    opt = Optimizer(DDPSync(model, Communicator(), bucket_bytes=4096), lr=1e-2)
    x, y = batch(0)
    _, loss = model(x, y)
    loss.backward()
    opt.step(1.0)
    named = opt.model_state_dict()
    assert set(named) == {n for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(named[n], p.data)
    state = opt.state_dict()
    fresh = Optimizer(DDPSync(GPT(CFG, seed=1), Communicator(), bucket_bytes=4096), lr=1e-2)
    fresh.load_state_dict(state)
    again = fresh.state_dict()
    for n in state["m"]:
        np.testing.assert_array_equal(state["m"][n], again["m"][n])
        np.testing.assert_array_equal(state["v"][n], again["v"][n])


def test_a_second_optimizer_does_not_scale_the_decay_mask_again():
    """The optimizer scales its synchroniser's per-element mask by λ in place (one array
    as large as the weights, not two): a second one over the same slots keeps λ·mask."""
    sync = DDPSync(GPT(CFG, seed=0), Communicator(), bucket_bytes=4096)
    first = Optimizer(sync, lr=1e-2, weight_decay=0.1)
    masks = [d.copy() for d in first.decay if getattr(d, "ndim", 0)]
    assert masks and all(set(np.unique(m)) <= {0.0, np.float32(0.1)} for m in masks)
    Optimizer(sync, lr=1e-2, weight_decay=0.1)
    again = [d for d in first.decay if getattr(d, "ndim", 0)]
    assert all(np.array_equal(a, b) for a, b in zip(again, masks))
    with pytest.raises(ValueError, match="already scaled"):
        Optimizer(sync, lr=1e-2, weight_decay=0.2)
