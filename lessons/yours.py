"""Running the learner's code under mpiexec (the lessons' NN_yours.py scripts).

An exercise that needs several ranks cannot run inside the notebook's one process.  Its
cell starts with ``%%writefile {MINE}/name.py``: running the cell writes the learner's code
to a file (``MINE`` is the course folder, ``lessons/mine/`` or ``$MINIPAR_MINE``, kept across
lessons: the capstone, lesson 12, composes the files earlier lessons wrote); the next
cell starts the lesson's check, ``NN_yours.py --file`` that file, under ``mpiexec``.
On every rank the script imports the file (``load``) and runs the lesson's check on it
(``check_on_every_rank``): the learner's version and the library's side by side, on the
same data.  A failed check prints one line that names the rank and what differs (which
bucket, which layer, which micro-batch, which byte count) and ends the job on every rank,
so a wrong exercise never leaves the other ranks waiting.  Lesson 15's exercise is the
supervisor that starts mpiexec runs, so its check runs in one process (``check_here``).
Every mpiexec the lessons start is ``find_mpiexec()``'s.
"""
import argparse
import importlib.util
import os
import sys
import time
import traceback


def find_mpiexec():
    """The mpiexec that goes with this Python: the one beside ``sys.executable`` (a virtual
    environment's ``bin/``, where the ``mpich`` wheel installs it), else the first on PATH.
    A Jupyter kernel started from another environment has no venv ``bin/`` on its PATH, and
    an mpiexec of another MPI would start N separate one-rank jobs instead of one N-rank job."""
    from minipar.process import mpiexec_path
    found = mpiexec_path()
    if found is None:
        raise FileNotFoundError(f"no mpiexec beside {sys.executable} nor on PATH: install the package's "
                                f"dependencies there (pip install -e .), whose mpich wheel brings one")
    return found


def load(path, name):
    """``name`` from the Python file at ``path`` (the cell the learner wrote); its folder
    goes on ``sys.path`` first, so the learner's other cells written there import."""
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("mine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise SystemExit(f"{path} defines no {name!r}: keep the name the exercise gives")
    return getattr(module, name)


def main(doc, check, name, *options):
    """The command line of every ``NN_yours.py``: ``--file`` (the learner's code, which must
    define ``name``), ``--backend``, and ``options`` (``(flag, help)`` pairs, e.g.
    ``("--data", "the tokenized dataset")``; a help ending in "(optional)" makes the flag
    optional).  Sets the backend, then runs ``check(comm, learner's name, *option values)``
    on every rank."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--file", required=True, help=f"the learner's {name}")
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    for flag, text in options:
        parser.add_argument(flag, required=not text.endswith("(optional)"), help=text)
    args = parser.parse_args()
    from minipar import backend
    from minipar.comm import Communicator
    backend.set_backend(args.backend)
    comm = Communicator(hang_timeout=20)
    values = [getattr(args, flag.lstrip("-").replace("-", "_")) for flag, _ in options]
    check_on_every_rank(comm, check, load(args.file, name), *values)


def check_on_every_rank(comm, check, *args):
    """``check(comm, *args)``; on any error print ``rank r: what went wrong`` and abort
    every rank (the others may be blocked in a message to this one)."""
    _run(lambda: check(comm, *args), f"rank {comm.rank}: ", lambda: _abort(comm))


def _abort(comm):
    """End every rank.  First a moment for mpiexec to forward the line just written: an
    abort can kill the forwarding before it reads the pipe (about 1 run in 50 lost it)."""
    time.sleep(0.2)
    comm.mpi.Abort(1)


def check_here(check, *args):
    """``check(*args)`` in this one process (lesson 15's supervisor, which starts the
    mpiexec runs itself); on any error print what went wrong and exit with status 1."""
    _run(lambda: check(*args), "", lambda: sys.exit(1))


def _run(check, prefix, stop):
    try:
        check()
    except AssertionError as err:
        _say(f"{prefix}{err}")
        stop()
    except Exception:                       # the learner's code raised: show where
        _say(f"{prefix}your code raised\n{traceback.format_exc(limit=-3)}")
        stop()


def _say(text):
    """One write per message: mpiexec merges the ranks' streams, and a separate write of
    the newline would let another rank's line in before it."""
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def tanh_stack(weights, x, target):
    """The oracle of lessons 06 and 08: layers h = tanh(h·W) on the whole batch in one
    process, loss ½·Σ(h - target)²/rows; returns (loss, [dL/dW_i])."""
    import numpy as np
    hs = [x]
    for W in weights:
        hs.append(np.tanh(hs[-1] @ W))
    loss = 0.5 * np.sum((hs[-1] - target) ** 2) / len(x)
    dy, grads = (hs[-1] - target) / len(x), [None] * len(weights)
    for i in reversed(range(len(weights))):
        dz = dy * (1 - hs[i + 1] ** 2)
        grads[i], dy = hs[i].T @ dz, dz @ weights[i].T
    return loss, grads
