"""What a simulated cluster is made of: its nodes, their names and addresses, its link.

One prefix names everything the cluster creates, so ``down`` can find and remove all of
it by name, even after a crash that lost the state file:

    namespace (a node)     {prefix}-n{i}         host names given to mpiexec
    bridge                 {prefix}br            the "switch", in the root namespace
    veth, bridge side      {prefix}v{i}          its peer inside node i is eth0

Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for benchmarking network
devices (no real host uses it): the bridge is .1 of the cluster's /24, node i is .(10+i).

The link: every byte that leaves a node (its eth0) and every byte the bridge hands to a
node (its veth) passes a token bucket of ``inter_gbps`` Gbit/s, so a transfer between
two nodes runs at that rate in each direction.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass

DEFAULT_PREFIX = "mpc"
MAX_NODES = 64                 # .10 + i must stay inside one /24
SUBNET_BASE = (198, 18)        # RFC 2544 benchmarking range


class ClusterError(Exception):
    """A cluster that cannot be built, found or used: one line that says why."""


def check_prefix(prefix):
    """The prefix every created name carries: interface names are at most 15 characters."""
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", prefix):
        raise ClusterError(f"--prefix must be 1-8 lowercase letters or digits starting with a "
                           f"letter (interface names are at most 15 characters), got {prefix!r}")
    return prefix


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    ranks_per_node: int
    inter_gbps: float
    prefix: str = DEFAULT_PREFIX
    subnet: int = 0            # the third octet; ``up`` takes a free one, so clusters coexist

    def __post_init__(self):
        check_prefix(self.prefix)
        if not 1 <= self.nodes <= MAX_NODES:
            raise ClusterError(f"--nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if self.ranks_per_node < 1:
            raise ClusterError(f"--ranks-per-node must be >= 1, got {self.ranks_per_node}")
        if not (self.inter_gbps > 0 and self.inter_gbps <= 1000):
            raise ClusterError(f"--inter-gbps must be a number in (0, 1000], got {self.inter_gbps}")
        if not 0 <= self.subnet <= 255:
            raise ClusterError(f"subnet must be 0-255, got {self.subnet}")

    # ------------------------------------------------------------------ names
    def node(self, i):
        return f"{self.prefix}-n{i}"

    @property
    def hosts(self):
        return [self.node(i) for i in range(self.nodes)]

    @property
    def bridge(self):
        return f"{self.prefix}br"

    def veth(self, i):
        return f"{self.prefix}v{i}"

    # ------------------------------------------------------------------ addresses
    @property
    def bridge_address(self):
        return f"{SUBNET_BASE[0]}.{SUBNET_BASE[1]}.{self.subnet}.1"

    def address(self, i):
        return f"{SUBNET_BASE[0]}.{SUBNET_BASE[1]}.{self.subnet}.{10 + i}"

    @property
    def world_size(self):
        return self.nodes * self.ranks_per_node

    @property
    def rate(self):
        """tc's spelling of the link's rate."""
        return f"{self.inter_gbps * 1000:g}mbit"

    # ------------------------------------------------------------------ state on disk
    @property
    def state_dir(self):
        return state_dir(self.prefix)

    @property
    def hosts_file(self):
        """``host slots`` lines, as ``launch --hosts`` reads them."""
        return os.path.join(self.state_dir, "hosts")

    @property
    def wrapper(self):
        return os.path.join(self.state_dir, "wrapper")

    def save(self):
        """spec.json, the hosts file and the ssh stand-in, in the state folder."""
        os.makedirs(self.state_dir, exist_ok=True)
        _write(os.path.join(self.state_dir, "spec.json"), json.dumps(asdict(self), indent=1) + "\n")
        _write(self.hosts_file, "".join(f"{h} {self.ranks_per_node}\n" for h in self.hosts))
        _write(self.wrapper, wrapper_script(self.prefix), mode=0o755)

    @staticmethod
    def load(prefix=DEFAULT_PREFIX):
        path = os.path.join(state_dir(prefix), "spec.json")
        try:
            with open(path) as f:
                return ClusterSpec(**json.load(f))
        except FileNotFoundError:
            raise ClusterError(f"no cluster {prefix!r} is up: run `python -m minipar cluster up` "
                               f"first") from None
        except (ValueError, TypeError) as err:
            raise ClusterError(f"{path} is not a cluster description ({err}); "
                               f"`python -m minipar cluster down --prefix {prefix}` clears it") from None


def state_dir(prefix):
    return os.path.join(tempfile.gettempdir(), f"minipar-cluster-{prefix}")


def wrapper_script(prefix):
    """What mpiexec calls instead of ssh: ``wrapper [ssh options] HOST COMMAND...``.

    It drops ssh's options, checks that HOST is one of this cluster's nodes and runs the
    command in that node's namespace (the command arrives as one shell string, as ssh
    would pass it to the remote shell)."""
    return f"""#!/bin/sh
# minipar cluster {prefix}: an ssh stand-in for mpiexec -bootstrap-exec
while [ "${{1#-}}" != "$1" ]; do shift; done
host="$1"; shift
case "$host" in
  {prefix}-n[0-9]*) ;;
  *) echo "minipar cluster: $host is not a node of cluster {prefix}" >&2; exit 255 ;;
esac
exec ip netns exec "$host" sh -c "$*"
"""


def _write(path, text, mode=0o644):
    """Atomic: a temporary file renamed over the old one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
