"""Thread budgeting: each rank gets its share of the node's cores for BLAS.

NumPy's BLAS (OpenBLAS, MKL) starts one thread per core it can see.  Launch two
ranks on a 2-core machine and four BLAS threads fight over two cores: every
matmul waits for a thread the scheduler has parked, and a step takes twice as
long as with one thread per rank.  ``torchrun`` therefore sets ``OMP_NUM_THREADS``
for the ranks it starts; minipar does the same for itself, on every rank:

    threads = max(1, cores this rank may use // ranks on this node)

With one thread each (ranks fill the cores), that thread is the BLAS's.  With more
(one process on a many-core machine), minipar runs its own pool of that many threads:
each matmul and each elementwise op is cut into blocks of rows, one per thread, and
the BLAS runs one thread inside each (``autograd/rows.py``, ``ThreadBudget.blas``).

* cores: the CPUs in this process's affinity mask (``os.sched_getaffinity``),
  capped by a container's CPU quota (cgroup ``cpu.max``) when one is set;
* ranks on this node: from the launcher's environment (MPICH/Intel MPI hydra's
  ``MPI_LOCALNRANKS``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``, Slurm's
  ``SLURM_STEP_TASKS_PER_NODE``, ...), or - later, once MPI is up - from MPI itself:
  the ranks running on this machine's kernel (its boot id, ``host_id``).  Not MPI's
  shared-memory split: that stops at a network namespace, and the simulated cluster's
  nodes are namespaces of one machine whose cores all their ranks share.

A user who sets ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS``
has chosen: minipar then sets nothing.

The limit should reach the BLAS before it starts its thread pool, so
``minipar.setup_process()`` (``process/__init__.py``), which the commands call first, runs
:func:`budget_threads` and writes the variables into ``os.environ`` before NumPy is
imported.  When NumPy is already loaded (a script that imported it first, or the MPI
refinement) the limit is applied to the running pools with
``threadpoolctl.threadpool_limits``, the library made for exactly this.  A process that
never called it is budgeted by :func:`current_budget` where minipar first needs the
budget (a matmul or an op split by rows).

Children started by a budgeted process inherit the variables; the value minipar
wrote is recorded in ``MINIPAR_BLAS_THREADS`` so that a child (say, each rank of an
``mpiexec`` started from a notebook) knows them for minipar's and budgets afresh.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

USER_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
SET_VARS = USER_VARS + ("VECLIB_MAXIMUM_THREADS",)   # + macOS Accelerate
MARKER = "MINIPAR_BLAS_THREADS"
SPLIT_SOURCE = "MPI: the ranks on this machine"
# launcher variables that say how many ranks share this node, most specific first
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS",              # MPICH / Intel MPI (hydra)
                   "OMPI_COMM_WORLD_LOCAL_SIZE",   # Open MPI
                   "MV2_COMM_WORLD_LOCAL_SIZE",    # MVAPICH
                   "LOCAL_WORLD_SIZE")             # torchrun-style launchers


@dataclass(frozen=True)
class ThreadBudget:
    """What was decided: ``threads`` threads for each of ``ranks_on_node`` ranks
    sharing ``cores`` CPUs; ``source`` says where ``ranks_on_node`` came from, and
    ``user_setting`` (e.g. ``"OMP_NUM_THREADS=2"``) is set when the user chose."""
    ranks_on_node: int
    cores: int
    threads: int
    source: str
    user_setting: str | None = None

    @property
    def blas(self) -> int:
        """BLAS threads.  With several threads to itself and no setting of the user's,
        a rank divides its matmuls and elementwise ops over its own pool of ``threads``
        threads (``autograd/rows.py``: one block of rows each) and each pool thread
        calls a one-thread BLAS.  Measured here, 2 threads: an attention matmul
        (32 × 256×64×256) 2.0 ms split against 4.9 ms in a 2-thread OpenBLAS, dX = dY·Wᵀ
        5.9 against 8.5 ms; and the pool and the BLAS never fight for the cores."""
        return self.threads if self.user_setting else 1

    @property
    def splits_matmuls(self) -> bool:
        return self.threads > 1 and self.blas == 1


_current: ThreadBudget | None = None
_limiter = None   # the threadpoolctl object holding a limit on already-started pools


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):          # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, quota) if quota else cores)


def _cgroup_cpu_quota() -> int | None:
    """A container's CPU limit (``docker --cpus``) in whole CPUs, or None."""
    for path, parse in (("/sys/fs/cgroup/cpu.max", lambda t: t.split()),            # v2
                        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None)):              # v1
        try:
            with open(path) as f:
                text = f.read()
            if parse is not None:
                quota, period = parse(text)
            else:
                with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                    quota, period = text.strip(), f.read().strip()
            if quota in ("max", "-1"):
                return None
            return max(1, int(int(quota) / int(period) + 0.5))
        except (OSError, ValueError):
            continue
    return None


def _slurm_tasks_here(environ) -> int | None:
    """Tasks of this srun step on this node: ``SLURM_STEP_TASKS_PER_NODE`` is a
    compressed list like ``"4(x2),3"`` (nodes 0-1 run 4, node 2 runs 3)."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_NTASKS_PER_NODE")
    if not spec or "SLURM_LOCALID" not in environ:   # an salloc shell is not a task
        return None
    counts = []
    for part in spec.split(","):
        value, _, times = part.partition("(x")
        counts += [int(value)] * (int(times.rstrip(")")) if times else 1)
    node = int(environ.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else counts[0]


def ranks_on_node_from_launcher(environ=None) -> tuple[int, str] | None:
    """``(ranks on this node, variable that said so)`` from the launcher, or None."""
    environ = os.environ if environ is None else environ
    for name in LOCAL_SIZE_VARS:
        if environ.get(name, "").strip().isdigit():
            return int(environ[name]), name
    try:
        slurm = _slurm_tasks_here(environ)
    except ValueError:
        slurm = None
    return (slurm, "SLURM_STEP_TASKS_PER_NODE") if slurm else None


def user_setting(environ=None) -> str | None:
    """The first thread variable the user set (not one minipar wrote), as ``NAME=VALUE``."""
    environ = os.environ if environ is None else environ
    ours = environ.get(MARKER)
    for name in USER_VARS:
        value = environ.get(name, "").strip()
        if value and value != ours:
            return f"{name}={value}"
    return None


def budget_threads(comm=None) -> ThreadBudget:
    """Decide and apply this rank's BLAS threads; returns the :class:`ThreadBudget`.

    Without ``comm`` the ranks on this node come from the launcher's environment
    (cheap, no MPI: what ``setup_process()`` runs before MPI is up).  With ``comm`` (an mpi4py
    communicator or minipar's ``Communicator``) it is COLLECTIVE: the ranks on this
    machine are counted (``_same_machine``), and a
    launcher that bound each rank to its own cores is recognised (cores = this rank's
    mask, not the union of all of them divided).  Calling it again is cheap; a new
    answer is applied to the running thread pools; once MPI has answered, a call
    without ``comm`` keeps MPI's answer (it knows better than the launcher).
    """
    global _current
    if comm is None and _current is not None and _current.source == SPLIT_SOURCE:
        return _current
    cores = usable_cores()
    if comm is not None:
        ranks, cores, threads = _shared_memory_split(getattr(comm, "mpi", comm), cores)
        source = SPLIT_SOURCE
    else:
        found = ranks_on_node_from_launcher()
        ranks, source = found if found else (1, "no launcher: one process")
        threads = max(1, cores // ranks)
    chosen = user_setting()
    if chosen:
        value = chosen.split("=", 1)[1]
        threads = int(value) if value.isdigit() else 0
    budget = ThreadBudget(ranks, cores, threads, source, chosen)
    if budget != _current:
        if not chosen:
            _apply(budget.blas)
        _current = budget
    return budget


def host_id():
    """What tells machines apart, and not a machine's network namespaces: the running
    kernel's boot id (the simulated cluster's nodes are namespaces of one kernel)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return os.uname().nodename


def _same_machine(mpi_comm):
    """The ranks of ``mpi_comm`` running on this machine (one kernel), as a communicator;
    every rank must call.  MPI's shared-memory split stops at a network namespace, so on
    the simulated cluster it would show each node's ranks the whole machine's cores."""
    hosts = mpi_comm.allgather(host_id())          # once, at set-up: a few bytes each
    color = sorted(set(hosts)).index(hosts[mpi_comm.Get_rank()])
    return mpi_comm.Split(color, mpi_comm.Get_rank())


def _shared_memory_split(mpi_comm, cores):
    """(ranks on this machine, cores they share, threads for this rank) from MPI; every
    rank of ``mpi_comm`` must call.  Ranks whose affinity masks overlap share the union
    of them; if the masks are disjoint the launcher has bound each rank to its own
    cores, and each may use all of its own."""
    node = _same_machine(mpi_comm)
    try:
        try:
            mine = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            mine = set(range(os.cpu_count() or 1))
        masks = node.allgather(sorted(mine))
        union = set().union(*map(set, masks))
        if sum(map(len, masks)) == len(union):              # bound: disjoint masks
            return node.size, len(union), max(1, min(cores, len(mine)))
        quota = _cgroup_cpu_quota()                       # a container's limit is shared
        on_node = min(len(union), quota) if quota else len(union)
        return node.size, on_node, max(1, on_node // node.size)
    finally:
        node.Free()


def _apply(threads: int) -> None:
    """Write the variables for pools not started yet, and limit the started ones."""
    global _limiter
    for name in SET_VARS:
        os.environ[name] = str(threads)
    os.environ[MARKER] = str(threads)
    if "numpy" in sys.modules:      # its BLAS is loaded: its pool already has a size
        from threadpoolctl import threadpool_limits
        _limiter = threadpool_limits(limits=threads)


def use_threads(threads: int) -> ThreadBudget:
    """Set this process's threads by hand (a benchmark comparing 1 and 2 threads, a
    test): BLAS pools and minipar's own row threads (``autograd/rows.py``) both follow.
    Like minipar's own choice, not like ``OMP_NUM_THREADS``: several threads mean
    minipar's pool over a one-thread BLAS (``ThreadBudget.blas``)."""
    global _current
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    previous = current_budget()
    _current = ThreadBudget(previous.ranks_on_node, previous.cores, threads, "use_threads")
    _apply(_current.blas)
    return _current


def current_budget() -> ThreadBudget:
    """The budget in force (deciding it now if nothing has yet)."""
    return _current if _current is not None else budget_threads()


def describe_threads(budget: ThreadBudget | None = None) -> str:
    """One line for the run header, e.g. ``2 ranks on this machine, 1 BLAS thread
    each (2 cores)`` or ``OMP_NUM_THREADS=2 set by you: kept (2 ranks, 2 cores)``."""
    b = budget or current_budget()
    ranks = f"{b.ranks_on_node} rank{'s' if b.ranks_on_node != 1 else ''}"
    if b.user_setting:
        return f"{b.user_setting} set by you: kept ({ranks} on this machine, {b.cores} cores)"
    each = " each" if b.ranks_on_node != 1 else ""
    if b.splits_matmuls:
        return (f"{ranks} on this machine, {b.threads} threads{each} "
                f"(minipar's pool over a 1-thread BLAS; {b.cores} cores)")
    threads = f"{b.threads} BLAS thread{'s' if b.threads != 1 else ''}"
    return f"{ranks} on this machine, {threads}{each} ({b.cores} cores)"
