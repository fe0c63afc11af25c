"""Faults you can ask for, to see what the system does with them (tests and lessons).

They are hooks, attached from outside to what they disturb: nothing in the step, the
pipeline engine or the checkpoint writer calls them by name.  A run (``train/loop.py``)
registers the step's (``register``) and hands ``PendingSave`` the save's (``save_fault``
for its rank and step, ``train/saving.py``).  It takes them from its environment:

    MINIPAR_INJECT_FAILURE="R:K"   world rank R raises at step K: one rank's exception
                                   must end the whole job (``inject_failure``)
    MINIPAR_SLOW_RANK="R:F"        world rank R computes F times slower: after each piece
                                   of compute it sleeps (F-1)× its duration (``straggle``) —
                                   a straggler for load balancing and pipeline traces
    MINIPAR_SAVE_FAULT="R:K:WHERE" world rank R kills itself (SIGKILL, as kill -9) inside the
                                   save of step K's checkpoint, at WHERE: "file" (half its
                                   file written), "report" (written, before agreeing), or
                                   rank 0's "commit" (before the rename) / "latest" (renamed,
                                   ``latest`` not yet replaced) — ``save_fault``; WHERE
                                   "enospc": its file write fails (a full disk) instead
    MINIPAR_SAVE_SLOW_S="S"        every rank sleeps S seconds half way through writing its
                                   checkpoint file (a slow disk: async saves, kill tests)
"""
from __future__ import annotations

import errno
import os
import signal
import time


def inject_failure(step, rank):
    """Raise on the rank and step MINIPAR_INJECT_FAILURE names."""
    spec = os.environ.get("MINIPAR_INJECT_FAILURE")
    if spec and tuple(int(v) for v in spec.split(":")) == (rank, step):
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")


def slow_rank_factor(rank):
    """F from MINIPAR_SLOW_RANK="R:F" when R is this rank, else 1."""
    spec = os.environ.get("MINIPAR_SLOW_RANK", "")
    if not spec:
        return 1.0
    r, f = spec.split(":")
    return float(f) if int(r) == rank else 1.0


def straggle(rank, seconds):
    """Sleep (F-1)·seconds on the rank MINIPAR_SLOW_RANK names (no-op elsewhere)."""
    factor = slow_rank_factor(rank)
    if factor > 1:
        time.sleep((factor - 1) * seconds)


def register(hooks, rank):
    """Add the faults this process's environment asks for to ``hooks`` (a ``StepHooks``):
    MINIPAR_INJECT_FAILURE before a step, MINIPAR_SLOW_RANK after each piece of compute."""
    if os.environ.get("MINIPAR_INJECT_FAILURE"):
        hooks.before_step.append(lambda step: inject_failure(step, rank))
    if slow_rank_factor(rank) > 1:
        hooks.after_compute.append(lambda seconds: straggle(rank, seconds))


def save_fault(where, rank, step):
    """Die like kill -9 where MINIPAR_SAVE_FAULT says; sleep where MINIPAR_SAVE_SLOW_S says."""
    if where == "file" and os.environ.get("MINIPAR_SAVE_SLOW_S"):
        time.sleep(float(os.environ["MINIPAR_SAVE_SLOW_S"]))
    spec = os.environ.get("MINIPAR_SAVE_FAULT")
    if spec:
        r, k, at = spec.split(":")
        if (int(r), int(k)) == (rank, step) and where == "file" and at == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        if (int(r), int(k), at) == (rank, step, where):
            os.kill(os.getpid(), signal.SIGKILL)
