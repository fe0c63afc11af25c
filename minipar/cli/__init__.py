"""The command line: ``python -m minipar train | profile | sample | report | plan | ...``.

    mpiexec -n N python -m minipar train [layout] [numerics] [model] [run] [output]
    python -m minipar profile [train's model/run flags] [--steps N] [--top K] [--json FILE]
    python -m minipar sample --resume DIR [--prompt TEXT]
    python -m minipar checkpoint inspect DIR | consolidate DIR OUT | upgrade OLD NEW
    python -m minipar report LOG.json [LOG2.json ...] --out DIR
    python -m minipar plan --ranks N [--nodes K] [--profile P] [model/run flags]
    python -m minipar tokenize --data stdlib|PATH --vocab V --out DIR
    python -m minipar export DIR --format hf --out OUT
    mpiexec -n N python -m minipar calibrate [--out profile.json]
    python -m minipar launch --np N [--min-np M] [--hosts FILE] -- train ...
    python -m minipar cluster up --nodes N --ranks-per-node K --inter-gbps G | run -- train ... | down
    mpiexec -n N python -m minipar bench comm [...]
    python -m minipar bench attention [...]

Every flag is parsed; one whose feature is not built yet is refused with a message,
never silently ignored.
"""
from __future__ import annotations

import argparse
import sys

from minipar.cli_checks import CommandError, OneLineParser
from minipar.process import setup_process


def add_train_flags(p, steps=None, steps_help=None):
    """``train``'s flags on parser ``p``: one per field of ``TrainConfig`` (generated from
    the fields, ``config/flags.py``), and ``--layout``, the one the command line owns.
    ``steps``, ``steps_help``: another default and help for --steps (``profile``)."""
    from minipar.config.flags import add_config_flags
    overrides = {"steps": {k: v for k, v in (("default", steps), ("help", steps_help)) if v}}
    groups = add_config_flags(p, overrides)
    groups["layout"].add_argument("--layout", default="manual", choices=["manual", "auto"],
                                  help="auto: the performance model picks the layout "
                                       "(`minipar plan`)")


def build_parser():
    parser = OneLineParser(prog="python -m minipar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_flags(sub.add_parser("train", help="train a GPT under a parallel layout"))
    profile = sub.add_parser("profile", help="where a step's time goes: by op and phase, "
                             "against this machine's roofline")
    add_train_flags(profile, steps=3, steps_help="profiled steps, after one warm-up (default %(default)s)")
    profile.add_argument("--top", type=int, default=15, help="rows of the op table (default 15)")
    profile.add_argument("--json", help="also write the tables to this file (JSON)")
    sample = sub.add_parser("sample", help="generate text from a checkpoint")
    sample.add_argument("--resume", required=True, help="checkpoint directory")
    sample.add_argument("--prompt", default="def ")
    sample.add_argument("--tokens", type=int, default=200)
    sample.add_argument("--temperature", type=float, default=0.8)
    sample.add_argument("--top-k", type=int, default=40)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--backend", default=None, choices=["numpy", "cupy"])
    ckpt = sub.add_parser("checkpoint", help="inspect, consolidate or upgrade a checkpoint")
    ckpt.add_argument("action", choices=["inspect", "consolidate", "upgrade"])
    ckpt.add_argument("directory", help="the --save directory, or one step-N directory of it")
    ckpt.add_argument("out", nargs="?", help="consolidate/upgrade: the directory to write")
    report = sub.add_parser("report", help="plots and an HTML page of one or more --log-json runs")
    report.add_argument("rest", nargs=argparse.REMAINDER, help="LOG.json [...] --out DIR [--label NAME ...]")
    for name, text in (("plan", "rank every layout for a model and a cluster (performance model)"),
                       ("tokenize", "train a BPE tokenizer and write a corpus as token shards"),
                       ("export", "a checkpoint as a Hugging Face model (config.json, model.safetensors)"),
                       ("launch", "run train under the elastic supervisor: restarts, re-planning"),
                       ("calibrate", "measure this machine into a hardware profile (JSON)"),
                       ("cluster", "a cluster on this machine: nodes as network namespaces, "
                                   "a shaped link between them")):
        cmd = sub.add_parser(name, help=text, add_help=False)
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
    bench = sub.add_parser("bench", help="benchmarks: comm, attention")
    bench.add_argument("what", choices=["comm", "attention"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _rank():
    """This process's rank, without starting MPI if nothing started it."""
    import os
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _stop(message, code):
    """One line, printed once (rank 0), then the same exit status on every rank."""
    if _rank() == 0:
        sys.stderr.write(f"{message}\n")
        sys.stderr.flush()
    sys.exit(code)


def run_train(args):
    from minipar.cli.run_config import config_from_flags
    from minipar.train import TrainingStopped, train
    config = config_from_flags(args)          # every check and probe, before any message
    try:
        train(config, prepared=True)
    except TrainingStopped as err:
        _stop(f"minipar train: {err}", err.code)


def run_profile(args):
    """``profile``: one run set up as ``train`` sets it up, its steps timed by op and phase."""
    from minipar.cli_checks import output_file
    from minipar.cli.run_config import config_from_flags
    from minipar.observe.profiler import NOT_PROFILED, profile_run
    defaults = vars(build_parser().parse_args(["profile"]))
    for field, why in NOT_PROFILED.items():
        if getattr(args, field) != defaults[field]:
            raise CommandError(f"--{field.replace('_', '-')} is not built for profile ({why}); drop it")
    if args.steps < 1 or args.top < 1:
        raise CommandError(f"--steps and --top must be >= 1, got {args.steps} and {args.top}")
    output_file("--json", args.json)
    profile_run(config_from_flags(args), args.steps, top=args.top, json_path=args.json)


PASS_THROUGH = {   # subcommands with parsers of their own: everything after the name is theirs
    "plan": ("minipar.perf.plan", "plan_main"),
    "calibrate": ("minipar.perf.calibrate", "calibrate_main"),
    "report": ("minipar.observe.report", "main"),
    "launch": ("minipar.elastic", "launch_main"),
    "cluster": ("minipar.cluster.cli", "main"),
    "tokenize": ("minipar.data.build", "main"),
    "export": ("minipar.export", "main"),
}


def _refused(command, err):
    """A bad flag, input or configuration: ``minipar COMMAND: <one line>``, exit 2.  A
    ConfigError names the config's fields (`n_head`): said as the flags (--n-head)."""
    from minipar.cli_checks import as_flags
    from minipar.config import ConfigError
    _stop(f"minipar {command}: {as_flags(err) if isinstance(err, ConfigError) else err}", 2)


def main(argv=None):
    setup_process()          # the thread budget and the allocator, before NumPy's BLAS starts
    from minipar.config import ConfigError
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASS_THROUGH:
        import importlib
        module, name = PASS_THROUGH[argv[0]]
        try:
            return getattr(importlib.import_module(module), name)(argv[1:])
        except (CommandError, ConfigError) as err:
            _refused(argv[0], err)
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (CommandError, ConfigError) as err:
        _refused(args.command + (f" {args.what}" if args.command == "bench" else ""), err)


def _run(args):
    if getattr(args, "backend", None):
        from minipar.backend import set_backend
        try:
            set_backend(args.backend)
        except RuntimeError as err:          # no CuPy, or no GPU
            raise CommandError(f"--backend {args.backend}: {err}") from None
    if args.command == "train":
        run_train(args)
    elif args.command == "profile":
        run_profile(args)
    elif args.command == "sample":
        from minipar.sample import SampleError, sample_main
        try:
            sample_main(args)
        except SampleError as err:
            _stop(f"minipar sample: {err}", 2)
    elif args.command == "checkpoint":
        from minipar.checkpoint.tools import main as checkpoint_main
        if args.action != "inspect" and not args.out:
            raise CommandError(f"{args.action} needs OUT, the directory to write")
        try:
            return checkpoint_main(args)
        except (ValueError, FileNotFoundError, OSError) as err:
            raise CommandError(str(err)) from None
    elif args.command == "bench":
        if args.what == "comm":
            from minipar.comm.bench import main as bench_main
        else:
            from minipar.kernels.bench import main as bench_main
        return bench_main(args.rest)
