"""One attempt: ``mpiexec`` of N agents, watched until it ends, and why it ended.

While the job runs, every poll (``POLL`` s) reads the heartbeat directory:

    rank<R>     "<steps done> <unix time>"   written by the trainer after every step
    pid<R>      "<child pid> <agent pid>"    written by the agent (agent.py)
    exit<R>     "<status> <unix time>"       the child's end, recorded by its agent

and ends in one of five ways (``Outcome.kind``):

    done      mpiexec exited 0: training finished
    failed    mpiexec exited non-zero: the ranks whose agents recorded an abnormal end
              (-9: killed by SIGKILL; 3: exited with status 3), else none known
    error     several ranks exited with the same status: the trainer stopped itself on
              every rank (a configuration error, a non-finite loss) — not a rank failure
    hung      some rank, not yet finished, was silent for longer than ``hang_timeout``
              (``startup_timeout`` before its first step).  The supervisor, not the
              trainer, notices first (the trainer's own hang timeout is set longer), and
              names the hung ranks from the process table: stopped (state T, SIGSTOP),
              else behind the others' step, else not using CPU while the others spin in
              MPI's busy-polling waits
    stopped   the supervisor asked for a stop (``interrupt``: the trainer's Ctrl-C, an
              agreed stop that saves the last completed step) — to grow the job

After a failure or a hang, ``kill_all`` stops every process of the attempt — mpiexec,
its proxy, the agents and the ranks, found from mpiexec's process tree and the pid
files — with SIGKILL (which also ends a stopped process), and waits until they are gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from minipar.process import mpiexec_path

POLL = 0.05


def _read(path):
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return None


def proc_stat(pid):
    """(state letter, parent pid, CPU seconds) of ``pid`` from /proc, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()     # after "pid (name) "
    return fields[0], int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid):
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def descendants(pid):
    """Every live process below ``pid`` (from /proc's parent links)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None:
                parent[int(name)] = stat[1]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def _is_ours(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"minipar.elastic" in f.read()
    except OSError:
        return False


@dataclass
class Outcome:
    kind: str                        # done | failed | error | hung | stopped
    failed: dict = field(default_factory=dict)      # rank -> what happened to it
    returncode: int = 0
    steps: dict = field(default_factory=dict)       # rank -> steps done (last heartbeat)
    detected_at: float = 0.0


class Attempt:
    """``mpiexec -n world python -m minipar.elastic.agent ARGS`` with heartbeats in ``hb_dir``."""

    def __init__(self, world, train_argv, hb_dir, end_step, hang_timeout, startup_timeout,
                 mpiexec_args=(), env=None):
        self.world, self.hb_dir, self.end_step = world, hb_dir, end_step
        self.hang_timeout, self.startup_timeout = hang_timeout, startup_timeout
        os.makedirs(hb_dir, exist_ok=True)
        cmd = [mpiexec_path() or "mpiexec", "-n", str(world), *mpiexec_args, sys.executable, "-m",
               "minipar.elastic.agent", *train_argv]
        full_env = dict(os.environ, MINIPAR_HEARTBEAT_DIR=hb_dir, **(env or {}))
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, env=full_env, start_new_session=True)
        self.cpu = {}                # rank -> [(time, cpu seconds)], the last few seconds
        self.interrupted = False

    def beats(self):
        """{rank: (steps done, unix time)} of the ranks that have beaten."""
        out = {}
        for r in range(self.world):
            words = _read(os.path.join(self.hb_dir, f"rank{r}"))
            if words and len(words) == 2:
                out[r] = (int(words[0]), float(words[1]))
        return out

    def pids(self):
        """{rank: (child pid, agent pid)} of the ranks started so far."""
        out = {}
        for r in range(self.world):
            words = _read(os.path.join(self.hb_dir, f"pid{r}"))
            if words and len(words) == 2:
                out[r] = (int(words[0]), int(words[1]))
        return out

    def exits(self):
        """{rank: (status, unix time)} recorded by the agents."""
        out = {}
        for r in range(self.world):
            words = _read(os.path.join(self.hb_dir, f"exit{r}"))
            if words and len(words) == 2:
                out[r] = (int(words[0]), float(words[1]))
        return out

    def poll(self):
        """None while running normally, else the Outcome (the job may still be up: hung)."""
        code = self.proc.poll()
        if code is not None:
            return self._ended(code)
        now, beats = time.time(), self.beats()
        self._sample_cpu(now)
        silent = []
        for r in range(self.world):
            steps, t = beats.get(r, (None, self.started))
            limit = self.startup_timeout if steps is None else self.hang_timeout
            if (steps is None or steps < self.end_step) and now - t > limit:
                silent.append(r)
        if silent:
            return Outcome("hung", self._blame_hang(beats), None,
                           {r: s for r, (s, _) in beats.items()}, now)
        return None

    def _ended(self, code):
        beats = {r: s for r, (s, _) in self.beats().items()}
        if code == 0:
            return Outcome("done", {}, 0, beats, time.time())
        exits = self.exits()
        if self.interrupted and all(s == 130 for s, _ in exits.values()):
            return Outcome("stopped", {}, code, beats, time.time())
        failed = {r: ("killed by signal %d" % -s if s < 0 else f"exited with status {s}")
                  for r, (s, _) in exits.items() if s not in (0, 130)}
        statuses = [s for s, _ in exits.values()]
        if len(statuses) > 1 and len(set(statuses)) == 1 and statuses[0] > 0:
            return Outcome("error", failed, statuses[0], beats, time.time())
        return Outcome("failed", failed, code, beats, time.time())

    def _sample_cpu(self, now):
        for r, (child, _) in self.pids().items():
            stat = proc_stat(child)
            if stat is not None:
                samples = self.cpu.setdefault(r, [])
                samples.append((now, stat[2]))
                while samples and now - samples[0][0] > min(5.0, self.hang_timeout / 2):
                    samples.pop(0)

    def _blame_hang(self, beats):
        """{rank: why} for the ranks that hold the others up (see the module docstring)."""
        pids = self.pids()
        stopped = {r: "hung (stopped: state T)" for r in range(self.world)
                   if r in pids and (proc_stat(pids[r][0]) or ("?",))[0] == "T"}
        if stopped:
            return stopped
        steps = {r: beats.get(r, (-1, 0))[0] for r in range(self.world)}
        if len(set(steps.values())) > 1:
            low = min(steps.values())
            return {r: f"hung (silent, behind at step {low})" for r, s in steps.items() if s == low}
        used = {r: s[-1][1] - s[0][1] for r, s in self.cpu.items() if len(s) > 1}
        if used and max(used.values()) > 0:
            return {r: "hung (silent, no CPU time used)" for r, u in used.items() if u == 0}
        return {}

    def interrupt(self):
        """Ask every rank for Ctrl-C's agreed stop (saves the last completed step)."""
        self.interrupted = True
        for child, _ in self.pids().values():
            try:
                os.kill(child, signal.SIGINT)
            except OSError:
                pass

    def wait(self, timeout):
        """Poll until an Outcome, or None after ``timeout`` seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            outcome = self.poll()
            if outcome is not None:
                return outcome
            time.sleep(POLL)
        return None

    def kill_all(self, timeout=30.0):
        """SIGKILL every process of the attempt and wait until none is left.  Pids from
        the files are checked to still be ours (a pid may be reused once reaped)."""
        ours = {p for pair in self.pids().values() for p in pair if _is_ours(p)}
        victims = ours | (descendants(self.proc.pid) if self.proc.poll() is None else set())
        if self.proc.poll() is None:
            victims.add(self.proc.pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + timeout
        while any(alive(p) for p in victims) and time.time() < deadline:
            time.sleep(POLL)
        left = [p for p in victims if alive(p)]
        if left:
            raise RuntimeError(f"processes {left} of the attempt survived SIGKILL")
