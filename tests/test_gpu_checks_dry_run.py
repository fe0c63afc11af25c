"""``benchmarks/gpu_checks.sh``'s throughput section, dry-run on the CPU with the fake CuPy
(its attention section, at full sizes, would take the CPU emulator many minutes).

The section a lent GPU runs — ``benchmarks/train_throughput.py`` launching ``minipar train
--backend cupy`` in fp32, fp16 and bf16, reading tokens/s from each run's log, printing the
ratios and writing its JSON — runs here through the shell script itself, on a tiny shape,
minipar's side only (PyTorch needs CUDA).  ``MINIPAR_CUDA_KERNELS=0``: the fused kernels'
array code runs instead (on the fake each launch is a CPU-emulator process, seconds; the
kernels are checked by ``test_fused_emulated.py`` and ``test_gpu_step_counts.py``).

What a pass proves: the script's plumbing and every Python line of the minipar side run
under the CuPy rules the fake models, for all three precisions.  Not the speed.
"""
import json
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_CUPY = os.path.join(REPO, "tests", "fake_cupy")
TINY = ("--frameworks minipar --layers 1 --d-model 16 --heads 2 --seq 16 --batch 2 "
        "--steps 2 --warmup 1 --attention naive --timeout 240")


@pytest.mark.skipif(shutil.which("bash") is None, reason="the script is bash")
def test_throughput_section_runs_on_the_fake_cupy(tmp_path):
    pytest.importorskip("ml_dtypes")   # bf16 on the (fake) CuPy
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_CUPY, REPO]), OMP_NUM_THREADS="1",
               OUT=str(tmp_path), SECTIONS="throughput", THROUGHPUT_ARGS=TINY,
               MINIPAR_CUDA_KERNELS="0")
    out = subprocess.run(["bash", "benchmarks/gpu_checks.sh"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rates = json.loads((tmp_path / "train_throughput.json").read_text())
    assert sorted(rates["minipar"]) == ["bf16", "fp16", "fp32"]
    assert all(r > 0 for r in rates["minipar"].values()), rates
    printed = (tmp_path / "train_throughput.txt").read_text()
    for precision in ("fp16", "bf16"):
        assert f"minipar  {precision} / fp32" in printed, printed


def test_an_unknown_section_is_refused(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_CUPY, REPO]), OUT=str(tmp_path),
               SECTIONS="nonesuch")
    out = subprocess.run(["bash", "benchmarks/gpu_checks.sh"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no section 'nonesuch'" in out.stdout, out.stdout + out.stderr
