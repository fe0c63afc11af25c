"""``TrainConfig``: everything a training run is, frozen, declared once, checked once.

    config = TrainConfig(tp=2, pp=2, microbatches=4, precision="fp64")   # from Python
    config = preflight(config)                 # IMPURE: the data's vocabulary, paths probed
    config = config.resolve(world_size=8)      # pure: every check, dp and defaults filled in
    train(config)                              # (or just train(TrainConfig(...)): it does both)

The package, one idea per module:

    sections.py    the five sections (layout, numerics, model, run, output): each field's
                   default, flag help and choices, and each section's own ``check()``
    rules.py       the rules across sections, and ``resolve(config, world_size)``
    probes.py      ``preflight(config)``, the I/O probes (impure): the data, the resume
                   checkpoint, the output paths
    flags.py       the command line's flags, generated from the fields
    error.py       ``ConfigError``, the one error all of them raise

``TrainConfig`` is one flat frozen dataclass that inherits the five sections, so each
field is written once (in its section) and read flat: ``config.tp``, ``config.lr``.
Errors speak in the field names, written `like_this`; the command line turns them into
flags (`n_head` -> --n-head).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from minipar.config.error import ConfigError
from minipar.config.probes import preflight
from minipar.config.rules import resolve
from minipar.config.outer import Outer
from minipar.config.sections import PLANNED, SECTIONS, Layout, Model, Numerics, Output, Run


@dataclass(frozen=True)
class TrainConfig(Outer, Output, Run, Model, Numerics, Layout):
    """The sections as one frozen config; its fields in the order layout, numerics,
    model, run, output, outer (a dataclass lists its bases' fields from the last base on)."""

    @classmethod
    def from_namespace(cls, ns):
        """From an argparse namespace (or any object) with these attribute names."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})

    def to_dict(self):
        return asdict(self)

    def check(self):
        """Each section's own checks (pure, no world size); ``resolve`` runs them first."""
        for section in SECTIONS + (Outer,):
            section.check(self)

    def resolve(self, world_size):
        """Checked, with every default that depends on the layout filled in (``rules.py``)."""
        return resolve(self, world_size)

    def model_config(self):
        """The GPTConfig: the model section with the numerics' attention and padding."""
        return self.gpt_config(attention=self.attention, pad_vocab_to=self.vocab_multiple())

    def vocab_multiple(self):
        """What the vocabulary is padded to a multiple of: ``pad_vocab_to``, else 64 where
        the head's GEMM runs on a GPU (its tensor-core tiles; GPT-2's 50257 -> 50304) and
        1 on NumPy, where padding would only add work and change nothing else."""
        if self.pad_vocab_to is not None:
            return self.pad_vocab_to
        from minipar.backend import backend_name
        return 64 if (self.backend or backend_name()) == "cupy" else 1

    def layout_name(self):
        """A short name of the layout, e.g. "dp2·tp2·pp2 zero1 sp" or "single"."""
        parts = [f"{k}{v}" for k, v in (("dp", self.dp), ("cp", self.cp), ("tp", self.tp),
                                        ("pp", self.pp), ("ep", self.ep)) if v and v > 1]
        name = "·".join(parts) or "single"
        ulysses = self.cp_ulysses or self.cp
        extras = [f"ulysses{ulysses}" if self.cp > 1 and self.cp_kind == "ulysses" else "",
                  f"chunks{self.chunks}" if self.chunks > 1 else "",
                  self.schedule if self.pipelined and self.schedule else "",
                  f"zero{self.zero}" if self.zero else "", "sp" if self.sequence_parallel else "",
                  f"recompute-{self.recompute}" if self.recompute != "none" else "",
                  f"accum{self.grad_accum}" if self.grad_accum > 1 else ""]
        return " ".join([name] + [e for e in extras if e])

    def planned_layout(self):
        """{field: value} of the fields a planner chooses (``sections.PLANNED``)."""
        return {name: getattr(self, name) for name in PLANNED}

    def with_default_layout(self):
        """This config with every planned field at its default: one rank of everything,
        the starting point a planner fills in."""
        defaults = {f.name: f.default for f in fields(Layout) if f.name in PLANNED}
        return replace(self, **defaults)

    @property
    def world_size(self):
        return (self.dp or 1) * self.cp * self.tp * self.pp


def prepare(config, world_size, choose_layout=None):
    """The config a run starts from, in the order that costs least when it is refused:
    each section's checks (pure, cheap: a typo stops before the data is built), the
    probes (``preflight``), the layout chosen when asked (``choose_layout(config)``:
    ``--layout auto``), and ``resolve`` — once.  Raises ConfigError."""
    config.check()
    config = preflight(config)
    if choose_layout is not None:
        config = choose_layout(config)
    return config.resolve(world_size)


__all__ = ["TrainConfig", "ConfigError", "prepare", "preflight", "resolve", "PLANNED",
           "Layout", "Numerics", "Model", "Run", "Output", "Outer"]
