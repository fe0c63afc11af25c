"""The CUDA flash-attention kernels against the float64 reference, on the CPU.

``minipar.kernels.emulator`` runs the .cu source itself (one fiber per CUDA thread,
warp-wide PTX modelled from the PTX ISA; see tests/test_cpu_emulator.py for the emulator's
own checks) through ``flash_cuda``'s launch code, so everything but the silicon is what a
GPU run executes.  Three properties, each for fp32 and the fp16 tensor-core kernels (the
bf16 kernels are the same template as fp16's, so they are checked for results, at a few
shapes by default and more in the slow run):

- results: the tolerances of the GPU test (tests/test_flash_gpu.py) — fp32 1e-5 of the
  largest value; fp16 forward 2e-3 absolute, gradients 4e-3 of the largest gradient; bf16
  (8 significant bits to fp16's 11, unit roundoff u = 2^-9) forward 4u = 7.8e-3,
  gradients 8u = 1.6e-2 — under AddressSanitizer and UBSan (no access outside a buffer,
  none misaligned);
- no data race under ThreadSanitizer, with only the ordering CUDA guarantees;
- the same bits under every schedule and whatever fresh shared memory holds;
- grouped-query attention (k, v with Hkv < H heads, read in place) against a reference
  that repeats K/V explicitly and sums the repeated heads' gradients.
Skipped where no C++ compiler is installed.
"""
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype with NumPy)
import numpy as np
import pytest

from minipar.kernels import emulator, flash_cuda
from minipar.kernels.emulator import EmulatedKernels, build
from tests.flash_runs import reference, run
from tests.tolerance import assert_close_normwise

pytestmark = pytest.mark.skipif(emulator.compiler() is None, reason="no C++ compiler")

CASES = [  # (dtype, B, H, Hkv, Nq, Nk, d)
    ("float32", 2, 1, 1, 77, 77, 64),     # odd N: partial tiles
    ("float32", 1, 1, 1, 1, 1, 64),
    ("float32", 1, 2, 2, 100, 37, 40),    # causal rows 0..62 see nothing; d not a power of two
    ("float32", 1, 1, 1, 200, 37, 64),    # causal: a whole block of queries sees no key
    ("float32", 1, 1, 1, 37, 150, 40),    # fewer queries than keys
    ("float32", 1, 2, 2, 128, 128, 128),  # whole tiles; the largest shared memory (opt-in above 48 KiB)
    ("float32", 2, 4, 2, 70, 70, 64),     # grouped-query: 2 query heads per KV head
    ("float32", 1, 4, 1, 40, 90, 40),     # multi-query: all 4 heads on one KV head
    ("float16", 1, 2, 2, 77, 77, 64),
    ("float16", 1, 1, 1, 1, 1, 64),
    ("float16", 1, 2, 2, 100, 37, 64),
    ("float16", 1, 1, 1, 200, 37, 64),
    ("float16", 1, 1, 1, 37, 150, 64),
    ("float16", 1, 1, 1, 70, 260, 32),    # 128-key tiles (d <= 64): 3, stage 0 reused, the last holds 4 keys
    ("float16", 1, 1, 1, 70, 70, 96),
    ("float16", 1, 1, 1, 256, 256, 128),  # whole tiles, several blocks per head
    ("float16", 1, 4, 2, 70, 70, 64),     # grouped-query
    ("float16", 1, 3, 1, 40, 70, 64),     # multi-query, fewer queries than keys
    ("bfloat16", 1, 2, 1, 40, 70, 64),    # grouped-query, partial tiles, fewer queries than keys
    ("bfloat16", 1, 2, 2, 77, 77, 64),
    ("bfloat16", 1, 1, 1, 100, 37, 32),   # causal rows that see nothing
    ("bfloat16", 1, 1, 1, 70, 260, 32),   # 128-key tiles
    ("bfloat16", 1, 1, 1, 70, 70, 96),
    ("bfloat16", 1, 1, 1, 256, 256, 128), # whole tiles, several blocks per head
]
# forward, gradients: largest error over the largest value (at least 1); see the module doc
TOLERANCES = {"float32": (1e-5, 1e-5), "float16": (2e-3, 4e-3), "bfloat16": (2.0 ** -7, 2.0 ** -6)}
# races: d 64/128 with more than one query; multi-query adds nothing to grouped-query's walk;
# bf16 runs fp16's code (one template), so its races are fp16's
RACE_CASES = [c for c in CASES if c[-1] in (64, 128) and c[4] > 1 and not (c[3] == 1 and c[2] > 1)
              and c[0] != "bfloat16"]
CASE_ID = "%s-B%d-H%d-Hkv%d-Nq%d-Nk%d-d%d"
# By default, one case of each property the kernels must get right, at head dims 64 and 32
# only (each head dim and check is a g++ build of its own): partial tiles, grouped- and
# multi-query heads, causal rows or whole query blocks that see no key, 128-key tiles,
# one query, bf16; in fp32, fp16's tiling and both masks where they differ.  The rest of
# the matrix — d 40/96/128 (whole tiles, the largest shared memory), the twins whose walk
# is a default case's but for the mask, bf16 but for one case — runs in the slow set.
DEFAULT_MATCHES = {(("float32", 2, 4, 2, 70, 70, 64), False), (("float32", 2, 4, 2, 70, 70, 64), True),
                   (("float32", 1, 1, 1, 200, 37, 64), True),
                   (("float16", 1, 2, 2, 77, 77, 64), False), (("float16", 1, 2, 2, 77, 77, 64), True),
                   (("float16", 1, 1, 1, 70, 260, 32), True), (("float16", 1, 3, 1, 40, 70, 64), True),
                   (("float16", 1, 1, 1, 1, 1, 64), True), (("bfloat16", 1, 2, 1, 40, 70, 64), True)}
DEFAULT_RACES = {("float32", 2, 4, 2, 70, 70, 64), ("float16", 1, 4, 2, 70, 70, 64)}


def slow_if(values, slow, id):
    return pytest.param(*values, id=id, marks=[pytest.mark.slow] if slow else [])


MATCHES = [slow_if((case, causal), (case, causal) not in DEFAULT_MATCHES, f"{CASE_ID % case}-{causal}")
           for case in CASES for causal in (False, True)]
RACES = [slow_if((case,), case not in DEFAULT_RACES, CASE_ID % case) for case in RACE_CASES]


@pytest.fixture(scope="module", autouse=True)
def built_kernels(request):
    """Compile every program the selected tests need at once (one g++ per core); the fp16
    and bf16 kernels share a source, so one program serves both."""
    wanted = []
    for item in request.session.items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if item.module is request.module and params and "case" in params:
            wanted.append((params["case"], "race" if "race" in item.name else "memory"))
    jobs = {(flash_cuda.kernel_source(flash_cuda.KINDS[c[0]]), c[-1], check) for c, check in wanted}
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda j: build(j[0], j[1], "flash", j[2]), jobs))


class NumpyWithNanEmpty:
    """NumPy whose ``empty`` and ``empty_like`` come filled with NaN, as a GPU's fresh memory
    holds anything: flash_cuda does not zero out, lse, dk, dv, so an element a kernel leaves
    unwritten fails the check instead of passing as a lucky zero."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=np.float64):
        return np.full(shape, np.nan, dtype=dtype)

    @staticmethod
    def empty_like(a, dtype=None):
        return np.full_like(a, np.nan, dtype=dtype)


class UnfilledKernels(EmulatedKernels):
    xp = NumpyWithNanEmpty()


def inputs(dtype, batch, heads, kv_heads, n_queries, n_keys, head_dim, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(batch, heads, n_queries, head_dim), (batch, kv_heads, n_keys, head_dim),
              (batch, kv_heads, n_keys, head_dim), (batch, heads, n_queries, head_dim)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def check_against_reference(got, want, dtype):
    out, lse, *grads = got
    want_out, want_lse, *want_grads = want
    assert out.dtype == dtype and lse.dtype == np.float32 and all(g.dtype == dtype for g in grads)
    assert [a.shape for a in got] == [a.shape for a in want]
    assert all(np.isfinite(a).all() for a in [out, *grads])  # NaN: an element no kernel wrote
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    seen = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[seen], want_lse[seen], atol=1e-4)
    forward_tolerance, gradient_tolerance = TOLERANCES[dtype]
    assert relative_error(out, want_out) <= forward_tolerance, relative_error(out, want_out)
    for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
        assert relative_error(g, w) <= gradient_tolerance, (name, relative_error(g, w))


def relative_error(got, want):
    """The largest error over the largest value of the float64 reference (at least 1)."""
    return np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max())


@pytest.mark.parametrize("case,causal", MATCHES)
def test_kernels_match_reference(case, causal):
    dtype, *shape = case
    q, k, v, grad_out = inputs(dtype, *shape)
    check_against_reference(run(q, k, v, grad_out, causal, UnfilledKernels()), reference(q, k, v, grad_out, causal),
                            dtype)


@pytest.mark.parametrize("case", RACES)
def test_kernels_have_no_data_race(case):
    """ThreadSanitizer stops the run at the first race; the results must still be right."""
    dtype, *shape = case
    q, k, v, grad_out = inputs(dtype, *shape, seed=1)
    got = run(q, k, v, grad_out, True, EmulatedKernels(check="race", schedule="shuffled", seed=1))
    check_against_reference(got, reference(q, k, v, grad_out, True), dtype)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float16", marks=pytest.mark.slow)])
def test_results_do_not_depend_on_schedule_or_shared_memory_contents(dtype):
    q, k, v, grad_out = inputs(dtype, 1, 2, 1, 120, 120, 64, seed=3)  # grouped: barriers across a group
    first = run(q, k, v, grad_out, True, EmulatedKernels())
    for options in [dict(schedule="greedy"), dict(schedule="shuffled", seed=1), dict(schedule="shuffled", seed=2),
                    dict(fill=0x3C)]:
        for a, b in zip(first, run(q, k, v, grad_out, True, EmulatedKernels(**options))):
            np.testing.assert_array_equal(a, b, err_msg=str(options))


def test_gpt_with_flash_attention_runs_the_emulated_kernels(monkeypatch):
    """The whole path a GPU run takes — GPT, the autograd Function, flash_cuda's launches —
    with the kernels emulated: loss and every gradient equal the array reference's."""
    from minipar.nn.gpt import GPT, GPTConfig
    config = GPTConfig(vocab_size=32, seq_len=40, n_layer=2, d_model=48, n_head=2, attention="flash")
    ids = np.random.default_rng(0).integers(0, 32, (2, 41))
    calls = []
    real_forward = flash_cuda.forward
    monkeypatch.setattr(flash_cuda, "forward", lambda *a, **kw: calls.append(kw["kernels"]) or real_forward(*a, **kw))
    results = {}
    for implementation in ("reference", "emulated"):
        model = GPT(config, seed=0)
        for block in model.blocks:                   # chosen per model, no global switch
            block.attn.core.implementation = implementation
        _, loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        results[implementation] = (loss.data, {n: p.grad for n, p in model.named_parameters()})
    assert len(calls) == 2 and all(isinstance(k, EmulatedKernels) for k in calls)  # one per layer
    (ref_loss, ref_grads), (emu_loss, emu_grads) = results["reference"], results["emulated"]
    assert_close_normwise(emu_loss, ref_loss, 1e-5)
    for name, grad in ref_grads.items():
        assert_close_normwise(emu_grads[name], grad, 1e-5, err_msg=name)
