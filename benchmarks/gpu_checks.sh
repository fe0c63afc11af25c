#!/usr/bin/env bash
# Every check that needs a GPU, in one go (the CPU tests run anywhere):
#   1. the CUDA compile checks (nvcc, if present) and the kernels vs the float64 reference
#      (tests/test_flash_gpu.py, tests/test_fused_gpu.py, CuPy backend);
#   2. the attention benchmark: flash kernels vs naive CuPy vs PyTorch flash SDPA, fp16,
#      d = 64 and 128, N = 1k..8k (issue 36's targets: forward >= 0.9x, backward >= 0.8x
#      of SDPA's), then grouped-query attention (4 query heads per KV head, causal) against
#      SDPA with enable_gqa;
#   3. the fused elementwise ops: CUDA kernels vs CuPy array code vs PyTorch;
#   4. a GPT training step, minipar on CuPy vs PyTorch on CUDA (step_time.py --device cuda);
#   5. `minipar train --backend cupy`, a short run of the GPT-2-small shape, fp32 and fp16.
# Needs CuPy (and, for the PyTorch columns, torch) already installed; installs nothing
# beyond `pip install -e .` when minipar itself is not importable.  Output goes to
# $OUT (if set) or runs/gpu_checks/, and to the terminal.
#
#   bash benchmarks/gpu_checks.sh            # full benchmark
#   QUICK=1 bash benchmarks/gpu_checks.sh    # N = 1k, 4k only, fewer steps, and no nvcc
#                                            # compile checks (they run wherever nvcc is)
# Each part has its own time limit (seconds): T_TESTS, T_ATTENTION, T_ATTENTION_GQA, T_FUSED, T_STEP,
# T_TRAIN.
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
TESTS="tests/test_flash_gpu.py tests/test_gpu_backend.py tests/test_fused_gpu.py"
[ -z "${QUICK:-}" ] && TESTS="$TESTS tests/test_flash_compile.py tests/test_fused_compile.py"
# shellcheck disable=SC2086
timeout "${T_TESTS:-300}" python -m pytest -q -rs --durations=8 $TESTS 2>&1 \
    | tee -a "$OUT_DIR/pytest_gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

SIZES=1024,2048,4096,8192
[ -n "${QUICK:-}" ] && SIZES=1024,4096
echo "== benchmark: attention (sizes $SIZES)" | tee "$OUT_DIR/bench_attention.txt"
timeout "${T_ATTENTION:-420}" python benchmarks/attention.py --sizes "$SIZES" 2>&1 | tee -a "$OUT_DIR/bench_attention.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== benchmark: grouped-query attention, 4 query heads per KV head (sizes 1024,4096)" \
    | tee "$OUT_DIR/bench_attention_gqa.txt"
timeout "${T_ATTENTION_GQA:-150}" python benchmarks/attention.py --sizes 1024,4096 --causal yes --kv-group 4 2>&1 \
    | tee -a "$OUT_DIR/bench_attention_gqa.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark: fused elementwise ops (LayerNorm, GELU, attention softmax)" | tee "$OUT_DIR/bench_fused_ops.txt"
timeout "${T_FUSED:-180}" python benchmarks/fused_ops.py 2>&1 | tee -a "$OUT_DIR/bench_fused_ops.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

STEPS=20
[ -n "${QUICK:-}" ] && STEPS=8
echo "== benchmark: GPT step, minipar (CuPy) vs PyTorch (CUDA)" | tee "$OUT_DIR/bench_step_gpu.txt"
for shape in "--layers 4 --d-model 256 --heads 4 --seq 256 --batch 8" \
             "--layers 12 --d-model 768 --heads 12 --seq 1024 --batch 8"; do
  for attention in naive flash; do
    # shellcheck disable=SC2086
    timeout "${T_STEP:-120}" python benchmarks/step_time.py --device cuda --attention $attention \
        --steps $STEPS $shape 2>&1 | tee -a "$OUT_DIR/bench_step_gpu.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
done

echo "== train: minipar train --backend cupy, GPT-2-small shape" | tee "$OUT_DIR/train_gpu.txt"
for precision in fp32 fp16; do   # CuPy 14 has no bfloat16
  timeout "${T_TRAIN:-120}" python -m minipar train --backend cupy --model gpt2 --attention flash \
      --precision $precision --seq-len 1024 --batch-size 8 --steps $((STEPS * 2)) --eval-batches 2 \
      --log-json "$OUT_DIR/train_$precision.json" 2>&1 | tee -a "$OUT_DIR/train_gpu.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

echo "gpu_checks: exit status $status; outputs in $OUT_DIR"
exit $status
