"""Every lesson notebook executes top to bottom, and none is committed with outputs.

The notebooks are found by glob, so a new ``lessons/NN_topic.ipynb`` is tested without
touching this file.  Each runs in a fresh kernel whose working directory is ``lessons/``
(where a lesson's mpiexec script lives), with the Agg matplotlib backend and one BLAS thread.
"""
import glob
import os
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = os.path.join(ROOT, "lessons")
NOTEBOOKS = sorted(glob.glob(os.path.join(LESSONS, "*.ipynb")))
NAMES = [os.path.basename(p) for p in NOTEBOOKS]


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
def kernel_env():
    env = _kernel_env()
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


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes(name, kernel_env):
    nb = nbformat.read(os.path.join(LESSONS, name), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": LESSONS}})
    client.execute()
