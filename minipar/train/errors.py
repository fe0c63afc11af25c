"""How a run stops early: one line, the same on every rank, and an exit code.

Every stop below is *agreed*: all ranks reach it at the same step with the same
message (the loss and the gradient norm are global; a checkpoint write's outcome is
broadcast from the writer; an interrupt is OR-ed over the ranks once per step), so
all of them exit normally and the launcher never has to kill a rank that is still
waiting for a peer.  The command line prints the message once, on rank 0.
"""
from __future__ import annotations


class TrainingStopped(Exception):
    """The run ended early; ``str(err)`` is the line to print, ``code`` the exit status."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


class Interrupt:
    """SIGINT (Ctrl-C) as a flag the loop looks at between steps, instead of a
    KeyboardInterrupt raised wherever the rank happens to be (mid-collective).
    A second Ctrl-C stops at once, without a checkpoint."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame):
        if self.requested:
            import os
            import sys
            sys.stderr.write("minipar train: interrupted again: stopping now, no checkpoint\n")
            sys.stderr.flush()
            os._exit(130)
        self.requested = True

    def __enter__(self):
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        import signal
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
