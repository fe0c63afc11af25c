"""Grouped-query attention in the flash reference: K/V with fewer heads, read in place.

The oracle repeats K and V explicitly — KV head j copied to query heads jG..jG+G-1 —
runs dense float64 attention on the repeated arrays, and sums the repeated heads'
gradients back over each group (the chain rule through the copy).  The flash code must
give the same numbers without ever making that copy; finite differences check the
autograd Function independently of both.
"""
import re

import numpy as np
import pytest

from minipar.autograd import Tensor
from minipar.kernels.dense import dense_attention_backward, dense_attention_forward
from minipar.kernels.flash_attention import flash_attention
from minipar.kernels.flash_reference import (flash_backward_reference, flash_forward_reference,
                                             grouped_views)
from tests.gradcheck import check_grad
from tests.tolerance import assert_close_normwise


def gqa_inputs(heads, kv_heads, n_queries, n_keys, head_dim, batch=2, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads, n_queries, head_dim)).astype(dtype)
    k, v = (rng.standard_normal((batch, kv_heads, n_keys, head_dim)).astype(dtype) for _ in "kv")
    grad_out = rng.standard_normal(q.shape).astype(dtype)
    return q, k, v, grad_out


def repeated_oracle(q, k, v, grad_out, causal):
    """(out, dq, dk, dv) by dense attention on explicitly repeated K/V, in float64."""
    group = q.shape[1] // k.shape[1]
    q, k, v, grad_out = (a.astype(np.float64) for a in (q, k, v, grad_out))
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    out, probs = dense_attention_forward(q, k_rep, v_rep, causal)
    dq, dk_rep, dv_rep = dense_attention_backward(q, k_rep, v_rep, probs, grad_out)
    fold = lambda g: g.reshape(k.shape[0], k.shape[1], group, *g.shape[2:]).sum(axis=2)
    return out, dq, fold(dk_rep), fold(dv_rep)


SHAPES = [  # (H, Hkv, Nq, Nk, d, block_q, block_k)
    (4, 2, 37, 37, 16, 16, 8),
    (4, 1, 50, 50, 8, 16, 16),     # multi-query: one KV head for all
    (6, 2, 40, 23, 16, 16, 8),     # more queries than keys: causal rows that see nothing
    (8, 2, 23, 40, 16, 8, 16),     # fewer queries than keys
    (3, 3, 29, 29, 8, 8, 8),       # G = 1: plain multi-head
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads,n_queries,n_keys,head_dim,block_q,block_k", SHAPES)
def test_grouped_reference_matches_repeated_dense(heads, kv_heads, n_queries, n_keys, head_dim,
                                                  block_q, block_k, causal):
    q, k, v, grad_out = gqa_inputs(heads, kv_heads, n_queries, n_keys, head_dim)
    out, lse = flash_forward_reference(q, k, v, causal, block_q, block_k)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    grads = flash_backward_reference(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    for got, want in zip((out,) + grads, repeated_oracle(q, k, v, grad_out, causal)):
        assert np.isfinite(got).all()
        assert_close_normwise(got, want, 1e-12, floor=1.0)


def test_grouped_views_do_not_copy():
    q, k, v, _ = gqa_inputs(8, 2, 16, 16, 4)
    gq, gk, gv = grouped_views(q, k, v)
    assert gq.shape == (2, 2, 4, 16, 4) and gk.shape == gv.shape == (2, 2, 1, 16, 4)
    assert all(np.shares_memory(a, b) for a, b in ((gq, q), (gk, k), (gv, v)))
    assert np.array_equal(gq[:, 1, 3], q[:, 1 * 4 + 3])   # query head 7 sits in group 1


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_grouped_half_and_single_precision(dtype, tol):
    q, k, v, grad_out = gqa_inputs(4, 2, 45, 45, 16, dtype=dtype)
    out, lse = flash_forward_reference(q, k, v, True)
    grads = flash_backward_reference(q, k, v, out, lse, grad_out, True)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    want = repeated_oracle(q, k, v, grad_out, True)
    assert_close_normwise(out, want[0], tol, floor=1.0)
    for got, w in zip(grads, want[1:]):
        assert_close_normwise(got, w, 10 * tol, floor=1.0)


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_flash_attention_gradients_match_finite_differences(causal):
    q, k, v, _ = gqa_inputs(4, 2, 6, 6, 3, batch=1, seed=3)
    check_grad(lambda a, b, c: flash_attention(a, b, c, causal=causal), q, k, v)


def test_autograd_function_returns_kv_shaped_gradients():
    q, k, v, grad_out = gqa_inputs(6, 3, 20, 20, 8)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = flash_attention(tq, tk, tv)
    out.backward(grad_out)
    want = repeated_oracle(q, k, v, grad_out, True)
    for got, w in zip((out.data, tq.grad, tk.grad, tv.grad), want):
        assert_close_normwise(got, w, 1e-12, floor=1.0)


def test_head_counts_that_do_not_group_are_refused():
    q, k, v, _ = gqa_inputs(6, 4, 8, 8, 4)
    with pytest.raises(ValueError, match="6 heads and k, v 4: the query heads must be a whole multiple"):
        flash_attention(Tensor(q), Tensor(k), Tensor(v))
    with pytest.raises(ValueError, match="whole multiple"):
        flash_forward_reference(q, k, v)


def test_bench_refuses_a_group_that_does_not_divide_the_heads():
    from minipar.cli_checks import CommandError
    from minipar.kernels.bench import parse_args
    with pytest.raises(CommandError, match="--kv-group 3 does not divide the 32 heads of --head-dims 64"):
        parse_args(["--kv-group", "3"])


def test_bench_grouped_query_column_dry_runs_on_the_fake_cupy():
    """The attention benchmark's grouped-query path (``benchmarks/attention.py --kv-group``),
    on tests/fake_cupy: the kernels emulated, a tiny shape; it must print both rows."""
    import os
    import subprocess
    import sys
    from minipar.kernels import emulator
    if emulator.compiler() is None:
        pytest.skip("the CPU emulator needs a C++ compiler")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(repo, "tests", "fake_cupy"), repo]))
    env.pop("MINIPAR_BACKEND", None)
    proc = subprocess.run([sys.executable, "benchmarks/attention.py", "--sizes", "16", "--head-dims", "32",
                           "--kv-group", "2", "--repeats", "1", "--tokens", "16", "--width", "64",
                           "--causal", "yes"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 query heads per KV head" in proc.stdout
    for impl in ("flash", "naive"):
        assert re.search(rf"^\s+32\s+16\s+True\s+{impl}\s+\d", proc.stdout, re.M), proc.stdout
