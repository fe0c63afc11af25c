"""Elastic training: ``python -m minipar launch --np N [...] -- train ARGS``.

A supervisor runs the job under ``mpiexec``, watches every rank's heartbeat, and when a
rank dies, hangs or exits with an error it stops every process of the attempt, picks the
largest world size the surviving slots can hold and a valid layout exists for (never
below ``--min-np``), re-plans the layout and relaunches from the newest checkpoint.
With ``--hosts FILE``, a failure removes the failed rank's host and more slots in the
file make the job grow.  minipar's global batch and data order do not depend on the
layout, so the continued job follows the very same loss curve.

    supervisor.py   the loop: attempts, events, restarts, the merged log, goodput
    attempt.py      one mpiexec: heartbeats, failure and hang detection, cleanup
    agent.py        per rank: starts the rank as its child and records how it ended
    rank.py         the rank itself: train, checkpoint timing, fault injection (tests)
    membership.py   slots and hosts
    replan.py       the largest valid world size and its layout; the attempt's flags
    log.py          one log for the whole run, with event records
    goodput.py      goodput, Young/Daly's checkpoint interval, a failure simulation
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from minipar.cli_checks import CommandError, OneLineParser
from minipar.elastic.goodput import model_goodput, simulate, young_daly_interval
from minipar.elastic.replan import largest_world_size, layout_for

USAGE = "python -m minipar launch --np N [options] -- train TRAIN-ARGS"


def build_parser():
    p = OneLineParser(prog="python -m minipar launch", usage=USAGE,
                                description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, required=True, help="ranks to run (the most the job uses)")
    p.add_argument("--min-np", type=int, default=1, help="never run on fewer ranks (default 1)")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="failures to recover from before giving up (default 3)")
    p.add_argument("--hang-timeout", type=float, default=300.0,
                   help="seconds a rank may stay silent (no finished step) before the attempt "
                        "is ended as hung; must exceed a step plus a checkpoint (default 300)")
    p.add_argument("--startup-timeout", type=float, default=120.0,
                   help="seconds until a rank's first step (default 120)")
    p.add_argument("--hosts", help="'host slots' lines; edited while running, it grows the job")
    p.add_argument("--poll-hosts", type=float, default=1.0, help="seconds between reads of --hosts")
    p.add_argument("--mtbf", type=float, default=86400.0,
                   help="mean time between failures for the Young/Daly interval (default 1 day)")
    p.add_argument("--run-dir", help="where attempts keep heartbeats and logs (default: a new "
                                     "temporary folder, kept)")
    p.add_argument("--no-plan", action="store_true",
                   help="re-plan without the performance model (your layout, else data parallel)")
    p.add_argument("--fault", help="tests/lessons: RANK:STEP:kill|stop|exit|hold in the first "
                                   "attempt (see minipar/elastic/rank.py)")
    return p


def check_launch_flags(opts):
    """Every number in its range and every path usable, in one line, before any attempt."""
    from minipar.cli_checks import at_least, input_file, output_dir, positive
    at_least("--np", opts.np, 1)
    if not 1 <= opts.min_np <= opts.np:
        raise CommandError(f"need 1 <= --min-np ({opts.min_np}) <= --np ({opts.np})")
    at_least("--max-restarts", opts.max_restarts, 0)
    for flag in ("hang_timeout", "startup_timeout", "poll_hosts", "mtbf"):
        positive("--" + flag.replace("_", "-"), getattr(opts, flag))
    if opts.hosts is not None:
        input_file("--hosts", opts.hosts)
    output_dir("--run-dir", opts.run_dir)


def launch_main(argv=None) -> int:
    """The ``launch`` command; returns the exit status (0 done, 1 stopped, 2 usage)."""
    from minipar.config import ConfigError
    from minipar.elastic.membership import HostsError
    from minipar.elastic.rank import parse_fault
    from minipar.elastic.supervisor import LaunchStopped, Supervisor, say
    from minipar.cli_checks import as_flags
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" not in argv or argv[argv.index("--") + 1:argv.index("--") + 2] != ["train"]:
        if "-h" in argv or "--help" in argv:
            parser.parse_args(["--help"])
        raise CommandError("give the training command after '--': " + USAGE)
    cut = argv.index("--")
    opts, train_argv = parser.parse_args(argv[:cut]), argv[cut + 2:]
    check_launch_flags(opts)
    try:
        if opts.fault:
            parse_fault(opts.fault)
        opts.run_dir = opts.run_dir or tempfile.mkdtemp(prefix="minipar-launch-")
        return Supervisor(opts, train_argv).run()
    except (ValueError, HostsError, OSError) as err:
        if isinstance(err, ConfigError):
            err = as_flags(err)
        sys.stderr.write(f"minipar launch: {err}\n")
        return 2
    except LaunchStopped as err:
        say(str(err))
        return 130 if "interrupted" in str(err) else 1


__all__ = ["launch_main", "largest_world_size", "layout_for", "young_daly_interval",
           "model_goodput", "simulate"]
