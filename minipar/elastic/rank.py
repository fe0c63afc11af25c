"""One training rank under ``minipar launch``: ``python -m minipar.elastic.rank TRAIN-ARGS``.

The agent (``agent.py``) starts this as its child.  It runs ``python -m minipar train``
in this process, with two instruments around the trainer's own per-step heartbeat:

* **checkpoint timing** — every ``save_checkpoint`` is timed and world rank 0 appends
  ``"<step> <start unix time> <seconds>"`` to ``$MINIPAR_HEARTBEAT_DIR/checkpoints``:
  the measured checkpoint cost C that the goodput model (``goodput.py``) needs;
* **fault injection**, for tests and lesson 15 — ``MINIPAR_FAULT="RANK:STEP:KIND"``
  (the supervisor passes it to its first attempt only, from ``launch --fault``): right
  after rank RANK has finished step STEP (its heartbeat says STEP),

      kill    SIGKILL itself           (a crashed node: no message, no cleanup)
      stop    SIGSTOP itself           (a hang: alive, silent, holding its peers)
      exit    exit with status 3       (a process that gives up)
      hold    wait for SIGINT, then go on  (a stalled rank, for the scale-up demo:
              the supervisor's Ctrl-C, sent when the job grows, releases it)

  Injecting at a step boundary makes a test deterministic: the fault happens at a known
  step whatever the machine's speed.
"""
from __future__ import annotations

import os
import signal
import sys
import time

KINDS = ("kill", "stop", "exit", "hold")


def parse_fault(spec):
    """"RANK:STEP:KIND" -> (rank, step, kind); ValueError with the format otherwise."""
    try:
        rank, step, kind = spec.split(":")
        rank, step = int(rank), int(step)
    except ValueError:
        raise ValueError(f"fault {spec!r}: expected RANK:STEP:KIND, e.g. 1:6:kill") from None
    if kind not in KINDS or rank < 0 or step < 1:
        raise ValueError(f"fault {spec!r}: KIND is one of {', '.join(KINDS)}, RANK >= 0, STEP >= 1")
    return rank, step, kind


def _hold(timeout=600.0):
    """Stall until SIGINT arrives, then hand the signal to the trainer's own handler
    (its Ctrl-C: an agreed stop with a checkpoint)."""
    arrived = []
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        arrived.append(signum)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    deadline = time.monotonic() + timeout
    while not arrived and time.monotonic() < deadline:
        time.sleep(0.02)
    signal.signal(signal.SIGINT, previous)


def inject(kind):
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "exit":
        sys.stderr.write("minipar launch: injected fault: this rank exits with status 3\n")
        sys.stderr.flush()
        os._exit(3)
    else:
        _hold()


def install(loop_module, directory, fault=None):
    """Wrap the trainer's heartbeat (faults) and checkpoint writer (timing) in place."""
    beat, save = getattr(loop_module, "_beat", None), getattr(loop_module, "save_checkpoint", None)
    if fault and beat is not None:
        f_rank, f_step, kind = parse_fault(fault)

        def beat_then_fault(directory_, rank, step):
            beat(directory_, rank, step)
            if rank == f_rank and step + 1 == f_step:
                inject(kind)
        loop_module._beat = beat_then_fault
    if save is not None:
        def timed_save(run, step):
            t0 = time.time()
            save(run, step)
            if run.grid.rank == 0:
                with open(os.path.join(directory, "checkpoints"), "a") as f:
                    f.write(f"{step} {t0:.6f} {time.time() - t0:.6f}\n")
        loop_module.save_checkpoint = timed_save


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    directory = os.environ.get("MINIPAR_HEARTBEAT_DIR")
    if directory:
        import minipar.train.loop as loop_module
        install(loop_module, directory, os.environ.get("MINIPAR_FAULT"))
    from minipar.cli import main as minipar_main
    return minipar_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
