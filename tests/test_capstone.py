"""Lesson 12's capstone check (``lessons/12_yours.py``) fails the way a learner needs.

The solution passing is tests/test_lessons.py's (lesson 12's notebook runs it on 8 ranks
with every earlier lesson's solved files in its course folder).  Here, what a wrong
composition is told: a piece of an earlier lesson missing, named in one line before any
message; the blank, run in a course folder that holds the earlier pieces; and the
solution with one of the 3D gradient rules taken out, each named by the rule it lacks.
"""
import os
import re
import subprocess
import sys

import pytest

from tests.mpirun import REPO, run_mpi

nbformat = pytest.importorskip("nbformat")
from tests.test_lessons import course_folder, solutions  # noqa: E402  (after the skip: it needs nbformat)

NOTEBOOK, EXERCISE, SCRIPT = "12_3d_parallel.ipynb", "capstone_step", os.path.join("lessons", "12_yours.py")


def _cell_body(code):
    first, _, body = code.lstrip("\n").partition("\n")
    assert first == "%%writefile {MINE}/step3d.py", f"{NOTEBOOK}: {EXERCISE} is not written to step3d.py"
    return body


def _blank():
    nb = nbformat.read(os.path.join(REPO, "lessons", NOTEBOOK), as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("exercise") == EXERCISE]
    return _cell_body(cell.source)


def _solution_without(rule, instead):
    """The solution with the text ``rule`` replaced by ``instead``."""
    code = _cell_body(solutions(NOTEBOOK)[EXERCISE])
    assert rule in code, f"the solution no longer holds {rule!r}: update this test's mutations"
    return code.replace(rule, instead)


def _run(folder, code, *layout, ranks=8):
    (folder / "step3d.py").write_text(code)
    out = run_mpi(ranks, [SCRIPT, "--file", folder / "step3d.py", *layout], timeout=300, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0, f"the wrong composition passed:\n{text[-3000:]}"
    assert "Traceback" not in text, f"the check crashed instead of failing:\n{text[-3000:]}"
    return text


def test_a_missing_piece_is_named_in_one_line_before_any_message(tmp_path):
    """A course folder without lesson 05's ddp.py: one line naming the file and the cell
    that writes it (the check starts no communicator: one process shows it)."""
    (tmp_path / "step3d.py").write_text(_blank())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, SCRIPT, "--file", str(tmp_path / "step3d.py")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr == f"no ddp.py in {tmp_path}: run lesson 05's exercise cell (my_ddp) first\n", out.stderr


@pytest.mark.slow
def test_the_blank_in_a_full_course_folder_names_the_pipeline(tmp_path):
    """Every earlier piece present, the step as the learner finds it: nothing ran."""
    text = _run(course_folder(tmp_path), _blank(), "--layout", "dp2-tp2-pp2")
    assert re.search(r"rank \d: dp2-tp2-pp2, step 0: stage [01] ran 0 of 4 forwards and 0 of 4 backwards: "
                     r"the micro-batches go through your 1F1B executor", text), text[-3000:]


RULES = [   # (what the solution loses, in its place, the layout, the diagnostic)
    pytest.param("grid.dp_cp_comm", "grid.dp_comm", "cp2-tp2-pp2",
                 r"rank \d: cp2-tp2-pp2, step 0, \S+ \(.*\): your gradient is not one process's: it is this "
                 r"rank's share only \(its rows and positions\): rule 1, the mean over the dp x cp = 2 ranks",
                 id="mean over dp x cp"),
    pytest.param("if sequence_parallel and grid.tp > 1:", "if False:", "cp2-tp2-pp2",
                 r"rank \d: cp2-tp2-pp2, step 0, \S+ \(replicated over tp, sequence-parallel\): your gradient "
                 r"is not one process's: it is this tp rank's positions' part only: .* \(rule 2: the sum over "
                 r"the tp ranks\)",
                 id="sum over tp"),
    pytest.param("1.0 / grid.tp if h.replicated_over_tp else 1.0", "1.0", "dp2-tp2-pp2",
                 r"rank \d: dp2-tp2-pp2, step 0: your norm [\d.]+, one process's [\d.]+: rule 3: a weight "
                 r"replicated over tp counted tp times, not once",
                 id="count once"),
    pytest.param("xp.array([squares / copies, bad])", "xp.array([squares / copies, 0.0])", "dp2-tp2-pp2",
                 r"rank \d: rank 5's gradient holds an inf, and your norm_and_overflow says no overflow here: "
                 r"every rank must skip the step \(rule 4\)",
                 id="found-inf in the all-reduce"),
]


@pytest.mark.slow
@pytest.mark.parametrize("rule,instead,layout,diagnostic", RULES)
def test_a_composition_without_a_rule_is_told_which(rule, instead, layout, diagnostic, tmp_path):
    text = _run(course_folder(tmp_path), _solution_without(rule, instead), "--layout", layout)
    assert re.search(diagnostic, text), text[-3000:]
