"""One log for the whole supervised run, merged from the attempts' own ``--log-json`` files.

Every attempt writes its own log (``attempt-K/log.json``).  The merged log, written to
the user's ``--log-json`` after every attempt (to a temporary name, then renamed), is

    {"header": {...}}         the first attempt's header, plus "elastic": the launch settings
    {"step": ...}             every step once, in order: a step redone by a later attempt
                              replaces its first record; each carries "attempt" and
                              "world_size"
    {"event": {...}}          one per membership change (a failure, a hang, a scale-up),
                              just before the first step of the attempt it started
    {"final": {...}}          the last attempt's final record, with the whole run's "steps"
                              and "wall_s", and "goodput" (goodput.py)

so ``report`` draws one curve for the run and marks the events on it.  A killed rank 0
may leave half a line at the end of its attempt's log: lines that do not parse are
skipped (that step is redone anyway, being after the checkpoint).
"""
from __future__ import annotations

import json
import os


def read_records(path):
    """(header, [step records], final) of one attempt's log; a missing file is empty, and a
    line cut off by a killed rank is passed over."""
    from minipar.observe.runlog import read_log_events
    try:
        header, steps, _, final = read_log_events(path, skip_bad_lines=True)
    except OSError:
        return None, [], None
    return header, steps, final


def read_merged(path):
    """(header, steps, events, final) of a merged log."""
    from minipar.observe.runlog import read_log_events
    return read_log_events(path)


def _public(event):
    return {k: v for k, v in event.items() if not k.startswith("_")}


class MergedLog:
    """Steps by number (later attempts win), events in order, written on ``write``."""

    def __init__(self, path, settings):
        self.path, self.settings = path, settings
        self.header, self.final = None, None
        self.steps, self.events = {}, []

    def add_attempt(self, attempt, world, log_path):
        header, steps, final = read_records(log_path)
        if self.header is None and header is not None:
            self.header = dict(header, elastic=self.settings)
        for rec in steps:
            self.steps[rec["step"]] = dict(rec, attempt=attempt, world_size=world)
        if final is not None:
            self.final = final
        return steps

    def add_event(self, event):
        self.events.append(event)      # a dict, updated in place until written

    def records(self):
        """Header, then steps in order with each event before the step it resumed at."""
        out = [{"header": self.header or {"elastic": self.settings}}]
        events = sorted(self.events, key=lambda e: e.get("resume_step", 0))
        for step in sorted(self.steps):
            while events and events[0].get("resume_step", 0) <= step:
                out.append({"event": _public(events.pop(0))})
            out.append(self.steps[step])
        out += [{"event": _public(e)} for e in events]
        return out

    def write(self, final_extra=None):
        if not self.path:
            return
        records = self.records()
        if final_extra is not None:
            records.append({"final": dict(self.final or {}, **final_extra)})
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, self.path)
