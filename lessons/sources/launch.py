"""The code cell the lessons share: launching mpiexec runs from a notebook.

No thread variables: minipar gives each rank (cores // ranks on the node) BLAS threads
itself, as it does for the README's commands.  Collectives run in check mode
(MINIPAR_COMM_CHECK=1): a misused collective fails on every rank with one message
instead of hanging the notebook (about 50 µs per call; ``bench comm --check-overhead``).
``MINE`` is the folder the multi-rank exercises write the learner's code to (``yours.py``)."""

LAUNCH = r'''
import tempfile
ROOT = os.path.abspath("..")
ENV = dict(os.environ, MINIPAR_COMM_CHECK="1",
           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
BACKEND = os.environ.get("MINIPAR_BACKEND", "numpy")   # "cupy" on GPU nodes
MINE = tempfile.mkdtemp(prefix="minipar_yours_")     # %%writefile {MINE}/...: exercises run by mpiexec

def mpirun(n, args, timeout=300):
    """mpiexec -n N python ARGS..., from lessons/; fails loudly with the ranks' output."""
    cmd = ["mpiexec", "-n", str(n), sys.executable, *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"$ mpiexec -n {n} python {' '.join(map(str, args))}   ({time.perf_counter() - t0:.1f} s)")
    return proc
'''
