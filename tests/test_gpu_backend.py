"""The same model code on CuPy: skipped unless CuPy and a GPU are present.

Run on a GPU machine with ``python -m pytest -q tests/test_gpu_backend.py`` (or through
``python3 benchmarks/gpu_check.py``, which runs every GPU check in one go)."""
import json

import numpy as np
import pytest

from minipar import backend
from minipar.observe.runlog import step_records
from tests.mpirun import run_mpi

pytestmark = pytest.mark.skipif(not backend.cupy_available(), reason="needs CuPy and a GPU")


@pytest.fixture
def cupy_fp64():
    backend.set_backend("cupy")
    backend.set_default_dtype(np.float64)
    yield
    backend.set_backend("numpy")
    backend.set_default_dtype(np.float32)


def test_gpt_forward_backward_matches_numpy(cupy_fp64):
    from minipar.nn import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)
    ids = np.random.default_rng(0).integers(0, 64, (2, 16))
    gpu = GPT(cfg, seed=0)
    _, loss_gpu = gpu(backend.to_device(ids), backend.to_device(ids))
    loss_gpu.backward()
    backend.set_backend("numpy")
    cpu = GPT(cfg, seed=0)
    _, loss_cpu = cpu(ids, ids)
    loss_cpu.backward()
    assert abs(loss_gpu.item() - loss_cpu.item()) < 1e-12
    for (name, a), (_, b) in zip(gpu.named_parameters(), cpu.named_parameters()):
        np.testing.assert_allclose(backend.to_host(a.grad), b.grad, rtol=1e-9, atol=1e-12, err_msg=name)


def test_train_cli_on_cupy_matches_numpy(tmp_path):
    flags = ["-m", "minipar", "train", "--model", "tiny", "--steps", "3", "--precision", "fp64",
             "--quiet", "--eval-batches", "0", "--batch-size", "8"]
    run_mpi(1, flags + ["--backend", "numpy", "--log-json", tmp_path / "cpu.json"])
    # --share-gpus: two ranks on a one-GPU machine share it (more GPUs: one each)
    run_mpi(2, flags + ["--backend", "cupy", "--share-gpus", "--dp", "2", "--log-json", tmp_path / "gpu.json"])
    cpu = [r["loss"] for r in step_records(tmp_path / "cpu.json")]
    gpu = [r["loss"] for r in step_records(tmp_path / "gpu.json")]
    np.testing.assert_allclose(gpu, cpu, rtol=1e-10)


def test_pipelined_train_and_evaluation_on_cupy_match_numpy(tmp_path):
    """The pipeline's activations, its forward-only evaluation and the val loss's reduction
    from the last stage, on device arrays."""
    flags = ["-m", "minipar", "train", "--model", "tiny", "--steps", "2", "--precision", "fp64",
             "--quiet", "--eval-batches", "1", "--batch-size", "8", "--pp", "2", "--microbatches", "2"]
    backends = {"numpy": ["--backend", "numpy"], "cupy": ["--backend", "cupy", "--share-gpus"]}
    runs = {b: run_mpi(2, flags + given).stdout for b, given in backends.items()}
    val = {b: [line for line in out.splitlines() if line.startswith("val loss")] for b, out in runs.items()}
    assert len(val["cupy"]) == 1
    np.testing.assert_allclose(float(val["cupy"][0].split()[2]), float(val["numpy"][0].split()[2]), rtol=1e-10)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_matmul_rounds_an_fp32_sum_once(precision):
    """kernels/half_gemm.py: cuBLAS gemmEx / gemmStridedBatchedEx on fp16 or bf16 operands
    of every layout the model hands it (2-D, transposed views, batched with kᵀ, a weight
    broadcast over the batch, q and k sliced from the fused qkv, a bias) is the exact
    product rounded once to half: within 2·u_half·(|A|·|B| + |bias|) of the float64 value."""
    import cupy
    from minipar.kernels.half_gemm import half_matmul
    from tests.tolerance import assert_sums_close
    backend.set_backend("cupy")
    try:
        try:
            dtype = backend.dtype_of(precision)
        except RuntimeError as err:
            pytest.skip(str(err))
        rng = np.random.default_rng(0)
        host = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
        qkv = cupy.asarray(host(2, 5, 3, 2, 4)).transpose(2, 0, 3, 1, 4)   # (3, B, H, N, d)
        cases = [(cupy.asarray(host(6, 8)), cupy.asarray(host(8, 5)), None),
                 (cupy.asarray(host(8, 6)).T, cupy.asarray(host(5, 8)).T, cupy.asarray(host(5))),
                 (cupy.asarray(host(2, 3, 6, 8)), cupy.swapaxes(cupy.asarray(host(2, 3, 5, 8)), -1, -2), None),
                 (cupy.asarray(host(3, 6, 8)), cupy.asarray(host(8, 5)), cupy.asarray(host(5))),
                 (qkv[0], cupy.swapaxes(qkv[1], -1, -2), None)]
        for a, b, bias in cases:
            got = half_matmul(a, b, bias)
            a64, b64 = (backend.to_host(x).astype(np.float64) for x in (a, b))
            exact, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
            if bias is not None:
                exact, scale = exact + backend.to_host(bias).astype(np.float64), scale + np.abs(
                    backend.to_host(bias).astype(np.float64))
            assert got.dtype == dtype and got.shape == exact.shape
            assert_sums_close(backend.to_host(got), exact, dtype=dtype, terms=1, abs_sum=scale,
                              err_msg=f"{a.shape} @ {b.shape}")
    finally:
        backend.set_backend("numpy")
