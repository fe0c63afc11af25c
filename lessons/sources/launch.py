"""The code cell the lessons share: launching mpiexec runs from a notebook.

No thread variables: minipar gives each rank (cores // ranks on the node) BLAS threads
itself, as it does for the README's commands.  Collectives run in check mode
(MINIPAR_COMM_CHECK=1): a misused collective fails on every rank with one message
instead of hanging the notebook (about 50 µs per call; ``bench comm --check-overhead``).
``MINE`` is the course folder the multi-rank exercises write the learner's code to
(``yours.py``): ``lessons/mine/`` (git-ignored), or the folder ``MINIPAR_MINE`` names (the
tests point it at a temporary one).  It outlives the notebook, so that a later lesson finds
the pieces written in earlier ones: lesson 12's capstone composes lessons 05, 07, 08 and 16's.

``MPIEXEC`` is the one that goes with the kernel's Python (``yours.find_mpiexec``): a
Jupyter kernel started from another environment does not have the virtual environment's
``bin/`` on its PATH.  Its folder leads the children's PATH, so that the runs minipar
starts itself (``minipar launch``, ``minipar cluster``) find the same one."""

LAUNCH = r'''
import tempfile
import time
from yours import find_mpiexec   # lessons/yours.py

ROOT = os.path.abspath("..")
MPIEXEC = find_mpiexec()                              # beside sys.executable, else on PATH
ENV = dict(os.environ, MINIPAR_COMM_CHECK="1",
           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           PATH=os.path.dirname(MPIEXEC) + os.pathsep + os.environ.get("PATH", ""))
BACKEND = os.environ.get("MINIPAR_BACKEND", "numpy")   # "cupy" on GPU nodes
MINE = os.environ.get("MINIPAR_MINE") or os.path.join(ROOT, "lessons", "mine")   # %%writefile {MINE}/...
os.makedirs(MINE, exist_ok=True)                      # your code, kept for the later lessons

def mpirun(n, args, timeout=300, env=None, check=True):
    """mpiexec -n N python ARGS..., from lessons/, every rank on this kernel's Python; ``env``
    adds variables for this run.  Fails loudly with the ranks' output, unless check=False
    (a run that is meant to fail): then returns the finished process whatever its status."""
    cmd = [MPIEXEC, "-n", str(n), sys.executable, *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**ENV, **(env or {})})
    assert proc.returncode == 0 or not check, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    status = "" if check else f", exit status {proc.returncode}"
    print(f"$ mpiexec -n {n} python {' '.join(map(str, args))}   ({time.perf_counter() - t0:.1f} s{status})")
    return proc
'''
