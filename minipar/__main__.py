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

Every flag of the contract in DESIGN.md is parsed; one whose feature is not built
yet is refused with a message, never silently ignored.
"""
from __future__ import annotations

import argparse
import sys

from minipar.cli_checks import CommandError, OneLineParser


def add_train_flags(p, steps=None, steps_help="total steps (the LR schedule spans them)"):
    from minipar.config import TrainConfig as D         # the defaults live there, once
    from minipar.config_checks import EVAL_BATCHES
    layout = p.add_argument_group("layout")
    layout.add_argument("--layout", default="manual", choices=["manual", "auto"],
                        help="auto: the performance model picks the layout (`minipar plan`)")
    layout.add_argument("--dp", type=int, default=None, help="data-parallel size (default: all ranks)")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    layout.add_argument("--cp", type=int, default=1,
                        help="context-parallel size: the sequence split over cp ranks (ring attention)")
    layout.add_argument("--cp-split", default="zigzag", choices=["zigzag", "contiguous"],
                        help="how the sequence is cut: zigzag balances the causal mask's work")
    layout.add_argument("--sequence-parallel", action="store_true")
    layout.add_argument("--pp", type=int, default=1, help="pipeline stages")
    layout.add_argument("--chunks", type=int, default=1, help="model chunks per pipeline rank")
    layout.add_argument("--schedule", choices=["afab", "1f1b", "interleaved", "zb-h1"],
                        help="pipeline schedule (default 1f1b; needs --pp or --chunks)")
    layout.add_argument("--microbatches", type=int, default=None)
    layout.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    layout.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    layout.add_argument("--balance", action="store_true",
                        help="give each data-parallel replica a share of the batch by its speed")
    layout.add_argument("--bucket-mb", type=float, help="gradient bucket size in MiB "
                        "(default: the performance model's choice for the layout)")
    layout.add_argument("--no-overlap", action="store_true",
                        help="all-reduce after backward instead of from gradient hooks")
    layout.add_argument("--grad-compression", default="none",
                        choices=["none", "fp16", "bf16", "int8", "topk", "powersgd"],
                        help="compress data-parallel gradients (DDP comm hooks, error feedback)")
    layout.add_argument("--compression-ratio", type=float, default=D.compression_ratio,
                        help="topk: the fraction of each bucket kept (default 0.01)")
    layout.add_argument("--powersgd-rank", type=int, default=D.powersgd_rank)
    layout.add_argument("--compression-start", type=int, default=None,
                        help="uncompressed warm-up steps (default: 10 for powersgd, 0 otherwise)")
    layout.add_argument("--comm-algorithm", default="auto",
                        choices=["auto", "ring", "tree", "recursive_doubling", "rabenseifner",
                                 "hierarchical"])
    num = p.add_argument_group("numerics")
    num.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "fp64"])
    num.add_argument("--initial-loss-scale", type=float,
                     help="fp16: the dynamic loss scale to start from (default 2^16)")
    num.add_argument("--recompute", default="none", choices=["none", "full", "selective"])
    num.add_argument("--attention", default="naive", choices=["naive", "flash"])
    num.add_argument("--backend", default=None, choices=["numpy", "cupy"],
                     help="array library (default: $MINIPAR_BACKEND or numpy)")
    model = p.add_argument_group("model")
    model.add_argument("--model", default=D.model, help=f"preset (default {D.model}): tiny, small, medium, gpt2, "
                       "llama-tiny, llama-small, llama-medium")
    model.add_argument("--arch", choices=["gpt2", "llama"],
                       help="the block: gpt2 (LayerNorm, learned positions, GELU) or llama "
                       "(RMSNorm, RoPE, SwiGLU, grouped-query attention); default: the preset's")
    model.add_argument("--n-kv-head", type=int, help="llama: key/value heads (default n_head)")
    model.add_argument("--rope-theta", type=float, help="llama: RoPE's base (default 10000)")
    model.add_argument("--d-ff", type=int,
                       help="llama: SwiGLU's hidden width (default 8/3·d_model to a multiple of 64)")
    model.add_argument("--n-layer", type=int)
    model.add_argument("--d-model", type=int)
    model.add_argument("--n-head", type=int)
    model.add_argument("--seq-len", type=int)
    model.add_argument("--dropout", type=float)
    model.add_argument("--tie-weights", action="store_true", default=None)
    model.add_argument("--pad-vocab-to", type=int, metavar="N",
                       help="embedding/head rows padded to a multiple of N, the padding masked "
                            "out of the loss (default: 64 on --backend cupy, 1 on numpy)")
    run = p.add_argument_group("run")
    run.add_argument("--steps", type=int, default=steps or D.steps, help=steps_help)
    run.add_argument("--stop-at", type=int, default=None,
                     help="end this run at that step (saving with --save); resume later")
    run.add_argument("--batch-size", type=int, default=D.batch_size, help="global batch, in sequences")
    run.add_argument("--lr", type=float, default=D.lr)
    run.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: steps/10)")
    run.add_argument("--weight-decay", type=float, default=0.1)
    run.add_argument("--grad-clip", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--data", default="stdlib", help="'stdlib' (the standard library in BPE "
                     "tokens, built once and cached), 'stdlib-bytes' (the same text as bytes), "
                     "a text file or a folder (bytes), or a folder written by `minipar "
                     "tokenize` (tokens)")
    run.add_argument("--eval-batches", type=int,
                     help=f"validation batches after training (default {EVAL_BATCHES}; 0 to skip)")
    run.add_argument("--mem-per-rank", type=float, metavar="GIB",
                     help="memory one rank may use, in GiB, for the check before the run "
                          "(default: the GPU's free memory, or this node's RAM / its ranks)")
    run.add_argument("--skip-memory-check", action="store_true",
                     help="run even when the memory model predicts more than a rank may use")
    out = p.add_argument_group("output")
    out.add_argument("--log-json", help="write one JSON object per step to this file")
    out.add_argument("--trace", help="Chrome trace JSON of the pipeline schedule")
    out.add_argument("--peak-tflops", type=float, help="peak FLOP/s of one rank, for MFU")
    out.add_argument("--save", help="directory to write the final checkpoint to")
    out.add_argument("--save-every", type=int, default=0, help="also save every K steps")
    out.add_argument("--keep", type=int, default=D.keep,
                     help=f"complete checkpoints kept in --save (default {D.keep}; 0: all)")
    out.add_argument("--save-async", action="store_true",
                     help="write checkpoints from a background thread while the next forward and backward run")
    out.add_argument("--resume", help="checkpoint directory to continue from")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument("--hang-timeout", type=float, default=300.0,
                     help="seconds a rank may wait on a peer before the job ends, naming "
                          "both (default 300; 0: no limit)")


def build_parser():
    parser = OneLineParser(prog="python -m minipar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_flags(sub.add_parser("train", help="train a GPT under a parallel layout"))
    profile = sub.add_parser("profile", help="where a step's time goes: by op and phase, "
                             "against this machine's roofline")
    add_train_flags(profile, steps=3, steps_help="profiled steps, after one warm-up (default 3)")
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
    from minipar.config import ConfigError
    from minipar.layout import LayoutError, as_flags, validate_layout
    from minipar.train import TrainingStopped, train
    try:
        config = validate_layout(args)        # every check, before any message
        train(config)
    except LayoutError as err:
        _stop(err.code, 2)
    except ConfigError as err:                # found in setup (corpus, checkpoint, --save)
        _stop(f"minipar train: {as_flags(err)}", 2)
    except TrainingStopped as err:
        _stop(f"minipar train: {err}", err.code)


def run_profile(args):
    """``profile``: one run set up as ``train`` sets it up, its steps timed by op and phase."""
    from minipar.config import ConfigError
    from minipar.layout import LayoutError, as_flags, validate_layout
    from minipar.profiler import NOT_PROFILED, profile_run
    defaults = vars(build_parser().parse_args(["profile"]))
    for field, why in NOT_PROFILED.items():
        if getattr(args, field) != defaults[field]:
            _stop(f"minipar profile: --{field.replace('_', '-')} is not built for profile "
                  f"({why}); drop it", 2)
    if args.steps < 1 or args.top < 1:
        _stop(f"minipar profile: --steps and --top must be >= 1, got {args.steps} and {args.top}", 2)
    from minipar.cli_checks import output_file
    output_file("--json", args.json)
    try:
        config = validate_layout(args)
        profile_run(config, args.steps, top=args.top, json_path=args.json)
    except LayoutError as err:
        _stop(str(err.code).replace("minipar train:", "minipar profile:", 1), 2)
    except ConfigError as err:
        _stop(f"minipar profile: {as_flags(err)}", 2)


PASS_THROUGH = {   # subcommands with parsers of their own: everything after the name is theirs
    "plan": ("minipar.perf.plan", "plan_main"),
    "calibrate": ("minipar.perf.calibrate", "calibrate_main"),
    "report": ("minipar.report", "main"),
    "launch": ("minipar.elastic", "launch_main"),
    "cluster": ("minipar.cluster.cli", "main"),
    "tokenize": ("minipar.data.build", "main"),
    "export": ("minipar.export", "main"),
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASS_THROUGH:
        import importlib
        module, name = PASS_THROUGH[argv[0]]
        try:
            return getattr(importlib.import_module(module), name)(argv[1:])
        except CommandError as err:
            _stop(f"minipar {argv[0]}: {err}", 2)
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except CommandError as err:
        name = args.command + (f" {args.what}" if args.command == "bench" else "")
        _stop(f"minipar {name}: {err}", 2)


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


if __name__ == "__main__":
    sys.exit(main())
