"""The mixture-of-experts MLP (nn/moe.py): its gradients against finite differences, the
routing rules (top-k renormalisation, the capacity drop order) and the balancing loss
against a few lines of independent NumPy, statistics per sequence, data-parallel and
accumulated runs against one process in fp64 (1e-9), a resume, and the refusals."""
import math

import numpy as np
import pytest

from minipar.autograd import Tensor, ops
from minipar.cli import build_parser
from minipar.cli.run_config import config_from_flags
from minipar.cli_checks import as_flags
from minipar.config import ConfigError
from minipar.nn import GPTConfig
from minipar.nn.moe import MoE, balance_loss, capacity, kept_assignments, route
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU
from minipar.observe.runlog import step_records
from tests.cli import assert_same_run, train
from tests.gradcheck import check_grad
from tests.mpirun import run_mpi

D, WIDTH, E = 6, 5, 4


def moe_layer(top_k=2, capacity_factor=0.0, shared=0, balance="aux", seed=0):
    """A small fp64 MoE with its weights drawn here (d 6, width 5, 4 experts)."""
    cfg = GPTConfig(arch="llama", d_model=8, n_head=2, moe_experts=E, moe_top_k=top_k,
                    moe_shared_experts=shared, moe_balance=balance, moe_aux_coef=0.5,
                    moe_capacity_factor=capacity_factor)
    layer = MoE(D, lambda: SwiGLU(D, WIDTH, None, 0.02, Dropout(0.0, None)), None, cfg)
    rng = np.random.default_rng(seed)
    for _, p in layer.named_parameters():
        p.data = rng.normal(size=p.shape)           # large enough that routing differs by token
    return layer


def weights_of(layer):
    return [p for _, p in layer.named_parameters()]


def set_weights(layer, names, tensors):
    for name, t in zip(names, tensors):
        module = layer
        *path, attr = name.split(".")
        for part in path:
            module = module[int(part)] if part.isdigit() else getattr(module, part)
        setattr(module, attr, t)


def with_weights(layer, names, fn):
    """fn(x, *weights) for check_grad: the layer run with the given weights, set by
    ``names`` (check_grad replaces the Parameters by plain Tensors)."""
    def run(x, *ws):
        set_weights(layer, names, ws)
        return fn(layer, x)
    return run


@pytest.mark.parametrize("capacity_factor,shared", [(0.0, 0), (1.0, 1)], ids=["dropless", "capacity 1, shared"])
def test_gradients_of_router_and_experts_match_finite_differences(capacity_factor, shared):
    """The output with respect to the input, the router and every expert (the router's
    gradient flows through the renormalised top-k weights), and the balancing loss with
    respect to the input and the router (through the mean probabilities P)."""
    layer = moe_layer(capacity_factor=capacity_factor, shared=shared, balance="none")
    x = np.random.default_rng(1).normal(size=(2, 5, D))
    names = [name for name, _ in layer.named_parameters()]
    arrays = [x] + [p.data.copy() for p in weights_of(layer)]
    check_grad(with_weights(layer, names, lambda m, t: m(t)), *arrays, atol=1e-6, rtol=1e-5)

    def aux(m, t):
        probs = m.router_probs(t)
        return balance_loss(probs, route(probs.data, 2), E).reshape((1,))
    assert names[0] == "router.weight"
    check_grad(with_weights(layer, names, aux), *arrays[:2], atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_training_loss_gradient_includes_the_balancing_loss(fp64, recompute):
    """A whole llama with MoE blocks: the loss is cross-entropy + Σ aux, and the router's
    gradient is that of the total against finite differences — the aux part entering at
    its layer from the seed the loss received (check_grad seeds it with a random R), also
    when the blocks are recomputed in backward."""
    from minipar.nn import config_from_preset
    from minipar.nn.architectures import make_model
    from minipar.recompute import apply_recompute
    cfg = config_from_preset("llama-tiny", n_layer=2, d_model=16, n_head=2, n_kv_head=1,
                             seq_len=6, vocab_size=11, moe_experts=3, moe_every=2,
                             moe_aux_coef=2.0)
    model = apply_recompute(make_model(cfg), recompute)
    ids = np.random.default_rng(5).integers(0, 11, size=(2, 6))
    mlp = model.blocks[1].inner.mlp if recompute == "full" else model.blocks[1].mlp
    model(ids, ids)
    assert mlp.aux_loss is None                  # taken by the loss
    router = mlp.router.weight.data.copy()

    def loss(w):
        mlp.router.weight = w
        return model(ids, ids)[1].reshape((1,))
    check_grad(loss, router, atol=1e-8, rtol=1e-6)
    ce = float(ops.cross_entropy(model(ids), ids).numpy())
    mlp.router.weight = Tensor(router)
    total = float(model(ids, ids)[1].numpy())
    assert total - ce > 1e-3                     # the aux part is in the training loss


def test_top_k_weights_are_renormalised_and_drops_follow_the_stated_order():
    """Hand-made probabilities: the k largest per token, their weights summing to 1; with a
    capacity of 2 the kept assignments are, per expert, the first two in the order (every
    first choice before any second choice, then position) — checked against a plain loop."""
    probs = np.array([[[0.50, 0.30, 0.15, 0.05],      # token 0: experts 0, 1
                       [0.10, 0.60, 0.20, 0.10],      # token 1: experts 1, 2
                       [0.40, 0.35, 0.05, 0.20],      # token 2: experts 0, 1
                       [0.45, 0.05, 0.10, 0.40],      # token 3: experts 0, 3
                       [0.05, 0.70, 0.05, 0.20]]])    # token 4: experts 1, 3
    chosen = route(probs, 2)
    np.testing.assert_array_equal(chosen[0], [[0, 1], [1, 2], [0, 1], [0, 3], [1, 3]])
    top = np.take_along_axis(probs, chosen, axis=-1)
    np.testing.assert_allclose((top / top.sum(-1, keepdims=True))[0, 0], [0.625, 0.375])

    cap = capacity(0.8, 2, 5, 4)
    assert cap == math.ceil(0.8 * 2 * 5 / 4) == 2
    keep = kept_assignments(chosen, 4, cap)
    expected = np.zeros((5, 2), dtype=bool)
    taken = [0] * 4
    for j in range(2):                      # first choices, then second choices
        for t in range(5):                  # by position
            e = chosen[0, t, j]
            if taken[e] < cap:
                expected[t, j], taken[e] = True, taken[e] + 1
    np.testing.assert_array_equal(keep[0], expected)
    # expert 0: first choices at 0, 2, 3 -> token 3's first choice dropped; expert 1: first
    # choices at 1, 4 fill it -> second choices at tokens 0 and 2 dropped
    np.testing.assert_array_equal(expected, [[True, False], [True, True], [True, False],
                                             [False, True], [True, True]])


def test_a_dropped_assignment_contributes_nothing_and_is_not_renormalised_away():
    """Capacity so small that some tokens lose a choice: the output of such a token is
    w_kept · expert(x) with w_kept its weight among the k (not 1)."""
    layer = moe_layer(capacity_factor=0.25)                  # ⌈0.25·2·8/4⌉ = 1 per expert
    x = np.random.default_rng(2).normal(size=(1, 8, D))
    out = layer(Tensor(x)).numpy()[0]
    probs = layer.router_probs(Tensor(x)).numpy()
    chosen = route(probs, 2)
    keep = kept_assignments(chosen, E, 1)[0]
    w = np.take_along_axis(probs, chosen, -1)[0]
    w = w / w.sum(-1, keepdims=True)
    assert not keep.all()
    for t in range(8):
        expected = sum(w[t, j] * layer.experts[chosen[0, t, j]](Tensor(x[:, t:t + 1])).numpy()[0, 0]
                       for j in range(2) if keep[t, j])
        np.testing.assert_allclose(out[t], expected + 0 * out[t], rtol=1e-12, atol=1e-14)


def numpy_aux(probs, k):
    """E·Σ_i f_i·P_i per sequence, averaged: f over the k·T choices, P the mean probability."""
    b, t, e = probs.shape
    losses = []
    for s in range(b):
        top = np.argsort(-probs[s], axis=-1, kind="stable")[:, :k]
        f = np.bincount(top.ravel(), minlength=e) / (k * t)
        losses.append(e * np.sum(f * probs[s].mean(axis=0)))
    return np.mean(losses)


def test_balancing_loss_matches_numpy_per_sequence():
    probs = np.random.default_rng(3).dirichlet(np.ones(E), size=(3, 7))
    got = balance_loss(Tensor(probs), route(probs, 2), E).numpy()
    np.testing.assert_allclose(got, numpy_aux(probs, 2), rtol=1e-12)
    uniform = np.full((1, 8, E), 1 / E)                      # even routing: E·Σ (1/E)(1/E) = 1
    chosen = np.array([[[0, 1], [2, 3]] * 4])
    np.testing.assert_allclose(balance_loss(Tensor(uniform), chosen, E).numpy(), 1.0)


def test_two_sequences_give_the_mean_of_their_one_sequence_losses():
    """No statistic crosses sequences: outputs row by row and the aux loss as the mean of
    the two sequences' own (capacity on, so the drop rule is per sequence too)."""
    layer = moe_layer(capacity_factor=1.0)
    x = np.random.default_rng(4).normal(size=(2, 6, D))
    both = layer(Tensor(x)).numpy()
    aux_both = float(layer.aux_loss)
    singles, auxes = [], []
    for s in range(2):
        singles.append(layer(Tensor(x[s:s + 1])).numpy())
        auxes.append(float(layer.aux_loss))
    np.testing.assert_allclose(both, np.concatenate(singles), rtol=1e-12, atol=1e-15)
    assert aux_both == pytest.approx(np.mean(auxes), rel=1e-12)
    assert auxes[0] != pytest.approx(auxes[1], rel=1e-6)      # the two sequences do differ


MODEL = ["--model", "llama-tiny", "--n-layer", "2", "--d-model", "32", "--n-head", "4",
         "--n-kv-head", "2", "--seq-len", "16", "--moe-experts", "4", "--moe-top-k", "2"]


@pytest.mark.parametrize("capacity_flags", [[], ["--moe-capacity-factor", "1.0"]],
                         ids=["dropless", "capacity 1"])
def test_data_parallel_and_accumulation_reproduce_one_process(tmp_path, capacity_flags):
    """fp64, 5 steps: dp 2, dp 2 with ZeRO-1, 2 accumulated micro-batches, and dp 2 with
    ZeRO-3 and full recomputation (the aux gradient inside each re-run, regathered
    block) give the single process's losses, weights and Adam state (every statistic is
    per sequence)."""
    single = train(tmp_path, "single", 1, *capacity_flags, model=MODEL, batch=8)
    assert single[0][-1] < single[0][0]
    for n, flags in ((2, ["--dp", "2"]), (2, ["--dp", "2", "--zero", "1"]),
                     (1, ["--grad-accum", "2"]),
                     (2, ["--dp", "2", "--zero", "3", "--recompute", "full"])):
        run = train(tmp_path, "run", n, *flags, *capacity_flags, model=MODEL, batch=8)
        assert_same_run(run, single, rtol=1e-9)


def test_moe_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    common = ["-m", "minipar", "train", *MODEL, "--seed", "0", "--quiet", "--eval-batches", "0",
              "--data", "stdlib-bytes", "--precision", "fp64", "--batch-size", "8", "--steps", "6"]

    def losses(name, *flags):
        run_mpi(1, [*common, "--log-json", tmp_path / f"{name}.json", *flags], timeout=120)
        return [r["loss"] for r in step_records(tmp_path / f"{name}.json")]
    straight = losses("straight")
    first = losses("first", "--stop-at", "3", "--save", tmp_path / "ck")
    rest = losses("rest", "--resume", tmp_path / "ck")
    np.testing.assert_allclose(first + rest, straight, rtol=1e-12, atol=0)


TINY = ["--model", "llama-tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16"]
REFUSALS = [  # (world size, flags, what the one line must say)
    (1, ["--arch", "gpt2", "--model", "tiny", "--moe-experts", "4"], "--moe-experts belongs to --arch llama"),
    (1, ["--moe-experts", "4", "--moe-top-k", "5"], "--moe-top-k must be in [1, moe_experts = 4], got 5"),
    (1, ["--moe-experts", "4", "--moe-top-k", "0"], "--moe-top-k must be in [1, moe_experts = 4], got 0"),
    (1, ["--moe-experts", "4", "--moe-capacity-factor", "-1"], "--moe-capacity-factor must be a finite number >= 0"),
    (1, ["--moe-top-k", "1"], "--moe-top-k sets the mixture of experts; add --moe-experts E"),
    (1, ["--moe-experts", "4", "--moe-balance", "none", "--moe-aux-coef", "0.1"], "--moe-aux-coef weighs the aux balancing loss; --moe-balance none has none"),
    (2, ["--moe-experts", "4", "--tp", "2"], "--moe-experts with --tp needs --sequence-parallel"),
]


@pytest.mark.parametrize("size,flags,message", REFUSALS, ids=[f"{n} {' '.join(f)}" for n, f, _ in REFUSALS])
def test_moe_refusals_come_first_from_the_config_checks(size, flags, message):
    args = build_parser().parse_args(["train", *TINY, *flags])
    with pytest.raises(ConfigError) as refused:
        config_from_flags(args, rank_and_size=(0, size))
    assert message in as_flags(refused.value)


def test_moe_refusal_through_the_command_line_is_one_line_exit_2():
    proc = run_mpi(2, ["-m", "minipar", "train", *TINY, "--steps", "1", "--moe-experts", "4",
                       "--tp", "2"], check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipar train: "), proc.stderr
    assert "needs --sequence-parallel" in lines[0] and not proc.stdout.strip()

