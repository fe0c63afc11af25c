"""Re-planning: the world size and the layout of the next attempt, and its ``train`` flags.

The rule (``largest_world_size``): the next attempt runs on the **largest** number of
ranks w <= the slots left (and <= ``--np``) for which some layout is valid, and never on
fewer than ``--min-np``.  "Valid" is decided by the trainer itself:
``TrainConfig.resolve(w)`` raises ``ConfigError`` for any layout that cannot run.  With a
global batch of 8 and 4 heads, 3 slots give 2 ranks: dp 3 does not divide the batch,
tp 3 not the heads, pp 3 not 2 layers — one slot stays idle.

For each w the layout is, in this order (``layout_for``):

1. the performance model's choice, ``minipar.perf.plan.auto_layout`` (the predicted
   fastest layout of w ranks), when it finds one;
2. the user's layout with dp rescaled (tp, pp, cp kept, dp = w / (cp·tp·pp));
3. data parallelism only (dp = w), without ``--balance`` if dp is 1.

Any of them continues the same loss curve: the global batch of step k is a function of
(seed, k) alone and checkpoints are layout-free, so the layout changes only the
reduction order (fp64: ~1e-12).
"""
from __future__ import annotations

from dataclasses import fields, replace

from minipar.config import PLANNED, ConfigError, Layout, TrainConfig
from minipar.config.flags import flag_name
from minipar.config.probes import with_data
from minipar.config.sections import value_type

# the fields the supervisor owns and rewrites for every attempt: the planned layout, and
# --balance (refused where dp becomes 1)
LAYOUT_FIELDS = PLANNED + ("balance",)
_SWITCH = {f.name for f in fields(Layout) if value_type(f) is bool}
SWITCHES = tuple(flag_name(name) for name in LAYOUT_FIELDS if name in _SWITCH)
VALUED = tuple(flag_name(name) for name in LAYOUT_FIELDS if name not in _SWITCH) + (
    "--resume", "--log-json", "--hang-timeout")


def parse_train(argv):
    """The TrainConfig of ``train`` arguments (parsed by the trainer's own parser), with
    its data's vocabulary (``probes.with_data``): the planner sizes the head with it."""
    from minipar.cli import build_parser
    return with_data(TrainConfig.from_namespace(build_parser().parse_args(["train", *argv])))


def strip_owned(argv):
    """``argv`` without the flags in VALUED and SWITCHES (also written ``--flag=value``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in SWITCHES or (name in VALUED and "=" in arg):
            continue
        if name in VALUED:
            skip = True
            continue
        out.append(arg)
    return out


def layout_flags(config):
    """A resolved config's layout (``LAYOUT_FIELDS``) as ``train`` flags."""
    flags = []
    for name in LAYOUT_FIELDS:
        value = getattr(config, name)
        if name in _SWITCH:
            flags += [flag_name(name)] if value else []
        elif value is not None:
            flags += [flag_name(name), str(value)]
    return flags


def _resolved(config, world):
    try:
        return config.resolve(world)
    except ConfigError:
        return None


def _planned(config, world):
    """auto_layout's choice, or None when no layout of ``world`` ranks fits (the planner
    says so with ``ConfigError``).  Any other exception is a bug and propagates: falling
    back would hide it behind a layout nobody chose."""
    from minipar.perf.plan import auto_layout
    try:
        chosen, _ = auto_layout(config, world)
        return chosen.resolve(world)
    except ConfigError:
        return None


def layout_for(config, world, use_plan=True):
    """(resolved config, how it was chosen) for ``world`` ranks, or (None, why not)."""
    if use_plan:
        chosen = _planned(config, world)
        if chosen is not None:
            return chosen, "plan (performance model)"
    kept = _resolved(replace(config, dp=None), world)
    if kept is not None:
        return kept, "your layout, dp rescaled"
    dp_only = replace(config, dp=None, cp=1, cp_kind="ring", cp_ulysses=None, tp=1, pp=1,
                      chunks=1, schedule=None, microbatches=None, sequence_parallel=False, ep=1)
    for candidate in (dp_only, replace(dp_only, balance=False), replace(dp_only, balance=False, zero=0)):
        chosen = _resolved(candidate, world)
        if chosen is not None:
            return chosen, "data parallel only"
    try:
        replace(config, dp=None).resolve(world)
    except ConfigError as err:
        return None, str(err)
    return None, "no layout"


def largest_world_size(config, slots, min_np=1, use_plan=True):
    """(w, resolved config, how) for the largest valid w in [min_np, slots], or
    (None, None, why) when there is none."""
    why = f"no slots (min {min_np})"
    for world in range(slots, min_np - 1, -1):
        chosen, how = layout_for(config, world, use_plan)
        if chosen is not None:
            return world, chosen, how
        why = f"{world} ranks: {how}" if world == slots else why
    return None, None, why


def attempt_argv(user_argv, config, log_json, resume, hang_timeout):
    """The ``train`` arguments of one attempt: the user's, with the layout of ``config``,
    this attempt's log, the checkpoint to resume from and the trainer's hang timeout.
    Checked by parsing them back: they must give exactly ``config``'s layout."""
    argv = strip_owned(user_argv) + layout_flags(config) + ["--log-json", log_json,
                                                            "--hang-timeout", str(hang_timeout)]
    argv += ["--resume", resume] if resume else []
    back = replace(parse_train(argv), resume=None).resolve(config.world_size)
    for name in LAYOUT_FIELDS:
        if getattr(back, name) != getattr(config, name):
            raise ConfigError(f"could not rewrite the train flags for `{name}`: "
                              f"{getattr(back, name)!r} instead of {getattr(config, name)!r}")
    return argv
