"""``minipar plan``: every layout ``train`` accepts for N ranks, predicted and ranked.

    python -m minipar.perf.plan --ranks 8 --model small --batch-size 32 [--profile cpu]
    python -m minipar.perf.plan --ranks 3072 --nodes 384 --profile a100 --n-layer 128 \\
        --d-model 25600 --n-head 160 --seq-len 2048 --vocab 51200 --batch-size 512 --precision bf16

The search: tp over the divisors of N (at most the ranks of a node — tensor
parallelism across nodes is never competitive and is skipped), pp over the divisors
of N/tp, cp over the divisors of N/(tp·pp) with each of its kinds (the ring, Ulysses,
and the hybrid with every Ulysses degree U dividing cp: ``context_layouts``) where the
sequence is long, dp what is left; for a mixture of experts, ep over the divisors of
dp·cp that divide the experts; then chunks, schedule, micro-batches, ZeRO stage,
sequence parallelism, recomputation and gradient accumulation.  Each candidate is a
TrainConfig checked by ``config.resolve`` — the same checks as ``train``, so plan
refuses exactly what train refuses, for the same reasons (``refusals``).  The ones
that fit in memory are ranked by predicted step time (``estimate.predict``); the
others are listed with how much they are over.
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, replace

from minipar.cli_checks import CommandError, OneLineParser
from minipar.config import ConfigError, TrainConfig
from minipar.perf.comm import Cyclic
from minipar.perf.estimate import predict
from minipar.perf.profile import load_profile


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Plan:
    ranked: list            # Predictions that fit, fastest first
    too_big: list           # (Prediction, bytes over)
    refused: dict           # ConfigError message -> count
    seconds: float
    mem_limit: float


def long_sequence(cfg):
    """Whether context parallelism is worth a search: a layer's attention FLOPs (4·b·s²·h)
    at least its weights' (24·b·s·h²), s >= 6h.  Below, cutting the sequence saves
    little compute and every cp layout multiplies the candidates (up to 3x per cp)."""
    return cfg.seq_len >= 6 * cfg.d_model


def context_layouts(ranks, cfg):
    """{cp, cp_kind, cp_ulysses} of every context-parallel layout of at most ``ranks``
    ranks: none (cp 1), then, for a long sequence, each cp > 1 dividing ``ranks`` whose
    2·cp chunks cut the sequence: the ring, pure Ulysses and the hybrid of each U
    dividing cp."""
    yield dict(cp=1, cp_kind="ring", cp_ulysses=None)
    if not long_sequence(cfg):
        return
    seq_len = cfg.seq_len
    for cp in divisors(ranks)[1:]:
        if seq_len % (2 * cp):
            continue
        yield dict(cp=cp, cp_kind="ring", cp_ulysses=None)
        for u in divisors(cp)[1:]:
            yield dict(cp=cp, cp_kind="ulysses", cp_ulysses=None if u == cp else u)


def candidates(base, world, ranks_per_node=8, max_micro_rows=8):
    """TrainConfigs (unresolved) for every layout of ``world`` ranks (see the docstring)."""
    L = base.model_config().n_layer
    experts = base.model_config().moe_experts
    B = base.batch_size
    for tp in [d for d in divisors(world) if d <= max(ranks_per_node, 1)]:
        for pp in divisors(world // tp):
            for context in context_layouts(world // (tp * pp), base.model_config()):
                dp = world // (tp * pp * context["cp"])
                if B % dp:
                    continue
                per_replica = B // dp
                rows = [r for r in divisors(per_replica) if r <= max_micro_rows]
                for sp, recompute, zero in itertools.product(
                        (False, True) if tp > 1 else (False,), ("none", "selective", "full"),
                        (0, 1, 2, 3) if dp * context["cp"] > 1 else (0,)):
                    for ep in expert_parallel_sizes(dp * context["cp"], experts):
                        common = dict(dp=dp, tp=tp, pp=pp, sequence_parallel=sp,
                                      recompute=recompute, zero=zero, ep=ep, **context)
                        yield from _schedules(base, common, pp, L, rows, per_replica)


def expert_parallel_sizes(data_ranks, experts):
    """The ep sizes a layout of ``data_ranks`` data-parallel ranks (dp·cp) can carve for
    ``experts`` experts: every common divisor (1 alone for a dense model)."""
    if not experts:
        return [1]
    return [e for e in divisors(data_ranks) if experts % e == 0]


def _schedules(base, common, pp, L, rows, per_replica):
    """The layout ``common`` with each micro-batch size of ``rows`` and, in a pipeline,
    each schedule (and chunk count) that divides the layers."""
    if pp == 1:
        for b in rows:
            yield replace(base, **common, grad_accum=per_replica // b,
                          chunks=1, schedule=None, microbatches=None)
        return
    for b in rows:
        m = per_replica // b
        for kind in ("1f1b", "zb-h1", "interleaved", "afab"):
            for v in ((2, 3, 4) if kind == "interleaved" else (1,)):
                if (L // pp) % v if L % pp == 0 else True:
                    continue
                yield replace(base, **common, chunks=v, schedule=kind,
                              microbatches=m, grad_accum=1)


def plan(base: TrainConfig, world, profile=None, nodes=None, mem_per_rank=None,
         placements=("block",)):
    """Rank every layout of ``world`` ranks for the model and run of ``base``; with
    ``placements`` ("block", "cyclic") each layout under each way of placing ranks."""
    t0 = time.perf_counter()
    prof = load_profile(profile)
    if nodes:
        rpn = -(-world // nodes)
    elif prof.kind == "measured" and "inter" in prof.links:   # calibrated across nodes
        rpn = prof.ranks_per_node or world
    else:                       # a measured profile: this machine, every rank on it
        rpn = world if prof.kind == "measured" else (prof.ranks_per_node or world)
    limit = mem_per_rank if mem_per_rank is not None else (prof.mem_per_rank_bytes or float("inf"))
    ranked, too_big, refused = [], [], {}
    where = {"block": rpn, "cyclic": Cyclic(rpn, -(-world // rpn))}   # how ranks sit on nodes
    for cand in candidates(base, world, rpn):
        try:
            config = cand.resolve(world)
        except ConfigError as err:
            key = str(err)
            refused[key] = refused.get(key, 0) + 1
            continue
        for how in placements:
            p = predict(config, prof, ranks_per_node=where[how])
            p.breakdown["placement"] = how
            if p.mem_bytes > limit:
                too_big.append((p, p.mem_bytes - limit))
            else:
                ranked.append(p)
    # where the host's cores bind (perf/host.py) layouts tie: the shorter own path first
    ranked.sort(key=lambda p: (p.step_s, p.breakdown["critical_path_s"]))
    too_big.sort(key=lambda r: r[1])
    return Plan(ranked, too_big, refused, time.perf_counter() - t0, limit)


def describe(config):
    """The layout as ``train`` flags."""
    c = config
    parts = [f"--dp {c.dp}", f"--tp {c.tp}"] + (["--sequence-parallel"] if c.sequence_parallel else [])
    if c.cp > 1:
        parts += [f"--cp {c.cp}"] + ([f"--cp-kind {c.cp_kind}"] if c.cp_kind != "ring" else [])
        parts += [f"--cp-ulysses {c.cp_ulysses}"] if c.cp_ulysses else []
    if c.pipelined:
        parts += [f"--pp {c.pp}", f"--schedule {c.schedule}", f"--microbatches {c.microbatches}"]
        parts += [f"--chunks {c.chunks}"] if c.chunks > 1 else []
    parts += [f"--ep {c.ep}"] if c.ep > 1 else []
    if c.grad_accum > 1:
        parts.append(f"--grad-accum {c.grad_accum}")
    parts += [f"--zero {c.zero}"] if c.zero else []
    parts += ["--no-overlap"] if not c.overlap else []
    parts += [f"--recompute {c.recompute}"] if c.recompute != "none" else []
    return " ".join(parts)


def train_command(config, world):
    c = config
    model = f"--model {c.model}" + "".join(f" --{k.replace('_', '-')} {getattr(c, k)}" for k in
                                           ("arch", "n_layer", "d_model", "n_head", "n_kv_head",
                                            "d_ff", "seq_len")
                                           if getattr(c, k) is not None)
    model += "".join(f" --{k.replace('_', '-')} {getattr(c, k)}" for k in
                     ("moe_experts", "moe_top_k", "moe_every", "moe_shared_experts")
                     if c.moe_experts and getattr(c, k) != getattr(TrainConfig, k))
    return (f"mpiexec -n {world} python -m minipar train {describe(c)} {model} "
            f"--batch-size {c.batch_size} --precision {c.precision}")


def _gib(n):
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 27 else f"{n / 2 ** 20:.1f} MiB"


def format_plan(pl: Plan, world, top=10):
    lines = [f"{'#':>2} {'layout':<62} {'step s':>9} {'tokens/s':>10} {'MFU':>6} "
             f"{'mem/rank':>10} {'bubble':>7} {'comm':>6}"]
    for i, p in enumerate(pl.ranked[:top], 1):
        name = describe(p.config) + (" (cyclic)" if p.breakdown.get("placement") == "cyclic" else "")
        lines.append(f"{i:>2} {name:<62} {p.step_s:9.4g} {p.tokens_per_s:10.4g} "
                     f"{p.mfu:6.1%} {_gib(p.mem_bytes):>10} {p.bubble:7.1%} {p.comm_share:6.1%}")
    lines.append(f"{len(pl.ranked)} layouts fit, {len(pl.too_big)} do not fit in "
                 f"{_gib(pl.mem_limit) if pl.mem_limit < float('inf') else 'memory'}, "
                 f"{sum(pl.refused.values())} refused by train's checks; searched in {pl.seconds:.1f} s")
    for p, over in pl.too_big[:3]:
        lines.append(f"   too big: {describe(p.config)} needs {_gib(p.mem_bytes)} ({_gib(over)} over)")
    if pl.ranked:
        best = pl.ranked[0]
        lines.append("best: " + train_command(best.config, world) + (
            "   with ranks dealt round the nodes (cluster run --placement cyclic; "
            "mpiexec -hosts a:1,b:1,...)" if best.breakdown.get("placement") == "cyclic" else ""))
    return "\n".join(lines)


def auto_layout(config: TrainConfig, world_size: int, profile=None):
    """``train --layout auto``: (the plan's fastest layout for ``world_size`` ranks as a
    TrainConfig — the run's other settings kept — and the plan's text)."""
    pl = plan(config.with_default_layout(), world_size, profile)
    if not pl.ranked:
        raise ConfigError(f"no layout of {world_size} ranks fits: " + format_plan(pl, world_size))
    return pl.ranked[0].config, format_plan(pl, world_size)


# train's settings that plan takes, as train's flags: the model, the batch, the numerics
TRAIN_FLAGS = ("model", "arch", "n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "seq_len",
               "moe_experts", "moe_top_k", "moe_every", "moe_shared_experts",
               "batch_size", "precision", "attention")


def _checked_inputs(a):
    """(base TrainConfig, Profile) of plan's flags, or CommandError: a count below 1, more
    nodes than ranks, a model that cannot be built, a missing or corrupt profile, an
    unwritable --json — said in one line before the search."""
    from minipar.cli_checks import CommandError, at_least, output_file, positive
    for flag in ("ranks", "nodes", "top", "batch_size", "n_layer", "d_model", "n_head",
                 "n_kv_head", "d_ff", "seq_len", "vocab"):
        at_least("--" + flag.replace("_", "-"), getattr(a, flag), 1)
    if a.nodes is not None and a.nodes > a.ranks:
        raise CommandError(f"--nodes {a.nodes} is more than --ranks {a.ranks}: a node holds at least one rank")
    positive("--mem-per-rank", a.mem_per_rank)
    output_file("--json", a.json)
    base = TrainConfig(**{name: getattr(a, name) for name in TRAIN_FLAGS})
    try:
        base.model_config()
    except ValueError as err:
        raise CommandError(as_flags(err)) from None
    # the head is sized by the vocabulary: --vocab's, or the default data's (as train's)
    base = with_vocab(base, a.vocab) if a.vocab else with_data(base)
    try:
        prof = load_profile(a.profile)
    except FileNotFoundError as err:
        raise CommandError(f"--profile: {err}") from None
    except (OSError, ValueError, TypeError) as err:
        raise CommandError(f"--profile {a.profile}: not a readable profile JSON ({err})") from None
    return base, prof


def _diloco_config(base, a):
    """plan --diloco G: data parallelism over every rank cut into G DiLoCo groups, or
    CommandError (G not dividing the ranks, ...) in one line."""
    from dataclasses import replace
    from minipar.cli_checks import CommandError
    try:
        return replace(base, outer="diloco", diloco_groups=a.diloco).resolve(a.ranks)
    except ConfigError as err:
        raise CommandError(f"--diloco {a.diloco}: {as_flags(err)}") from None


def plan_main(argv=None):
    """The ``minipar plan`` command."""
    ap = OneLineParser(prog="minipar plan", description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--profile", default=None, help="a100 | h100 | h200 | cpu | a JSON path")
    ap.add_argument("--mem-per-rank", type=float, default=None, help="GiB")
    ap.add_argument("--json", default=None, help="write the full ranking here")
    ap.add_argument("--top", type=int, default=10)
    add_field_flags(ap, TRAIN_FLAGS)
    ap.add_argument("--vocab", type=int, default=None,
                    help="the vocabulary (default: the default --data's, as train)")
    ap.add_argument("--placements", default="block",
                    help="block (node 0 holds ranks 0..K-1), cyclic (rank r on node r mod N), or "
                         "block,cyclic to rank both")
    ap.add_argument("--diloco", type=int, default=None, metavar="G",
                    help="also price DiLoCo with G groups (on a cluster: G = --nodes) against "
                         "data parallelism over every rank, per step at H = 10, 50, 100, 500")
    a = ap.parse_args(argv)
    base, prof = _checked_inputs(a)
    diloco = _diloco_config(base, a) if a.diloco is not None else None
    mem = a.mem_per_rank * 2 ** 30 if a.mem_per_rank else None
    placements = tuple(filter(None, a.placements.split(",")))
    if not placements or set(placements) - {"block", "cyclic"}:
        raise CommandError(f"--placements must be block, cyclic or block,cyclic, got {a.placements!r}")
    pl = plan(base, a.ranks, prof, a.nodes, mem, placements)
    print(format_plan(pl, a.ranks, a.top))
    if diloco is not None:
        from minipar.perf.diloco import compare
        print()
        print(compare(diloco, prof, a.ranks // a.nodes if a.nodes else None))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([dict(layout=describe(p.config), step_s=p.step_s, tokens_per_s=p.tokens_per_s,
                            mfu=p.mfu, mem_bytes=p.mem_bytes, bubble=p.bubble,
                            comm_share=p.comm_share, **{k: v for k, v in p.breakdown.items()})
                       for p in pl.ranked], f, indent=1)
    return 0


from minipar.cli_checks import as_flags  # noqa: E402
from minipar.config.flags import add_field_flags  # noqa: E402
from minipar.config.probes import with_data  # noqa: E402
from minipar.perf.models import with_vocab  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(plan_main())
