"""Reading the JSON log a run writes (``train --log-json``, written by ``monitor.py``; every
key is described in ``docs/log-format.md``): the header, the step records, the events of an
elastic launch, the final summary."""
from __future__ import annotations

import json


def read_log_events(path, skip_bad_lines=False):
    """(header, step records, event records, final) of a ``--log-json`` file, or of the
    merged log of ``minipar launch`` (which adds ``{"event": ...}`` lines).
    ``skip_bad_lines``: pass over a line cut off mid-write (a rank killed while logging)."""
    header, steps, events, final = None, [], [], None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as err:
                if skip_bad_lines:
                    continue
                raise ValueError(f"line {number} is not a log record: {err}") from None
            if "header" in rec:
                header = rec["header"]
            elif "final" in rec:
                final = rec["final"]
            elif "event" in rec:
                events.append(rec["event"])
            elif "step" in rec:
                steps.append(rec)
    return header, steps, events, final


def read_log(path):
    """(header, step records, final) of a ``--log-json`` file (header/final may be None)."""
    header, steps, _, final = read_log_events(path)
    return header, steps, final


def step_records(path):
    """The per-step records of a log, in order (what most readers want)."""
    return read_log(path)[1]
