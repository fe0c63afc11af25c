"""The per-rank agent: ``mpiexec -n N python -m minipar.elastic.agent TRAIN-ARGS``.

Why an agent at all: when one rank of an MPI job dies, the launcher (MPICH's hydra)
kills every other rank at once with SIGKILL and prints *a* process id — not always the
one that died first.  So who failed cannot be read off the launcher.  Each rank is
therefore started by a small agent that does nothing but watch it:

    hydra --> agent (this file, no MPI) --> child: python -m minipar.elastic.rank ...

The child inherits the agent's environment and open file descriptors, so MPI's process
manager interface (``PMI_FD``, ``PMI_RANK``) reaches it as if hydra had started it.
In ``$MINIPAR_HEARTBEAT_DIR`` the agent writes

    pid<R>     "<child pid> <agent pid>"       the rank's processes (tests signal the child)
    exit<R>    "<status> <unix time>"          how the child ended: its exit code, or
                                               -N when signal N killed it

and then exits with the child's status (128+N for a signal).  The failed rank is the
one whose agent recorded an abnormal end: the others are killed by hydra together
with their agents (same process group), so they record nothing.  The child also asks
the kernel to kill it if its agent dies (``PR_SET_PDEATHSIG``), so no rank can outlive
its agent.  torchrun's elastic agent is one per node and also restarts the workers;
here one supervisor (``supervisor.py``) does that for all ranks.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _die_with_parent():
    """In the child, before exec: SIGKILL me when my parent (the agent) dies (Linux)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def rank_from_environment():
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    directory = os.environ["MINIPAR_HEARTBEAT_DIR"]
    rank = rank_from_environment()
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # Ctrl-C is for the child (a save)
    child = subprocess.Popen([sys.executable, "-m", "minipar.elastic.rank", *argv],
                             close_fds=False, preexec_fn=_die_with_parent)
    signal.signal(signal.SIGTERM, lambda s, f: (child.kill(), os._exit(128 + s)))  # no record
    _write(os.path.join(directory, f"pid{rank}"), f"{child.pid} {os.getpid()}\n")
    status = child.wait()
    _write(os.path.join(directory, f"exit{rank}"), f"{status} {time.time():.6f}\n")
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
