"""A progress bar on a terminal, one line every few seconds in a log file.

tqdm redraws one line with carriage returns: right on a terminal, a mess in a file
(``train ... > run.log``) where every redraw is kept.  ``progress(...)`` gives tqdm when
the output is a terminal and otherwise a ``LineProgress`` with the same small interface
(``update``, ``set_postfix_str``, ``close``) that prints a whole line at most every
``every_s`` seconds, plus one at the end.
"""
from __future__ import annotations

import sys
import time

EVERY_S = 5.0


def is_terminal(out):
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


class LineProgress:
    def __init__(self, total=None, initial=0, desc="", unit="it", file=None, every_s=EVERY_S):
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.out = file or sys.stdout
        self.every_s, self.postfix = every_s, ""
        self.t0 = self.last = time.monotonic()
        self.start_n = initial

    def set_postfix_str(self, text):
        self.postfix = text

    def update(self, n=1):
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._line(now)

    def _line(self, now):
        elapsed = now - self.t0
        rate = (self.n - self.start_n) / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total:,}" if self.total else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        post = f" | {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n:,}{of} {self.unit}{pct} | {elapsed:.0f} s, "
              f"{rate:,.1f} {self.unit}/s{post}", file=self.out, flush=True)

    def close(self):
        self._line(time.monotonic())


def progress(total=None, initial=0, desc="", unit="it", file=None, unit_scale=False):
    """tqdm on a terminal, ``LineProgress`` elsewhere."""
    out = file or sys.stdout
    if is_terminal(out):
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=out,
                    unit_scale=unit_scale)
    return LineProgress(total, initial, desc, unit, out)
