"""The supervisor: attempts, membership changes, re-planning, restarts, one log.

    attempt 1: N ranks, the user's layout
    loop:  watch the attempt (attempt.py) until it ends
           done      -> write the merged log and the goodput; exit 0
           failed / hung
                     -> every process stopped; the failed ranks' slots (or hosts) are
                        gone; the largest valid world size w <= slots left (replan.py),
                        never below --min-np; relaunch from the newest checkpoint
           more slots in the hosts file
                     -> Ctrl-C's agreed stop (a checkpoint of the last step, nothing to
                        redo), then relaunch on more ranks

Because the batch of step k depends on (seed, k) only and checkpoints are layout-free,
the relaunched job continues the *same* loss curve, on any number of ranks.  torchrun's
elastic agent restarts all workers on every membership change too (from the user's own
checkpoint); Horovod elastic keeps the survivors alive and shrinks in process — faster,
but the lost replica's share of the batch changes the data order; here it does not.

Each event is printed and logged: what failed, the new layout, steps redone, seconds lost
= (the end of the checkpoint resumed from) -> (the start of the new attempt's first step):
the work thrown away, the detection, the teardown and the restart.
"""
from __future__ import annotations

import os
import signal
import time

from minipar import checkpoint
from minipar.config import ConfigError
from minipar.elastic import goodput
from minipar.elastic.attempt import POLL, Attempt
from minipar.elastic.log import MergedLog, read_records
from minipar.elastic.membership import Membership
from minipar.elastic.replan import attempt_argv, largest_world_size, layout_flags, parse_train
from minipar.cli_checks import as_flags


class LaunchStopped(Exception):
    """The supervised run cannot go on; the message says why and how to continue."""


def say(text):
    print(f"minipar launch: {text}", flush=True)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def checkpoint_step(directory):
    """The step of the checkpoint ``--resume directory`` finds (only its index is
    read), or None."""
    try:
        return int(checkpoint.open_checkpoint(directory).meta["step"])
    except (OSError, ValueError, KeyError):
        return None


class Supervisor:
    def __init__(self, opts, train_argv):
        self.opts, self.user_argv = opts, list(train_argv)
        self.run_dir = opts.run_dir
        os.makedirs(self.run_dir, exist_ok=True)
        self.save = parse_train(train_argv).save
        if not self.save:                  # restarts need checkpoints: keep them here
            self.save = os.path.join(self.run_dir, "checkpoint")
            self.user_argv += ["--save", self.save]
        self.user = parse_train(self.user_argv)
        self.end = min(self.user.steps, self.user.stop_at or self.user.steps)
        self.members = Membership(opts.np, opts.hosts)
        self.log = MergedLog(self.user.log_json or os.path.join(self.run_dir, "log.json"),
                             {"np": opts.np, "min_np": opts.min_np, "max_restarts": opts.max_restarts,
                              "hang_timeout": opts.hang_timeout, "hosts": opts.hosts})
        self.checkpoints = {}          # step -> (start unix time, seconds), newest attempt wins
        self.started = time.time()
        self.user_stop, self.current, self.grow_requested = False, None, None

    # -- choosing -------------------------------------------------------------------
    def first_layout(self):
        world = min(self.opts.np, self.members.capacity)
        try:
            return world, self.user.resolve(world), "as given"
        except ConfigError as err:
            say(f"your layout does not run on {world} rank(s) ({as_flags(err)}): re-planning")
            return self.replan("first attempt")

    def replan(self, reason):
        slots = min(self.members.capacity, self.opts.np)
        world, config, how = largest_world_size(self.user, slots, self.opts.min_np,
                                                use_plan=not self.opts.no_plan)
        if world is None:
            raise LaunchStopped(f"{reason}: {slots} slot(s) left and no valid layout on "
                                f"{self.opts.min_np} (--min-np) to {slots} ranks ({as_flags(how)}); "
                                f"stopping.{self._continue_hint()}")
        return world, config, how

    def _continue_hint(self):
        step = self.resume_point()[1]
        return (f" The newest checkpoint (step {step}) is in {self.save}: continue with "
                f"--resume {self.save}." if step else "")

    def resume_point(self):
        """(directory, step) to resume from: this run's newest checkpoint, else the user's
        --resume, else (None, 0)."""
        path = checkpoint.latest(self.save)           # committed by this run?
        if path and os.path.getmtime(path) >= self.started:
            step = checkpoint_step(self.save)
            if step is not None:
                return self.save, step
        if self.user.resume:
            return self.user.resume, checkpoint_step(self.user.resume) or 0
        return None, 0

    # -- running --------------------------------------------------------------------
    def run(self):
        world, config, how = self.first_layout()
        restarts, attempt, event = 0, 0, None
        if not self.user.save_every:
            say("no --save-every: a failure restarts from the start (or --resume)")
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        term = signal.signal(signal.SIGTERM, _exit_on_sigterm)   # the attempt is killed first
        try:
            while True:
                attempt += 1
                outcome, att = self.one_attempt(attempt, world, config, how, event)
                if outcome.kind == "done":
                    return self.finish(attempt)
                if outcome.kind == "error":
                    self.finish(attempt, stopped=True)
                    raise LaunchStopped(f"train stopped itself on every rank (exit status "
                                        f"{outcome.returncode}, its message is above): not a "
                                        f"rank failure, so no restart.{self._continue_hint()}")
                if outcome.kind == "stopped" and self.user_stop:
                    self.finish(attempt, stopped=True)
                    raise LaunchStopped(f"interrupted; the checkpoint of step "
                                        f"{self.resume_point()[1]} is in {self.save}")
                if outcome.kind != "stopped":
                    restarts += 1
                event = self.event_of(outcome, att, attempt, world)
                if outcome.kind != "stopped" and restarts > self.opts.max_restarts:
                    self.finish(attempt, stopped=True)
                    raise LaunchStopped(f"{event['what']}: --max-restarts "
                                        f"{self.opts.max_restarts} reached; stopping."
                                        f"{self._continue_hint()}")
                try:
                    world, config, how = self.replan(event["what"])
                except LaunchStopped:
                    self.finish(attempt, stopped=True)
                    raise
                event.update(world_after=world, layout=config.layout_name(), layout_how=how,
                             flags=" ".join(layout_flags(config)))
                self.log.add_event(event)
                say(f"{event['what']} -> {world} rank(s), layout {config.layout_name()} ({how}); "
                    f"resuming at step {event['resume_step']}: {event['steps_redone']} step(s) "
                    f"to redo")
        finally:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, term)

    def one_attempt(self, attempt, world, config, how, event):
        resume, step = self.resume_point()
        hb_dir = os.path.join(self.run_dir, f"attempt-{attempt}")
        log_path = os.path.join(hb_dir, "log.json")
        os.makedirs(hb_dir, exist_ok=True)
        argv = attempt_argv(self.user_argv, config, log_path, resume,
                            2 * self.opts.hang_timeout + 5)   # the supervisor notices first
        env = {"MINIPAR_FAULT": self.opts.fault} if self.opts.fault and attempt == 1 else {}
        say(f"attempt {attempt}: {world} rank(s), layout {config.layout_name()} ({how}), "
            f"from step {step}")
        att = Attempt(world, argv, hb_dir, self.end, self.opts.hang_timeout,
                      self.opts.startup_timeout, self.members.mpiexec_hosts(world), env)
        self.current = att
        try:
            outcome = self.watch(att, world, event)
        finally:
            att.kill_all()
        self.log.add_attempt(attempt, world, log_path)
        self._read_checkpoint_times(hb_dir)
        if event is not None and event.get("seconds_lost") is None:
            self._recovered(att, event, log_path)        # the attempt ended before we saw it
        self.log.write()
        return outcome, att

    def watch(self, att, world, event):
        last_hosts = 0.0
        while True:
            outcome = att.poll()
            if outcome is not None:
                return outcome
            if event is not None and event.get("seconds_lost") is None and att.beats():
                self._recovered(att, event, os.path.join(att.hb_dir, "log.json"))
            if self.opts.hosts and time.time() - last_hosts > self.opts.poll_hosts:
                last_hosts = time.time()
                self._maybe_grow(att, world)
            time.sleep(POLL)

    def _maybe_grow(self, att, world):
        if att.interrupted or not self.members.refresh():
            return
        target, _, _ = largest_world_size(self.user, min(self.members.capacity, self.opts.np),
                                          self.opts.min_np, use_plan=not self.opts.no_plan)
        beats = att.beats()
        if target and target > world and len(beats) == world \
                and max(s for s, _ in beats.values()) < self.end - 1:
            say(f"the hosts file offers {self.members.capacity} slot(s): growing from {world} "
                f"to {target} rank(s) after the next step (a checkpoint, nothing to redo)")
            self.grow_requested = time.time()
            att.interrupt()
        elif target and target > world:
            self.members._stamp = None        # not now (starting or ending): look again

    def _on_sigint(self, signum, frame):
        say("interrupted: asking every rank to save the last completed step and stop")
        self.user_stop = True
        if self.current is not None:
            self.current.interrupt()

    # -- events ---------------------------------------------------------------------
    def event_of(self, outcome, att, attempt, world):
        at_step = max(outcome.steps.values(), default=0)
        if outcome.kind == "stopped":
            kind, what, removed = "scale_up", f"hosts file grew at step {at_step}", []
            t_ref = self.grow_requested or outcome.detected_at
        else:
            kind = "hang" if outcome.kind == "hung" else "failure"
            if outcome.failed:
                what = "; ".join(f"rank {r} {how}" for r, how in sorted(outcome.failed.items()))
            else:
                what = (f"attempt {attempt} failed (mpiexec status {outcome.returncode}), "
                        "no rank identified" if kind == "failure" else "a rank hung, none identified")
            removed = self.members.fail(sorted(outcome.failed), world)
            if not outcome.failed and self.members.hosts_file:   # a whole node may be gone
                removed = self.members.exclude(self.members.unreachable(world))
            if removed:
                what += f" (host {', '.join(removed)} removed)"
            t_ref = None
        _, resume_step = self.resume_point()
        if t_ref is None:        # the end of the checkpoint resumed from, else the attempt's start
            t0, secs = self.checkpoints.get(resume_step, (att.started, 0.0))
            t_ref = t0 + secs if resume_step else att.started
        return {"kind": kind, "attempt": attempt, "time": outcome.detected_at, "what": what,
                "ranks": [{"rank": r, "how": h} for r, h in sorted(outcome.failed.items())],
                "hosts_removed": removed, "world_before": world, "failed_at_step": at_step,
                "resume_step": resume_step, "steps_redone": max(at_step - resume_step, 0),
                "since_checkpoint_s": outcome.detected_at - t_ref, "seconds_lost": None, "_t_ref": t_ref}

    def _recovered(self, att, event, log_path):
        beats = att.beats()
        if not beats:
            return
        first = min(t for _, t in beats.values())
        _, steps, _ = read_records(log_path)
        step_time = steps[0].get("step_time_s", 0.0) if steps else 0.0
        event["seconds_lost"] = (first - step_time) - event.pop("_t_ref")
        say(f"recovered: attempt {event['attempt'] + 1} is training; {event['seconds_lost']:.2f} s "
            f"lost ({event['steps_redone']} step(s) redone)")

    def _read_checkpoint_times(self, hb_dir):
        try:
            with open(os.path.join(hb_dir, "checkpoints")) as f:
                for line in f:
                    words = line.split()
                    if len(words) == 3:
                        self.checkpoints[int(words[0])] = (float(words[1]), float(words[2]))
        except OSError:
            pass

    def finish(self, attempts, stopped=False):
        wall = time.time() - self.started
        for e in self.log.events:
            e.pop("_t_ref", None)
        steps = [self.log.steps[k] for k in sorted(self.log.steps)]
        g = goodput.summary(steps, self.log.events, list(self.checkpoints.values()), wall,
                            self.opts.mtbf)
        self.log.write({"steps": len(steps), "wall_s": wall, "attempts": attempts,
                        "stopped": stopped, "goodput": g})
        say(goodput.format_summary(g).replace("\n", "\nminipar launch: "))
        say(f"merged log: {self.log.path}")
        return 0
