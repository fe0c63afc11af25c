"""The checks every command shares, in flags: a number in its range, an input file, an
output path.  Each raises ``CommandError`` with one line; ``python -m minipar`` prints it
as ``minipar COMMAND: <line>`` and exits 2 — no traceback, nothing done before it.

    at_least("--ranks", args.ranks, 1)          --ranks must be >= 1, got 0
    positive("--budget", args.budget)           --budget must be a finite number > 0, got nan
    input_file("LOG", path)                     LOG missing.json: no such file
    output_file("--json", path)                 --json /proc/x.json: its folder /proc does not exist
    output_dir("--out", path)                   --out /etc: cannot write there: Permission denied

The commands call them first, before any measurement, drawing or launch.
"""
from __future__ import annotations

import argparse
import math
import re

from minipar.paths import PathError, probe_output_dir, probe_output_file, require_input_file


class CommandError(ValueError):
    """A bad flag or input of a command; the message is one line in the user's flags."""


def as_flags(message):
    """`field_name` -> --field-name, in a library message."""
    return re.sub(r"`([a-z0-9_]+)`", lambda m: "--" + m.group(1).replace("_", "-"), str(message))


def at_least(flag, value, low):
    if value is not None and value < low:
        raise CommandError(f"{flag} must be >= {low}, got {value}")


def positive(flag, value):
    """A float flag that must be a finite number > 0 (nan, inf, 0 and below refused)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise CommandError(f"{flag} must be a finite number > 0, got {value}")


def _probed(flag, path, probe, *args):
    """``probe(path, *args)``, its PathError said as one line that names the flag."""
    try:
        probe(path, *args)
    except PathError as err:
        raise CommandError(f"{flag} {path}: {err}") from None


def input_file(flag, path):
    _probed(flag, path, require_input_file)


def output_file(flag, path, need_bytes=0):
    if path is not None:
        _probed(flag, path, probe_output_file, need_bytes)


def output_dir(flag, path, need_bytes=0):
    if path is not None:
        _probed(flag, path, probe_output_dir, need_bytes)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a flag it cannot parse (``--ranks x``, an unknown choice) is one line
    too, like every other refusal: ``PROG: argument --ranks: invalid int value: 'x'
    (--help lists the flags)``, exit 2.  ``--help`` itself is unchanged."""

    def error(self, message):
        prog = self.prog.replace("python -m ", "", 1)
        self.exit(2, f"{prog}: {message} (--help lists the flags)\n")
