#!/usr/bin/env bash
# Every check that needs a GPU, in one go (the CPU tests run anywhere), one function per
# measurement so that a section can be added or run alone:
#   tests       the CUDA compile checks (nvcc, if present) and the kernels vs the float64
#               reference (tests/test_flash_gpu.py, tests/test_fused_gpu.py, CuPy backend);
#   attention   flash kernels vs naive CuPy vs PyTorch flash SDPA, fp16, d = 64 and 128, N = 1k..8k
#               (targets: forward >= 0.9x, backward >= 0.8x of SDPA's), then grouped-query
#               attention (4 query heads per KV head, causal) against SDPA with enable_gqa;
#   fused       the fused elementwise ops: CUDA kernels vs CuPy array code vs PyTorch;
#   step        a GPT training step, minipar on CuPy vs PyTorch on CUDA (step_time.py);
#   throughput  `minipar train --backend cupy` tokens/s on the GPT-2-small shape in
#               fp32, fp16 and bf16 against PyTorch eager with autocast on the same model, in
#               the same run, with the ratios (benchmarks/train_throughput.py).
# SECTIONS picks them (default: targets = attention + throughput, the two with targets, under
# ten minutes on one H200; `all` for every section):
#   bash benchmarks/gpu_checks.sh                       # attention + throughput
#   SECTIONS=all bash benchmarks/gpu_checks.sh          # everything
#   SECTIONS="tests step" QUICK=1 bash benchmarks/gpu_checks.sh
# QUICK=1: N = 1k, 4k only, fewer steps, and no nvcc compile checks (they run wherever nvcc is).
# Each section has its own time limit (seconds): T_TESTS, T_ATTENTION, T_ATTENTION_GQA, T_FUSED, T_STEP,
# T_THROUGHPUT (and T_RUN for each of its minipar runs, so one slow precision leaves the
# others' figures); THROUGHPUT_ARGS replaces the throughput section's shape and step flags (the
# CPU dry run, tests/test_gpu_checks_dry_run.py, runs it on the fake CuPy with a tiny shape).
# Needs CuPy (and, for the PyTorch columns, torch) already installed; installs nothing
# beyond `pip install -e .` when minipar itself is not importable.  Output goes to
# $OUT (if set) or runs/gpu_checks/, and to the terminal.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/runs/gpu_checks}"
mkdir -p "$OUT_DIR"
export MINIPAR_BACKEND=cupy PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STEPS=20
[ -n "${QUICK:-}" ] && STEPS=8
status=0

# run LABEL FILE LIMIT CMD...: the command under its time limit, output to the terminal and
# $OUT_DIR/FILE; a failure marks the whole run failed but the other sections still run
declare -A STARTED   # output files begun by this run (a file is emptied when first used)
run() {
  local label=$1 file=$2 limit=$3; shift 3
  [ -n "${STARTED[$file]:-}" ] || : >"$OUT_DIR/$file"
  STARTED[$file]=1
  echo "== $label" | tee -a "$OUT_DIR/$file"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT_DIR/$file"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

section_tests() {
  local tests="tests/test_flash_gpu.py tests/test_gpu_backend.py tests/test_fused_gpu.py"
  [ -z "${QUICK:-}" ] && tests="$tests tests/test_flash_compile.py tests/test_fused_compile.py"
  # shellcheck disable=SC2086
  run "pytest: GPU kernels vs reference, compile check, the GPT and train on CuPy" \
      pytest_gpu.txt "${T_TESTS:-300}" python -m pytest -q -rs --durations=8 $tests
}

section_attention() {
  local sizes=1024,2048,4096,8192
  [ -n "${QUICK:-}" ] && sizes=1024,4096
  run "benchmark: attention (sizes $sizes)" bench_attention.txt "${T_ATTENTION:-420}" \
      python benchmarks/attention.py --sizes "$sizes"
  run "benchmark: grouped-query attention, 4 query heads per KV head (sizes 1024,4096)" \
      bench_attention_gqa.txt "${T_ATTENTION_GQA:-150}" \
      python benchmarks/attention.py --sizes 1024,4096 --causal yes --kv-group 4
}

section_fused() {
  run "benchmark: fused elementwise ops (LayerNorm, GELU, attention softmax)" bench_fused_ops.txt \
      "${T_FUSED:-180}" python benchmarks/fused_ops.py
}

section_step() {
  local shape attention
  for shape in "--layers 4 --d-model 256 --heads 4 --seq 256 --batch 8" \
               "--layers 12 --d-model 768 --heads 12 --seq 1024 --batch 8"; do
    for attention in naive flash; do
      # shellcheck disable=SC2086
      run "benchmark: GPT step, minipar (CuPy) vs PyTorch (CUDA), $attention, $shape" \
          bench_step_gpu.txt "${T_STEP:-120}" python benchmarks/step_time.py --device cuda \
          --attention $attention --steps $STEPS $shape
    done
  done
}

section_throughput() {
  # GPT-2-small shape: 12 layers, d 768, 12 heads, 1024 tokens, batch 8; 30 steps, the
  # first 5 left out; minipar with its flash kernels, PyTorch with its flash SDPA
  local args="${THROUGHPUT_ARGS:---steps $((STEPS + 10)) --warmup 5}"
  # shellcheck disable=SC2086
  run "train tokens/s, fp32 / fp16 / bf16, minipar vs PyTorch autocast" \
      train_throughput.txt "${T_THROUGHPUT:-540}" python benchmarks/train_throughput.py \
      --timeout "${T_RUN:-150}" --json "$OUT_DIR/train_throughput.json" $args
}

python -c "import minipar" 2>/dev/null || pip install --no-deps -e . >"$OUT_DIR/pip.txt" 2>&1
python -c "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0" \
    || { echo "gpu_checks: CuPy with a visible GPU is required" | tee "$OUT_DIR/error.txt"; exit 2; }
{ nvidia-smi || true; python -c "import cupy; print('cupy', cupy.__version__)";
  python -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "torch: not installed"; } \
    >"$OUT_DIR/environment.txt" 2>&1

SECTIONS="${SECTIONS:-targets}"
SECTIONS="${SECTIONS//targets/attention throughput}"     # the measurements with targets
SECTIONS="${SECTIONS//all/tests attention fused step throughput}"
for section in $SECTIONS; do
  if declare -F "section_$section" >/dev/null; then
    "section_$section"
  else
    echo "gpu_checks: no section '$section' (tests, attention, fused, step, throughput, targets, all)"
    status=2
  fi
done

echo "gpu_checks: exit status $status; outputs in $OUT_DIR"
exit $status
