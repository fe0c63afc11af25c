"""Every lesson notebook executes top to bottom, and none is committed with outputs.

The notebooks are found by glob, so a new ``lessons/NN_topic.ipynb`` is tested without
touching this file.  Each runs in a fresh kernel whose working directory is ``lessons/``
(where a lesson's mpiexec script lives), with the Agg matplotlib backend and one BLAS
thread, and with the solutions of ``lessons/solutions/NN_topic.py`` put into its
exercise cells (see ``lessons/make_notebooks.py``).  The course folder (``MINE``, where
the multi-rank exercises write their files) is a temporary one holding every lesson's
solved files, as a learner's holds them after the earlier lessons: lesson 12's capstone
composes them.  A blank exercise must fail its check with the hint; the notebooks must
be what their sources build.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = os.path.join(ROOT, "lessons")
NOTEBOOKS = sorted(glob.glob(os.path.join(LESSONS, "*.ipynb")))
NAMES = [os.path.basename(p) for p in NOTEBOOKS]
# The heaviest notebooks (8 to 24 s each on 2 cores) execute in the slow run only: what
# they drive in the library runs by default in the test files named here; their structure
# (no outputs, exercises, built from their sources) is checked by default like every lesson's.
SLOW_NOTEBOOKS = {   # the heaviest (10-35 s each); every other notebook executes by default
    "10_recompute.ipynb": "test_recompute.py, test_train_numerics.py (recompute is bit-identical)",
    "13_performance.ipynb": "test_perf_plan.py, test_perf_memory.py (a 175B plan: ~25 s of ~35)",
    "15_elastic.ipynb": "test_elastic.py, test_balance.py",
    "16_context_parallel.ipynb": "test_context_parallel.py, test_ulysses.py (ring, zig-zag, Ulysses, the hybrid)",
    "20_cluster.ipynb": "test_cluster.py, test_comm_two_level.py (the simulated cluster, the hierarchical all-reduce)",
    "21_experts.ipynb": "test_expert_parallel.py, test_moe.py, test_lesson_experts.py (two training runs, two 4-rank launches)",
}  # and lessons 15, 16, 20 and 21's multi-rank exercises, blank and solved: test_lesson_yours.py
_spec = importlib.util.spec_from_file_location("lessons_solved", os.path.join(LESSONS, "solved.py"))
solved = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(solved)
solutions, course_folder = solved.solutions, solved.course_folder   # {exercise: code}; MINE after every lesson
EXECUTIONS = [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_NOTEBOOKS else []) for name in NAMES]


def _kernel_env():
    """Environment for the kernel: Agg plots, one BLAS thread, and minipar importable
    even when the package is not installed (PYTHONPATH = repo root)."""
    env = {"MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    probe = subprocess.run([sys.executable, "-c", "import minipar"], cwd=LESSONS,
                           capture_output=True, env={**os.environ, **env})
    if probe.returncode != 0:
        path = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = ROOT + (os.pathsep + path if path else "")
    return env


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    env = {**_kernel_env(), "MINIPAR_MINE": str(course_folder(tmp_path_factory.mktemp("mine")))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)          # the kernel subprocess inherits os.environ
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_lessons_exist():
    assert NOTEBOOKS, f"no notebooks found in {LESSONS}"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_has_no_outputs(name):
    nb = nbformat.read(os.path.join(LESSONS, name), as_version=4)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{name}: code cells {dirty} carry outputs or execution counts; "
                       "clear them before committing (jupyter nbconvert --clear-output --inplace)")


def exercise_cells(nb):
    return [c for c in nb.cells if "exercise" in c.get("metadata", {}).get("tags", [])]


def _run(nb):
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": LESSONS}})
    client.execute()


@pytest.mark.parametrize("name", EXECUTIONS)
def test_notebook_executes(name, kernel_env):
    """With the solutions in its exercise cells, every cell runs and every check passes."""
    nb = nbformat.read(os.path.join(LESSONS, name), as_version=4)
    answers = solutions(name)
    for cell in exercise_cells(nb):
        key = cell.metadata.get("exercise")
        assert key in answers, f"{name}: exercise {key!r} has no solution in lessons/solutions/"
        cell.source = answers[key]
    _run(nb)


@pytest.mark.parametrize("name", NAMES)
def test_every_lesson_has_exercises(name):
    """The learner writes at least two mechanisms in every lesson."""
    cells = exercise_cells(nbformat.read(os.path.join(LESSONS, name), as_version=4))
    assert len(cells) >= 2, f"{name}: {len(cells)} exercise cells (tag 'exercise'); want >= 2"


def test_a_blank_exercise_fails_with_its_hint(kernel_env):
    """The first lesson with exercises, run as a learner finds it: the first exercise's
    check fails, and the error carries the hint."""
    for name in NAMES:
        nb = nbformat.read(os.path.join(LESSONS, name), as_version=4)
        cells = exercise_cells(nb)
        if cells:
            break
    else:
        pytest.skip("no lesson has exercises")
    first = nb.cells.index(cells[0])
    nb.cells = nb.cells[:first + 2]            # up to the exercise's check cell
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="(?i)hint"):
        _run(nb)


def test_notebooks_are_built_from_their_sources():
    """One authoring style: each source builds its committed notebook byte for byte."""
    sys.path.insert(0, LESSONS)
    import make_notebooks
    for notebook, built in make_notebooks.lessons():
        with open(os.path.join(LESSONS, notebook)) as f:
            assert f.read() == nbformat.writes(built) + "\n", f"{notebook}: run lessons/make_notebooks.py"


def test_every_mpiexec_run_goes_through_the_launch_helper():
    """A command that starts with the bare name "mpiexec" runs whatever PATH finds: in a
    Jupyter kernel from another environment, no mpiexec or another MPI's.  The lessons
    launch through mpirun() (lessons/sources/launch.py) or yours.find_mpiexec()."""
    by_name = re.compile(r"""\[\s*["']mpiexec["']""")
    files = sorted(glob.glob(os.path.join(LESSONS, "sources", "*.py")) + glob.glob(os.path.join(LESSONS, "*.py")))
    assert len(files) > 20, f"no lesson sources found in {LESSONS}"
    found = []
    for path in files:
        text = open(path, encoding="utf-8").read()
        found += [f"{os.path.relpath(path, ROOT)} line {text.count(chr(10), 0, m.start()) + 1}"
                  for m in by_name.finditer(text)]
    assert not found, f"mpiexec started by name, not through the launch helper: {found}"
