"""Every op's backward against central finite differences, in float64."""
import numpy as np
import pytest

from minipar.autograd import Tensor, ops, no_grad
from tests.gradcheck import check_grad

rng = np.random.default_rng(0)


def r(*shape):
    return rng.normal(size=shape)


BINARY_BROADCAST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((3, 4), ())]


@pytest.mark.parametrize("op", [ops.add, ops.sub, ops.mul, ops.div])
@pytest.mark.parametrize("shapes", BINARY_BROADCAST)
def test_binary_broadcasting(op, shapes):
    a, b = r(*shapes[0]), r(*shapes[1])
    if op is ops.div:
        b = np.abs(b) + 0.5
    check_grad(op, a, b)


@pytest.mark.parametrize("name,fn,positive", [
    ("exp", ops.exp, False), ("log", ops.log, True), ("tanh", ops.tanh, False),
    ("relu", ops.relu, False), ("gelu", ops.gelu, False), ("neg", ops.neg, False),
    ("pow3", lambda x: ops.pow(x, 3), False), ("pow-half", lambda x: ops.pow(x, -0.5), True),
])
def test_unary(name, fn, positive):
    x = r(3, 5)
    if positive:
        x = np.abs(x) + 0.3
    if name == "relu":
        x = np.where(np.abs(x) < 1e-3, 0.5, x)   # keep away from the kink
    check_grad(fn, x)


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, False)])
def test_reductions(axis, keepdims):
    x = r(2, 3, 4)
    check_grad(lambda t: ops.sum(t, axis, keepdims), x)
    check_grad(lambda t: ops.mean(t, axis, keepdims), x)
    check_grad(lambda t: ops.max(t, axis, keepdims), x)


def test_max_splits_ties_evenly():
    x = Tensor(np.array([1.0, 3.0, 3.0]), requires_grad=True)
    ops.max(x).backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.5, 0.5])


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((1, 3), (3, 1))])
def test_matmul(sa, sb):
    check_grad(ops.matmul, r(*sa), r(*sb))


def test_linear():
    check_grad(lambda x, w, b: ops.linear(x, w, b), r(2, 3, 4), r(4, 5), r(5))
    check_grad(lambda x, w: ops.linear(x, w), r(3, 4), r(4, 2))


def test_shape_ops():
    check_grad(lambda t: ops.reshape(t, (4, 6)), r(2, 3, 4))
    check_grad(lambda t: ops.transpose(t, (2, 0, 1)), r(2, 3, 4))
    check_grad(lambda t: ops.transpose(t), r(2, 3))
    check_grad(lambda t: t[1:, ::2], r(3, 5))
    check_grad(lambda t: t[np.array([0, 2, 0, 1])], r(3, 2))      # repeated index: scatter-add
    check_grad(lambda t: t[..., 1], r(2, 3, 4))
    check_grad(lambda a, b: ops.concat([a, b], axis=1), r(2, 3), r(2, 2))


def test_split():
    x = Tensor(r(4, 6), requires_grad=True)
    a, b, c = ops.split(x, [1, 2, 3], axis=1)
    (ops.sum(a) * 1.0 + ops.sum(b) * 2.0 + ops.sum(c) * 3.0).backward()
    np.testing.assert_array_equal(x.grad[0], [1, 2, 2, 3, 3, 3])
    with pytest.raises(ValueError, match="cannot split"):
        ops.split(x, 5, axis=1)


def test_where_and_masked_fill():
    cond = rng.random((3, 4)) > 0.5
    check_grad(lambda a, b: ops.where(cond, a, b), r(3, 4), r(4))
    check_grad(lambda a: ops.masked_fill(a, cond, -3.0), r(3, 4))


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_family(axis):
    check_grad(lambda t: ops.softmax(t, axis), r(3, 5))
    check_grad(lambda t: ops.log_softmax(t, axis), r(3, 5))


@pytest.mark.parametrize("causal", [True, False])
def test_attention_softmax(causal):
    check_grad(lambda t: ops.attention_softmax(t, 0.7, causal), r(2, 4, 4))
    check_grad(lambda t: ops.attention_softmax(t, 0.7, causal), r(3, 5))   # more keys than queries


def test_layer_norm():
    check_grad(lambda x, w, b: ops.layer_norm(x, w, b), r(2, 3, 6), r(6), r(6))


def test_embedding_scatter_adds_repeated_ids():
    ids = np.array([[1, 3, 1], [0, 1, 4]])
    check_grad(lambda w: ops.embedding(w, ids), r(5, 3))


def test_cross_entropy_with_ignore_index():
    targets = np.array([2, 0, -100, 4, 1])
    check_grad(lambda z: ops.cross_entropy(z, targets), r(5, 6))
    z = r(5, 6)
    loss = ops.cross_entropy(Tensor(z), targets).item()
    keep = targets != -100
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(loss, -logp[keep, targets[keep]].mean(), rtol=1e-12)


def test_cast_roundtrip_gradient_dtype():
    x = Tensor(r(3), requires_grad=True)
    ops.sum(ops.cast(x, np.float32)).backward()
    assert x.grad.dtype == np.float64


def test_dropout_is_seeded_and_gated():
    x = Tensor(np.ones((200, 50)), requires_grad=True)
    y1 = ops.dropout(x, 0.3, np.random.default_rng(7))
    y2 = ops.dropout(Tensor(np.ones((200, 50))), 0.3, np.random.default_rng(7))
    np.testing.assert_array_equal(y1.numpy(), y2.numpy())
    assert abs((y1.numpy() == 0).mean() - 0.3) < 0.02
    ops.sum(y1).backward()
    np.testing.assert_array_equal(x.grad, y1.numpy())   # grad = mask / (1-p) = y for x = 1
    assert ops.dropout(x, 0.3, None, training=False) is x


def test_hooks_fire_after_accumulation_and_no_grad():
    w = Tensor(r(3), requires_grad=True)
    seen = []
    w.register_hook(lambda t: seen.append(t.grad.copy()))
    (ops.sum(w * 2.0) + ops.sum(w * 3.0)).backward()
    assert len(seen) == 1 and np.allclose(seen[-1], 5.0)   # two uses, one summed event
    with no_grad():
        y = w * 2.0
    assert not y.requires_grad and y.ctx is None


def test_backward_with_upstream_gradient_and_detach():
    x = Tensor(r(2, 3), requires_grad=True)
    y = ops.tanh(x)
    g = r(2, 3)
    y.backward(g)
    np.testing.assert_allclose(x.grad, g * (1 - np.tanh(x.numpy()) ** 2))
    assert not x.detach().requires_grad
    with pytest.raises(ValueError, match="gradient shape"):
        ops.tanh(x).backward(np.ones(3))


def test_leaf_used_twice_gets_one_summed_accumulation():
    """Tied weights: the hook fires once per backward, with the sum of both uses."""
    w = Tensor(r(3), requires_grad=True)
    fired = []
    w.register_hook(lambda t: fired.append(t.grad.copy()))
    ops.sum(ops.tanh(w) * w + w * 2.0).backward()
    assert len(fired) == 1
    x = w.numpy()
    np.testing.assert_allclose(fired[0], (1 - np.tanh(x) ** 2) * x + np.tanh(x) + 2.0)
