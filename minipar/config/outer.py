"""The sixth section of a run's configuration: training across a slow link (DiLoCo).

    --outer diloco --inner-steps H --diloco-groups G [--outer-lr 0.7] [--outer-momentum 0.9]

The data-parallel ranks form G groups; each trains alone for H inner steps (AdamW, any
inner layout), then the groups average their pseudo-gradients across the slow link and
take one outer Nesterov step (``minipar/parallel/outer``).  The defaults are the DiLoCo
paper's (outer lr 0.7, momentum 0.9); H = 50 is chosen for the default run of 1,500
steps: 30 outer steps, 50× fewer bytes across the link than data parallelism.

The section checks its own fields (``Outer.check``); the rules that involve the layout
(G divides dp, fragments <= layers, no ``balance``) are in ``rules.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minipar.config.error import ConfigError
from minipar.config.sections import (_at_least, _default, _finite_positive, _one_of,
                                     _whole_numbers, setting)

DEFAULT_INNER_STEPS = 50


@dataclass(frozen=True)
class Outer:
    """DiLoCo: groups of data-parallel ranks that synchronise every H inner steps."""
    outer: str = setting("none", "none (every step synchronised: data parallelism) or diloco "
                         "(groups train alone for --inner-steps, then one outer step)",
                         choices=("none", "diloco"))
    inner_steps: int = setting(DEFAULT_INNER_STEPS, "diloco: inner steps H between outer steps "
                               "(default %(default)s)")
    outer_lr: float = setting(0.7, "diloco: the outer SGD's learning rate (default %(default)s)")
    outer_momentum: float = setting(0.9, "diloco: the outer SGD's Nesterov momentum "
                                    "(default %(default)s; 0: plain SGD)")
    diloco_groups: int = setting(2, "diloco: groups G carved from the data-parallel ranks "
                                 "(G divides dp; on a cluster, one per node; default %(default)s)")
    diloco_fragments: int = setting(1, "diloco: fragments F of the model synchronised at "
                                    "staggered inner steps (streaming DiLoCo; default %(default)s)")
    outer_delay: int = setting(1, "streaming diloco: inner steps tau a fragment's all-reduce "
                               "overlaps before it is applied (default %(default)s)")
    outer_mixing: float = setting(0.5, "streaming diloco: alpha, the share of a group's own "
                                  "fragment kept when the late outer result is merged "
                                  "(default %(default)s)")
    outer_compression: str = setting("none", "diloco: compress the outer all-reduce (error "
                                     "feedback)", choices=("none", "fp16", "bf16", "int8"))

    def check(self):
        """The section's own fields, alone and with each other."""
        _whole_numbers(self, Outer)
        _one_of(self, Outer, "outer", "outer_compression")
        if self.outer == "none":
            changed = [f for f in ("inner_steps", "outer_lr", "outer_momentum", "diloco_groups",
                                   "diloco_fragments", "outer_delay", "outer_mixing",
                                   "outer_compression")
                       if getattr(self, f) != _default(Outer, f)]
            if changed:
                raise ConfigError(f"`{changed[0]}` belongs to DiLoCo; add `outer` diloco")
            return
        _at_least(self, 1, "inner_steps", "diloco_groups", "diloco_fragments")
        _at_least(self, 0, "outer_delay")
        _finite_positive(self, "outer_lr")
        if not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"`outer_momentum` must be in [0, 1), got {self.outer_momentum}")
        if not 0 <= self.outer_mixing <= 1:
            raise ConfigError(f"`outer_mixing` must be in [0, 1], got {self.outer_mixing}")
        if self.diloco_fragments == 1 and (self.outer_delay != _default(Outer, "outer_delay") or
                                           self.outer_mixing != _default(Outer, "outer_mixing")):
            raise ConfigError("`outer_delay` and `outer_mixing` belong to streaming DiLoCo; "
                              "set `diloco_fragments` F (F >= 2)")
        if self.diloco_fragments > self.inner_steps:
            raise ConfigError(f"`diloco_fragments` {self.diloco_fragments} must be at most "
                              f"`inner_steps` {self.inner_steps}: fragment f is sent after inner "
                              "step ⌊(f+1)·H/F⌋ of every H")
        if self.diloco_fragments > 1 and not self.outer_delay < self.inner_steps // self.diloco_fragments:
            raise ConfigError(f"`outer_delay` {self.outer_delay} must be below ⌊H/F⌋ = "
                              f"{self.inner_steps // self.diloco_fragments}: a fragment's result "
                              "must land before the next fragment is sent")


def check_outer_layout(config, dp, n_layer):
    """The rules of the Outer section against the layout and the run (``rules.py`` calls
    it with the resolved dp): G divides dp, fragments <= layers, and what DiLoCo is not
    built to run with."""
    c = config
    if c.outer == "none":
        return
    G = c.diloco_groups
    if dp % G:
        raise ConfigError(f"`diloco_groups` {G} must divide the data-parallel size dp = {dp} "
                          "(each group is dp/G of the data-parallel replicas)")
    if c.diloco_fragments > n_layer:
        raise ConfigError(f"`diloco_fragments` {c.diloco_fragments} is more than the model's "
                          f"{n_layer} layers (a fragment is a run of whole blocks)")
    if c.balance:
        raise ConfigError("`outer` diloco with `balance` is not supported: each group trains on "
                          "its own share of the batch; balancing would move rows between groups")
    if c.precision == "fp16":
        raise ConfigError("`outer` diloco with `precision` fp16 is not supported: the loss "
                          "scaler agrees on overflow over every rank each step, which would "
                          "cross the slow link; use bf16")
    if getattr(c, "ep", 1) > 1:
        raise ConfigError("`outer` diloco with `ep` > 1 is not built yet")
    checkpoints = c.stop_at is not None or c.save_every or c.save or c.resume
    if checkpoints and (c.diloco_fragments > 1 or c.outer_compression != "none"):
        raise ConfigError("checkpoints (`save`, `save_every`, `stop_at`, `resume`) of streaming "
                          "DiLoCo (`diloco_fragments` > 1) or `outer_compression` are not built "
                          "yet: their fragments in flight and error feedback are not saved")
    H = c.inner_steps
    if c.save_every and c.save_every % H:
        raise ConfigError(f"`save_every` {c.save_every} must be a multiple of `inner_steps` {H}: "
                          "a DiLoCo checkpoint is written at an outer step")
    if c.stop_at is not None and c.stop_at % H and c.stop_at != c.steps:
        raise ConfigError(f"`stop_at` {c.stop_at} must be a multiple of `inner_steps` {H}: "
                          "a DiLoCo checkpoint is written at an outer step")


def check_outer_resume(config, step):
    """A DiLoCo run resumes at one of its outer steps (``load_resume``, once the
    checkpoint's step is read)."""
    if config.outer == "diloco" and step % config.inner_steps and step != config.steps:
        raise ConfigError(f"`resume` {config.resume} is at step {step}, not a multiple of "
                          f"`inner_steps` {config.inner_steps}: DiLoCo resumes at an outer step")
