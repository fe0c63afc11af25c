"""Membership: which slots the job may use, and which host each rank runs on.

Without a hosts file the job has ``--np`` slots on this machine; every failed rank takes
its slot away (an attempt with N slots and k failed ranks leaves N - k).

With ``--hosts FILE``, one ``host slots`` line per host (``#`` starts a comment)::

    localhost-a 2
    localhost-b 2

ranks are placed in the file's order, filling each host (block placement, hydra's
default): ranks 0-1 on localhost-a, 2-3 on localhost-b.  A failed rank takes its whole
host out of the job for the rest of the run (Horovod elastic blacklists a failed host
the same way).  The supervisor re-reads the file while the job runs: more slots than
the job uses means it can grow (scale-up).

On one machine, name the hosts ``localhost`` / ``localhost-<anything>`` (or this
machine's own name): they are slots of this machine pretending to be separate hosts,
and ``mpiexec`` gets no host list.  Other names go to ``mpiexec -hosts name:slots,...``.
"""
from __future__ import annotations

import os
import socket
import subprocess


class HostsError(ValueError):
    pass


def read_hosts(path):
    """[(host, slots)] in file order; HostsError with the line number for a bad line."""
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2 or not words[1].isdigit() or int(words[1]) < 1:
                raise HostsError(f"{path}:{number}: expected 'host slots', got {line.strip()!r}")
            if words[0] in dict(hosts):
                raise HostsError(f"{path}:{number}: host {words[0]!r} is listed twice")
            hosts.append((words[0], int(words[1])))
    return hosts


def is_local(host):
    return (host == "localhost" or host.startswith("localhost-") or host.startswith("127.")
            or host in ("::1", socket.gethostname()))


class Membership:
    """The slots the job may use now.  ``capacity`` is their number; ``fail(ranks, world)``
    takes failed ranks' slots (or hosts) away; ``refresh()`` re-reads the hosts file."""

    def __init__(self, np, hosts_file=None):
        self.np, self.hosts_file = np, hosts_file
        self.excluded = set()                # failed hosts, for the rest of the run
        self.slots_left = np                 # without a hosts file
        self.hosts = []
        self._stamp = None
        if hosts_file:
            self.refresh()

    def refresh(self):
        """Re-read the hosts file if it changed; True when it did.  A file caught half
        written (or briefly missing) keeps the previous view."""
        if not self.hosts_file:
            return False
        try:
            stamp = os.stat(self.hosts_file)
            stamp = (stamp.st_mtime_ns, stamp.st_size)
            if stamp == self._stamp:
                return False
            hosts = read_hosts(self.hosts_file)
        except (OSError, HostsError):
            if self._stamp is None:
                raise
            return False
        self._stamp, self.hosts = stamp, hosts
        return True

    def usable_hosts(self):
        return [(h, s) for h, s in self.hosts if h not in self.excluded]

    @property
    def capacity(self):
        if self.hosts_file:
            return sum(s for _, s in self.usable_hosts())
        return self.slots_left

    def placement(self, world):
        """The host of each of ``world`` ranks (block placement); 'localhost' without a file."""
        if not self.hosts_file:
            return ["localhost"] * world
        order = [h for h, s in self.usable_hosts() for _ in range(s)]
        return order[:world]

    def unreachable(self, world, timeout=10.0):
        """Hosts of the last attempt that no longer run a command: mpiexec's launcher (ssh,
        or HYDRA_LAUNCHER_EXEC: the simulated cluster's wrapper) asked to run ``true``
        there.  Used when a failure named no rank — a node that died took its ranks'
        reports with it — so the whole lost node is found and left out."""
        launcher = os.environ.get("HYDRA_LAUNCHER_EXEC") or "ssh"
        gone = []
        for host in sorted(set(self.placement(world))):
            if is_local(host):
                continue
            try:
                ok = subprocess.run([launcher, host, "true"], capture_output=True,
                                    timeout=timeout).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if not ok:
                gone.append(host)
        return gone

    def exclude(self, hosts):
        self.excluded.update(hosts)
        return sorted(hosts)

    def fail(self, ranks, world):
        """Take away what the failed ``ranks`` of a ``world``-rank attempt held; returns
        the hosts removed (empty without a hosts file)."""
        if not self.hosts_file:
            self.slots_left -= len(set(ranks))
            return []
        where = self.placement(world)
        gone = sorted({where[r] for r in ranks if r < len(where)})
        self.excluded.update(gone)
        return gone

    def mpiexec_hosts(self, world):
        """Extra ``mpiexec`` arguments that place ``world`` ranks ([] on one machine)."""
        where = self.placement(world)
        if all(is_local(h) for h in where):
            return []
        counts = {}
        for h in where:
            name = "localhost" if is_local(h) else h
            counts[name] = counts.get(name, 0) + 1
        return ["-hosts", ",".join(f"{h}:{n}" for h, n in counts.items())]
