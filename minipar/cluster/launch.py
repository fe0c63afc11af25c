"""The mpiexec command that runs a job on the simulated cluster.

    mpiexec -hosts {prefix}-n0,{prefix}-n1 -n N -ppn K
            -bootstrap-exec WRAPPER      ssh's stand-in: runs each node's proxy in its namespace
            -iface {prefix}br            proxies call back to mpiexec on the bridge's address
            -genv UCX_TLS tcp,self       between nodes: TCP, so bytes cross the shaped veth
            CMD ...

Inside a node MPICH finds its ranks local (hydra's hosts decide that) and moves their bytes
through shared memory; between nodes its network module runs over UCX.  UCX would also
reach another namespace through /dev/shm (the namespaces share the file system), so its
transports are limited to TCP and the loop-back to self.

The same three settings go into the environment too (HYDRA_LAUNCHER_EXEC, HYDRA_IFACE,
UCX_TLS), so a program that starts mpiexec itself lands on the nodes as well:
``cluster run -- launch --np 4 -- train ...`` runs the elastic supervisor on this machine
(given the cluster's hosts file), and each of its attempts' mpiexec on the nodes.

Threads: every node's ranks share this machine's cores; each rank counts them all when it
budgets its threads (``process/threads.py``), unless the user set OMP_NUM_THREADS.
"""
from __future__ import annotations

import os
import sys

from minipar.cluster.link_profile import link_profile_path
from minipar.cluster.topology import ClusterError
from minipar.process import mpiexec_path
from minipar.process.threads import MARKER, SET_VARS, user_setting

MINIPAR_COMMANDS = {"train", "profile", "sample", "bench", "calibrate", "plan", "report"}
SUPERVISORS = {"launch"}            # start mpiexec themselves: run on this machine


def program(argv):
    """``train ...`` means minipar's train; ``x.py ...`` a script; anything else as it is."""
    if not argv:
        raise ClusterError("`cluster run` needs a command after --, e.g. `cluster run -- train --dp 4`")
    if argv[0] in MINIPAR_COMMANDS:
        return [sys.executable, "-m", "minipar", *argv]
    if argv[0].endswith(".py"):
        return [sys.executable, *argv]
    return list(argv)


def command(spec, argv, nprocs=None, placement="block"):
    """What ``cluster run`` executes: the supervisor itself (with the cluster's hosts
    file unless given), or mpiexec of ``argv`` on the nodes."""
    if argv[:1] and argv[0] in SUPERVISORS:
        if nprocs is not None:
            raise ClusterError("-n is for programs run under mpiexec; give launch its --np")
        own = argv[:argv.index("--")] if "--" in argv else argv     # launch's flags, not train's
        hosts = [] if "--hosts" in own else ["--hosts", spec.hosts_file]
        return [sys.executable, "-m", "minipar", argv[0], *hosts, *argv[1:]]
    return mpiexec_command(spec, argv, nprocs, placement)


def mpiexec_command(spec, argv, nprocs=None, placement="block"):
    """The command line that runs ``argv`` on ``nprocs`` ranks (default: every slot):
    ``block`` fills each node in turn (ranks 0..K-1 on node 0), ``cyclic`` deals ranks
    round the nodes (rank r on node r mod N) — tensor parallelism's neighbours then sit
    on different nodes."""
    nprocs = spec.world_size if nprocs is None else nprocs
    if not 1 <= nprocs <= spec.world_size:
        raise ClusterError(f"-n must be between 1 and {spec.world_size} "
                           f"({spec.nodes} nodes x {spec.ranks_per_node} ranks), got {nprocs}")
    mpiexec = mpiexec_path()
    if mpiexec is None:
        raise ClusterError("mpiexec not found: `pip install mpich` (minipar's install brings it)")
    if placement not in ("block", "cyclic"):
        raise ClusterError(f"--placement must be block or cyclic, got {placement!r}")
    hosts = (["-hosts", ",".join(spec.hosts), "-ppn", str(spec.ranks_per_node)] if placement == "block"
             else ["-hosts", ",".join(f"{h}:1" for h in spec.hosts)])
    return [mpiexec, *hosts, "-n", str(nprocs), "-bootstrap-exec", spec.wrapper,
            "-iface", spec.bridge, "-genv", "UCX_TLS", "tcp,self", *program(argv)]


def run_environment(spec, base=None):
    """The environment of the ranks: the caller's, with the cluster's profile
    (``link_profile.py``) unless the user gave one.  The thread variables this
    launcher's own ``setup_process`` wrote (its budget as one process, marked
    ``MINIPAR_BLAS_THREADS``) are dropped: each rank budgets its own, counting every rank
    on this machine, whatever namespace it runs in (``process/threads.py``)."""
    env = dict(os.environ if base is None else base)
    env.update(HYDRA_LAUNCHER_EXEC=spec.wrapper, HYDRA_IFACE=spec.bridge, UCX_TLS="tcp,self")
    profile = link_profile_path(spec)
    if "MINIPAR_PROFILE" not in env and os.path.isfile(profile):   # the link as shaped
        env["MINIPAR_PROFILE"] = profile
    if user_setting(env) is None:
        for name in (*SET_VARS, MARKER):
            env.pop(name, None)
    return env
