"""``python -m minipar cluster up | down | status | run -- CMD``.

    cluster up --nodes 2 --ranks-per-node 2 --inter-gbps 1     build it (root, ip, tc)
    cluster run -- train --dp 4 ...                            a job on every slot
    cluster run -n 2 -- bench comm                             on the first 2 slots
    cluster run -- launch --np 4 -- train --save-every 5 ...   elastic, across the nodes
    cluster status                                             what exists, bytes per link
    cluster fail-node 1                                        a node lost (a power cut)
    cluster down                                               remove all of it

Every refusal is one line and exit status 2.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

from minipar.cli_checks import OneLineParser
from minipar.cluster import launch, netns
from minipar.cluster.topology import DEFAULT_PREFIX, ClusterError, ClusterSpec, check_prefix


def build_parser():
    parser = OneLineParser(prog="python -m minipar cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build the namespaces, bridge, addresses and shaped links")
    up.add_argument("--nodes", type=int, required=True)
    up.add_argument("--ranks-per-node", type=int, required=True)
    up.add_argument("--inter-gbps", type=float, required=True,
                    help="the rate of the link between nodes, Gbit/s per direction")
    for name in ("down", "status"):
        sub.add_parser(name)
    lose = sub.add_parser("fail-node", help="lose node N as a power cut would: its processes "
                                            "killed, its namespace and link gone")
    lose.add_argument("node", type=int)
    run = sub.add_parser("run", help="run a command on the cluster: run [-n N] -- CMD ...")
    run.add_argument("-n", type=int, default=None, help="ranks (default: nodes x ranks-per-node)")
    run.add_argument("--placement", default="block", choices=["block", "cyclic"],
                     help="block: node 0 gets ranks 0..K-1 (tp inside a node); cyclic: rank r on "
                          "node r mod N (tp across nodes)")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    for p in sub.choices.values():
        p.add_argument("--prefix", default=DEFAULT_PREFIX,
                       help=f"the name every created object carries (default {DEFAULT_PREFIX})")
    return parser


def describe(info):
    spec = info["spec"]
    lines = [f"cluster {info['prefix']}: " + (
        f"{spec.nodes} nodes x {spec.ranks_per_node} ranks, {spec.inter_gbps:g} Gbit/s between nodes"
        if spec else "no state file")]
    if not info["namespaces"] and not info["links"]:
        return f"cluster {info['prefix']}: nothing is up"
    for node in info["namespaces"]:
        counts = info["bytes"].get(node)
        moved = (f"{counts['out_of'] / 2**20:.1f} MiB out, {counts['into'] / 2**20:.1f} MiB in"
                 if counts else "")
        lines.append(f"  {node}  {moved}")
    lines.append(f"  links: {' '.join(info['links'])}")
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.action == "up":
            spec = netns.up(ClusterSpec(args.nodes, args.ranks_per_node, args.inter_gbps,
                                        prefix=args.prefix))
            print(f"cluster {spec.prefix} up: {spec.nodes} nodes ({', '.join(spec.hosts)}) x "
                  f"{spec.ranks_per_node} ranks, {spec.inter_gbps:g} Gbit/s between nodes; "
                  f"`python -m minipar cluster run -- train ...`")
        elif args.action == "down":
            check_prefix(args.prefix)
            netns.require_tools()
            removed = netns.down(args.prefix)
            print(f"cluster {args.prefix} down: removed {len(removed['namespaces'])} nodes, "
                  f"{len(removed['links'])} links")
        elif args.action == "fail-node":
            netns.require_tools()
            spec = ClusterSpec.load(args.prefix)
            pids = netns.fail_node(spec, args.node)
            print(f"cluster {spec.prefix}: node {args.node} ({spec.node(args.node)}) lost: "
                  f"{len(pids)} processes killed, its namespace and link removed")
        elif args.action == "status":
            check_prefix(args.prefix)
            print(describe(netns.status(args.prefix)))
        else:
            spec = ClusterSpec.load(args.prefix)
            netns.require_tools()
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            proc = subprocess.run(launch.command(spec, cmd, args.n, args.placement),
                                  env=launch.run_environment(spec))
            return proc.returncode
    except ClusterError as err:
        sys.stderr.write(f"minipar cluster: {err}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
