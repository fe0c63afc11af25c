"""The multi-rank exercises (lessons 04-09, 12, 14-21; ``lessons/yours.py``): a blank
exercise, as the notebook hands it to the learner, fails under mpiexec with a diagnostic
that says what is wrong — which rank, step, bucket, layer, block or byte count — not
only that it is wrong.  (That the solutions pass is tests/test_lessons.py's: it runs
every notebook with them; for the notebooks it runs only in the slow run, the solutions'
multi-rank checks run here by default.)"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.mpirun import REPO, run_mpi

nbformat = pytest.importorskip("nbformat")
from tests.test_lessons import SLOW_NOTEBOOKS, solutions  # noqa: E402  (after the skip: it needs nbformat)

LESSONS = os.path.join(REPO, "lessons")

# notebook, exercise, script, ranks (0: the script starts the mpiexec runs itself), diagnostic
BLANKS = [
    ("05_data_parallel.ipynb", "my_ddp", "05_yours.py", 2,
     r"rank \d: step 0, bucket 0 \(lm_head\.weight.*S = 16384 bytes\): no all-reduce of it was started; "
     r"its last gradient arrived at gradient 1 of \d+, \d+ still to come"),
    ("06_zero.ipynb", "zero3_step", "06_yours.py", 4,
     r"rank \d: step 0: 0 all-gathers for 4 layers; ZeRO-3 gathers every layer twice"),
    ("07_tensor_parallel.ipynb", "megatron_f_g", "07_yours.py", 2,
     r"rank \d: f \(into the tensor-parallel region\), forward \(identity, no message\): your code raised "
     r"NotImplementedError: hint"),
    ("07_tensor_parallel.ipynb", "sequence_parallel", "07_yours.py", 2,
     r"rank \d: the all-gather before a column-parallel layer, forward \(every rank's 4 tokens along the "
     r"sequence, in rank order: an all-gather of S = 2048 bytes\): your code raised NotImplementedError: hint"),
    ("08_pipeline.ipynb", "stage_executor", "08_yours.py", 3,
     r"rank \d: ran nothing; this rank's 1F1B list is F0( [FB]\d){7}"),   # whichever rank stops first
    ("09_mixed_precision.ipynb", "amp_step", "09_yours.py", 2,
     r"rank \d: step 0: your code raised NotImplementedError \(hint: .*\); minipar's step: loss [\d.]+, "
     r"norm [\d.]+, stepped at scale 4096"),
    ("14_compression.ipynb", "my_diloco", "14_yours.py", 2, "your weights differ from the library's"),
    ("15_elastic.ipynb", "supervise", "15_yours.py", 0,
     r"1 attempt\(s\), exit statuses \[1\]: the injected failures end attempts 1 and 2"),
    ("16_context_parallel.ipynb", "ring_loop", "16_yours.py", 4,
     r"rank (\d): the output of query block \1 \(must see key blocks 0\.\.\1\) differs from one "
     r"process's causal attention by [\d.e+-]+; it covers no key block at all"),
    ("16_context_parallel.ipynb", "ulysses_swap", "16_yours.py", 4,
     r"rank \d: sequence_to_heads gave shape \(1, 8, 8, 16\), want \(1, 2, 32, 16\)"),
    ("18_tokens.ipynb", "tokenize_share", "18_yours.py", 2,
     r"rank \d: never opened \S+\.py \(file \d+\), one of its own files"),
    ("19_decoder.ipynb", "cp_attention", "19_yours.py", 2,
     r"rank \d: the token at true position \d+ \(row \d+ here\), query head \d \(reads KV head \d\): differs "
     r"from minipar's one-process llama attention by [\d.e+-]+"),
    ("20_cluster.ipynb", "hierarchical_all_reduce", "20_yours.py", 4,
     r"rank \d: n = 1000 float64 \(S = 8000 bytes\), nodes of q = 2 ranks: phase 1 \(reduce-scatter inside "
     r"node \d\), shard \d \(elements \d+\.\.\d+\): it is still this rank's own input, not the sum of node "
     r"\d's ranks \[\d, \d\]; sent 0 bytes off node \d, the hierarchical all-reduce sends S/q·2\(m-1\)/m = 4000"),
    ("21_experts.ipynb", "dispatch", "21_yours.py", 4,
     r"rank (\d): ep 4 \(this rank is ep rank \1 of ranks \[0, 1, 2, 3\], holding experts \d\.\.\d\): the output of "
     r"token 0, expert \d \(choice 1 of 2, w = [\d.]+, on ep rank \d\): its part is missing; and expert \d "
     r"\(choice 2 of 2, w = [\d.]+, on ep rank \d\): its part is missing"),
]


def blank(notebook, name, tmp_path):
    """The exercise cell as the learner finds it, written where its %%writefile would."""
    nb = nbformat.read(os.path.join(LESSONS, notebook), as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("exercise") == name]
    first, _, body = cell.source.partition("\n")
    assert first.startswith("%%writefile {MINE}/"), f"{notebook}: {name} is not a %%writefile exercise"
    path = tmp_path / first.rsplit("/", 1)[1]
    path.write_text(body)
    return str(path)


def _run_check(script, ranks, mine, *extra):
    """The lesson's check script on the learner's file: under mpiexec -n ranks, or (0) as
    a plain process that starts its mpiexec runs itself."""
    args = [os.path.join("lessons", script), "--file", str(mine), *map(str, extra)]
    if ranks:
        return run_mpi(ranks, args, timeout=180, check=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("notebook,name,script,ranks,diagnostic", BLANKS, ids=[b[1] for b in BLANKS])
def test_a_blank_fails_with_its_diagnostic(notebook, name, script, ranks, diagnostic, tmp_path):
    proc = _run_check(script, ranks, blank(notebook, name, tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the blank {name} passed its check:\n{out[-3000:]}"
    assert re.search(diagnostic, out), f"no diagnostic /{diagnostic}/ in:\n{out[-3000:]}"
    assert "Traceback" not in out, f"the blank {name} crashed instead of failing its check:\n{out[-3000:]}"


@pytest.fixture(scope="module")
def zero3_checkpoint(tmp_path_factory):
    """A real dp2 ZeRO-3 checkpoint for lesson 17's reshard read (blank and solution)."""
    ck = tmp_path_factory.mktemp("zero3") / "ck"
    run_mpi(2, ["-m", "minipar", "train", "--model", "tiny", "--n-layer", "1", "--steps", "1",
                "--data", "stdlib-bytes", "--zero", "3", "--quiet", "--eval-batches", "0",
                "--save", ck])
    return ck


def test_the_blank_reshard_read_names_the_tensor_and_box(tmp_path, zero3_checkpoint):
    """Lesson 17: the blank my_read (zeros) on a real dp2 ZeRO-3 checkpoint."""
    args = [os.path.join("lessons", "17_yours.py"), "--file", blank("17_memory.ipynb", "reshard", tmp_path),
            "--checkpoint", zero3_checkpoint]
    out = run_mpi(2, args, timeout=180, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text, text[-3000:]
    assert re.search(r"rank \d: \S+: the box at offsets \(.*\), lengths \(.*\) read from \d+ saved "
                     r"pieces differs from the library's read", text), text[-3000:]


# The exercises whose notebooks execute in the slow run only (tests/test_lessons.py's
# SLOW_NOTEBOOKS): their solutions pass their multi-rank checks in the default run too.
SOLUTIONS = [(n, name, script, ranks) for n, name, script, ranks, _ in BLANKS] + \
    [("17_memory.ipynb", "reshard", "17_yours.py", 2)]
SLOW_NOTEBOOK_SOLUTIONS = [s for s in SOLUTIONS if s[0] in SLOW_NOTEBOOKS]


@pytest.mark.parametrize("notebook,name,script,ranks", SLOW_NOTEBOOK_SOLUTIONS, ids=[s[1] for s in SLOW_NOTEBOOK_SOLUTIONS])
def test_the_solution_passes_its_check(notebook, name, script, ranks, tmp_path, request):
    first, _, body = solutions(notebook)[name].lstrip("\n").partition("\n")
    assert first.startswith("%%writefile {MINE}/"), f"{notebook}: the solution of {name} is not a %%writefile cell"
    path = tmp_path / first.rsplit("/", 1)[1]
    path.write_text(body)
    extra = ["--checkpoint", request.getfixturevalue("zero3_checkpoint")] if script == "17_yours.py" else []
    proc = _run_check(script, ranks, path, *extra)
    assert proc.returncode == 0, f"the solution of {name} failed its check:\n{(proc.stdout + proc.stderr)[-3000:]}"


def test_the_blank_recursive_doubling_names_the_step_partner_and_bytes(tmp_path):
    """Lesson 04 writes its exercises with save_exercise (not %%writefile): the blank cell,
    with the imports save_exercise adds, run by the lesson's own runner on 3 ranks."""
    nb = nbformat.read(os.path.join(LESSONS, "04_collectives.ipynb"), as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("exercise") == "recursive_doubling"]
    path = tmp_path / "recursive_doubling.py"
    path.write_text("import numpy as np\nfrom minipar.backend import xp\n\n" + cell.source)
    args = [os.path.join("lessons", "04_collectives.py"), "exercise", "--file", path,
            "--name", "recursive_doubling"]
    out = run_mpi(3, args, timeout=120, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text, text[-3000:]
    assert re.search(r"rank \d: AssertionError: n = 1001 float32 \(S = 4004 bytes\), p = 3 \(p' = 2\): "
                     r"(the fold-in|round 0 \(new rank \d XOR 1 = new rank \d\)): sent nothing; "
                     r"expected 4004 bytes to rank \d \(your function raised NotImplementedError: hint", text), \
        text[-3000:]


def _lesson_module(name):
    spec = importlib.util.spec_from_file_location("lesson_" + name, os.path.join(LESSONS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_find_mpiexec_takes_the_one_beside_the_python_first(tmp_path, monkeypatch):
    """A Jupyter kernel from another environment: PATH holds another mpiexec, or none; the
    runs must use the one installed beside the kernel's Python (with its mpi4py's MPI)."""
    find_mpiexec = _lesson_module("yours").find_mpiexec
    venv, elsewhere = tmp_path / "venv" / "bin", tmp_path / "elsewhere"
    for folder in (venv, elsewhere):
        folder.mkdir(parents=True)
        (folder / "mpiexec").write_text("#!/bin/sh\n")
        (folder / "mpiexec").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", str(elsewhere))
    assert find_mpiexec() == str(venv / "mpiexec")
    (venv / "mpiexec").unlink()
    assert find_mpiexec() == str(elsewhere / "mpiexec")          # none beside it: PATH's
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"no mpiexec beside .*venv/bin/python nor on PATH"):
        find_mpiexec()
