"""Build, inspect and remove a simulated cluster with ``ip`` and ``tc``.

    up       bridge {prefix}br (bridge address) ─┬─ veth {prefix}v0 ══ eth0 in {prefix}-n0
                                                 └─ veth {prefix}v1 ══ eth0 in {prefix}-n1 ...
             tbf at the link's rate on both ends of every veth
    down     every namespace and link whose name carries the prefix (no state file needed:
             a crash in the middle of ``up`` or of a run leaves nothing ``down`` misses)
    status   what exists now under the prefix, and the bytes each veth has carried

A token bucket (tbf) lets bytes through at ``rate`` with ``burst`` bytes of credit; its
``latency`` bounds how long a packet may queue.  The burst must hold at least one
timer tick of data at the rate (rate·tick), or the bucket cannot reach its rate.
"""
from __future__ import annotations

import os
import shutil
import subprocess

from dataclasses import replace

from minipar.cluster.link_profile import write_link_profile
from minipar.cluster.topology import SUBNET_BASE, ClusterError, ClusterSpec, state_dir


def require_tools():
    """One line unless this process may build namespaces: root, ``ip`` and ``tc``."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"needs {' and '.join(missing)} (iproute2): install it, e.g. "
                           f"`apt-get install iproute2`")
    if os.geteuid() != 0:
        raise ClusterError("needs root to create network namespaces (run it with sudo, or as root)")


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _in_node(node, *cmd):
    return _ip("netns", "exec", node, *cmd)


def shape(spec, device, node=None):
    """Cap ``device``'s egress at the link's rate (a tbf qdisc as its root)."""
    rate_bps = spec.inter_gbps * 1e9
    burst = max(int(rate_bps / 8 / 250), 32 << 10)     # 4 ms of data at the rate, at least 32 KiB
    cmd = ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", spec.rate,
           "burst", str(burst), "latency", "100ms"]
    if node is not None:
        cmd = ["ip", "netns", "exec", node] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


def free_subnet():
    """The first 198.18.X.0/24 no interface of this machine has an address in (two
    clusters on one subnet would route each other's bytes to the wrong bridge)."""
    used = set()
    for line in _ip("-o", "-4", "addr", "show", check=False).splitlines():
        for word in line.split():
            if word.startswith(f"{SUBNET_BASE[0]}.{SUBNET_BASE[1]}."):
                used.add(int(word.split(".")[2]))
    for subnet in range(256):
        if subnet not in used:
            return subnet
    raise ClusterError("every 198.18.X.0/24 is taken: bring another cluster down first")


def up(spec: ClusterSpec):
    """Create the cluster on a free subnet; on any failure remove what was made and
    raise one line."""
    require_tools()
    if any(existing(spec.prefix).values()):
        raise ClusterError(f"cluster {spec.prefix!r} is already up: "
                           f"`python -m minipar cluster down --prefix {spec.prefix}` first")
    spec = replace(spec, subnet=free_subnet())
    try:
        _ip("link", "add", spec.bridge, "type", "bridge")
        _ip("addr", "add", f"{spec.bridge_address}/24", "dev", spec.bridge)
        _ip("link", "set", spec.bridge, "up")
        for i, node in enumerate(spec.hosts):
            _ip("netns", "add", node)
            _ip("link", "add", spec.veth(i), "type", "veth", "peer", "name", "eth0", "netns", node)
            _ip("link", "set", spec.veth(i), "master", spec.bridge, "up")
            _in_node(node, "ip", "addr", "add", f"{spec.address(i)}/24", "dev", "eth0")
            _in_node(node, "ip", "link", "set", "eth0", "up")
            _in_node(node, "ip", "link", "set", "lo", "up")
            shape(spec, spec.veth(i))                   # bridge -> node
            shape(spec, "eth0", node=node)              # node -> bridge
        spec.save()
        write_link_profile(spec)                        # what the performance model is told
    except BaseException:
        down(spec.prefix)
        raise
    return spec


def existing(prefix):
    """The namespaces and links that carry ``prefix`` now."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).splitlines()
                  if line.split() and line.split()[0].startswith(f"{prefix}-n")]
    links = []
    for line in _ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name == f"{prefix}br" or (name.startswith(f"{prefix}v") and name[len(prefix) + 1:].isdigit()):
            links.append(name)
    return {"namespaces": sorted(namespaces), "links": sorted(links)}


def down(prefix):
    """Remove every namespace and link of the cluster, and its state folder; returns what
    was removed.  Removing a namespace removes its veth pair with it."""
    found = existing(prefix)
    for node in found["namespaces"]:
        _ip("netns", "del", node, check=False)
    for link in existing(prefix)["links"]:
        _ip("link", "del", link, check=False)
    shutil.rmtree(state_dir(prefix), ignore_errors=True)
    left = existing(prefix)
    if left["namespaces"] or left["links"]:
        raise ClusterError(f"could not remove {left['namespaces'] + left['links']} (are you root?)")
    return found


def fail_node(spec, i):
    """A node lost, as a power cut would lose it: every process in its namespace killed
    (SIGKILL: no handler runs, nothing is reported), then the namespace and its link
    removed, so nothing can be started there again.  Returns the pids killed."""
    node = spec.node(i)
    if node not in existing(spec.prefix)["namespaces"]:
        raise ClusterError(f"node {i} ({node}) is not up")
    pids = [int(p) for p in _ip("netns", "pids", node, check=False).split()]
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    _ip("netns", "del", node, check=False)
    _ip("link", "del", spec.veth(i), check=False)
    return pids


def link_bytes(spec):
    """Bytes each node's veth has carried (bridge side): tx = into the node, rx = out of it."""
    counts = {}
    for i, node in enumerate(spec.hosts):
        base = f"/sys/class/net/{spec.veth(i)}/statistics"
        try:
            with open(f"{base}/tx_bytes") as tx, open(f"{base}/rx_bytes") as rx:
                counts[node] = {"into": int(tx.read()), "out_of": int(rx.read())}
        except OSError:
            counts[node] = None
    return counts


def status(prefix):
    """What is up under ``prefix``: the spec (if its state file survives), the namespaces
    and links that exist, and each veth's byte counters."""
    found = existing(prefix)
    try:
        spec = ClusterSpec.load(prefix)
    except ClusterError:
        spec = None
    return {"prefix": prefix, "spec": spec, **found,
            "bytes": link_bytes(spec) if spec and found["namespaces"] else {}}
