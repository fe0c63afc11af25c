"""The command line's flags, built from the sections' fields: one flag per field.

    n_layer: Optional[int] = setting(None, "transformer blocks ...")
        -> --n-layer N   (type int, default None, that help)
    zero: int = setting(0, "...", choices=(0, 1, 2, 3))
        -> --zero {0,1,2,3}
    sequence_parallel: bool = setting(False, "...")
        -> --sequence-parallel   (store_true)
    overlap: bool = setting(True, "...")
        -> --no-overlap          (store_false into `overlap`: a flag turns a default off)

Each section is a group of ``--help`` (layout, numerics, model, run, output).  The parsed
namespace holds every field under its own name, so ``TrainConfig.from_namespace(args)``
reads it back as is.
"""
from __future__ import annotations

from dataclasses import fields

from minipar.config.outer import Outer
from minipar.config.sections import SECTIONS, value_type

FLAG_SECTIONS = SECTIONS + (Outer,)    # the sections whose fields are flags, in --help's order


def flag_name(field_name):
    """`n_layer` -> --n-layer."""
    return "--" + field_name.replace("_", "-")


def _add_flag(group, f, override):
    meta = f.metadata
    kwargs = dict(help=meta["help"], default=f.default)
    kwargs.update(override)
    if value_type(f) is bool:
        if f.default is True:
            return group.add_argument("--no-" + flag_name(f.name)[2:], dest=f.name,
                                      action="store_false", help=kwargs["help"])
        return group.add_argument(flag_name(f.name), action="store_true", **kwargs)
    return group.add_argument(flag_name(f.name), type=value_type(f), choices=meta["choices"],
                              metavar=meta["metavar"], **kwargs)


def add_field_flags(parser, names):
    """The flags of the fields ``names`` only, for a command that takes a few of train's
    settings (``minipar plan``: the model, the batch, the precision)."""
    by_name = {f.name: f for section in FLAG_SECTIONS for f in fields(section)}
    for name in names:
        _add_flag(parser, by_name[name], {})


def add_config_flags(parser, overrides=None):
    """One flag per field of every section (those with ``flag=False`` left out), in one
    argument group per section; ``overrides``: {field: {"default": ..., "help": ...}} for
    a command whose defaults differ (``profile --steps``).  Returns {section name: group}."""
    overrides = overrides or {}
    groups = {}
    for section in FLAG_SECTIONS:
        group = groups[section.__name__.lower()] = parser.add_argument_group(section.__name__.lower())
        for f in fields(section):
            if f.metadata["flag"]:
                _add_flag(group, f, overrides.get(f.name, {}))
    return groups
