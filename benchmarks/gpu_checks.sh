#!/usr/bin/env bash
# Every check that needs a GPU, in one go (the CPU tests run anywhere):
#   1. the CUDA compile checks (nvcc, if present) and the kernels vs the float64 reference
#      (tests/test_flash_gpu.py, tests/test_fused_gpu.py, CuPy backend);
#   2. the attention benchmark: flash kernels vs naive CuPy vs PyTorch flash SDPA;
#   3. the fused elementwise ops: CUDA kernels vs CuPy array code vs PyTorch.
# Needs CuPy (and, for the PyTorch columns, torch) already installed; installs nothing
# beyond `pip install -e .` when minipar itself is not importable.  Output goes to
# $OUT (if set) or runs/gpu_checks/, and to the terminal.
#
#   bash benchmarks/gpu_checks.sh            # full benchmark
#   QUICK=1 bash benchmarks/gpu_checks.sh    # N = 1k, 4k only
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/runs/gpu_checks}"
mkdir -p "$OUT_DIR"
export MINIPAR_BACKEND=cupy PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

python -c "import minipar" 2>/dev/null || pip install --no-deps -e . >"$OUT_DIR/pip.txt" 2>&1
python -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" \
    || { echo "gpu_checks: CuPy with a visible GPU is required" | tee "$OUT_DIR/error.txt"; exit 2; }
{ nvidia-smi || true; python -c "import cupy; print('cupy', cupy.__version__)";
  python -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "torch: not installed"; } \
    >"$OUT_DIR/environment.txt" 2>&1

status=0
echo "== pytest: GPU kernels vs reference, compile check, the GPT and train on CuPy" | tee "$OUT_DIR/pytest_gpu.txt"
timeout 300 python -m pytest -q -rs tests/test_flash_gpu.py tests/test_flash_compile.py \
    tests/test_gpu_backend.py tests/test_fused_gpu.py tests/test_fused_compile.py 2>&1 \
    | tee -a "$OUT_DIR/pytest_gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

SIZES=1024,2048,4096,8192
[ -n "${QUICK:-}" ] && SIZES=1024,4096
echo "== benchmark: attention (sizes $SIZES)" | tee "$OUT_DIR/bench_attention.txt"
timeout 420 python benchmarks/attention.py --sizes "$SIZES" 2>&1 | tee -a "$OUT_DIR/bench_attention.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark: fused elementwise ops (LayerNorm, GELU, attention softmax)" | tee "$OUT_DIR/bench_fused_ops.txt"
timeout 180 python benchmarks/fused_ops.py 2>&1 | tee -a "$OUT_DIR/bench_fused_ops.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "gpu_checks: exit status $status; outputs in $OUT_DIR"
exit $status
