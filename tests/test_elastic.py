"""The elastic supervisor end to end: a rank of 4 killed or hung, a job below --min-np,
a failed host removed, a job grown from 2 to 4 ranks — every time the merged log holds
every step once and its fp64 losses are those of one uninterrupted process, and no
process of the run is left.

Faults are injected at a step boundary (``launch --fault RANK:STEP:KIND``, first attempt
only), so each test does the same thing whatever the machine's speed; the only waits
are bounded polls.  Every run has a timeout, and whatever happens its processes are
killed (helpers below)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from minipar.elastic.log import read_merged
from minipar.observe.runlog import step_records
from tests.mpirun import REPO

TINY = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "4", "--seq-len",
        "8", "--precision", "fp64", "--batch-size", "8", "--quiet", "--eval-batches", "0"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
           PYTHONPATH=REPO)
STEPS = 12
def processes_naming(text):
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmd and state not in ("Z", "X"):
            found.append(int(name))
    return found


def kill_leftovers(run_dir):
    for pid in processes_naming(str(run_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def start(run_dir, launch_flags, train_flags, steps=STEPS):
    cmd = [sys.executable, "-m", "minipar.elastic", "--run-dir", str(run_dir), *launch_flags,
           "--", "train", *TINY, "--steps", str(steps), "--log-json", str(run_dir / "merged.json"),
           *train_flags]
    return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc, run_dir, timeout=150):
    """(exit status, output) of a started supervisor; nothing of it left running."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"launch did not finish in {timeout} s:\n{out[-4000:]}")
    finally:
        kill_leftovers(run_dir)
    return proc.returncode, out


def launch(run_dir, launch_flags, train_flags=("--save-every", "4"), steps=STEPS, timeout=150):
    return finish(start(run_dir, launch_flags, list(train_flags), steps), run_dir, timeout)


def wait_for_step(path, step, timeout=60):
    """Wait until the heartbeat file ``path`` says at least ``step`` steps are done."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                if int(f.read().split()[0]) >= step:
                    return
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach step {step} in {timeout} s")


def assert_nothing_left(run_dir):
    """No process of the run is alive: none names its folder, every recorded pid is gone."""
    assert processes_naming(str(run_dir)) == []
    for attempt in sorted(run_dir.glob("attempt-*")):
        for pidfile in attempt.glob("pid*"):
            for pid in map(int, pidfile.read_text().split()):
                assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read() \
                    .rsplit(")", 1)[1].split()[0] in ("Z", "X"), f"{pidfile}: {pid} alive"


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """The per-step losses of one process, never interrupted."""
    log = tmp_path_factory.mktemp("oracle") / "single.json"
    subprocess.run([sys.executable, "-m", "minipar", "train", *TINY, "--steps", str(STEPS),
                    "--log-json", str(log)], cwd=REPO, env=ENV, check=True, timeout=120,
                   capture_output=True)
    return [r["loss"] for r in step_records(log)]


def merged(run_dir):
    return read_merged(run_dir / "merged.json")


def assert_same_curve(steps, oracle):
    """Every step once, in order, with the uninterrupted run's loss (fp64, 1e-9)."""
    assert [r["step"] for r in steps] == list(range(STEPS))
    np.testing.assert_allclose([r["loss"] for r in steps], oracle, rtol=1e-9, atol=0)


def test_sigkill_of_one_rank_of_four_shrinks_to_two_on_the_same_curve(tmp_path, oracle):
    """Rank 1 SIGKILLed after step 6 (checkpoints every 4): 3 slots left, batch 8 and 4
    heads allow 2 ranks; steps 4-5 are redone by attempt 2 and replace their records."""
    code, out = launch(tmp_path, ["--np", "4", "--hang-timeout", "20", "--fault", "1:6:kill"])
    assert code == 0, out
    header, steps, events, final = merged(tmp_path)
    assert_same_curve(steps, oracle)
    (event,) = events
    assert event["kind"] == "failure" and event["ranks"] == [{"rank": 1, "how": "killed by signal 9"}]
    assert (event["world_before"], event["world_after"]) == (4, 2)
    assert (event["failed_at_step"], event["resume_step"], event["steps_redone"]) == (6, 4, 2)
    assert event["seconds_lost"] > 0 and "rank 1 killed by signal 9" in out
    assert [r["world_size"] for r in steps] == [4] * 4 + [2] * 8
    g = final["goodput"]
    assert g["failures"] == 1 and g["steps_redone"] == 2 and g["checkpoint_s"] > 0
    assert g["young_daly_interval_s"] == pytest.approx(np.sqrt(2 * g["checkpoint_s"] * g["mtbf_s"]))
    assert final["steps"] == STEPS and header["elastic"]["np"] == 4
    assert_nothing_left(tmp_path)


def test_a_stopped_rank_is_a_hang_named_from_the_process_table(tmp_path, oracle):
    """Rank 2 SIGSTOPped after step 5: its peers wait in the next all-reduce, every
    heartbeat goes silent; after --hang-timeout the supervisor names rank 2 (state T),
    kills every process (a stopped one too) and continues on 2 ranks."""
    code, out = launch(tmp_path, ["--np", "4", "--hang-timeout", "3", "--fault", "2:5:stop",
                                  "--no-plan"])
    assert code == 0, out
    _, steps, events, _ = merged(tmp_path)
    assert_same_curve(steps, oracle)
    (event,) = events
    assert event["kind"] == "hang" and [r["rank"] for r in event["ranks"]] == [2]
    assert "stopped" in event["ranks"][0]["how"] and event["world_after"] == 2
    assert event["layout_how"] == "your layout, dp rescaled" and event["layout"] == "dp2"
    assert_nothing_left(tmp_path)


def test_below_min_np_it_stops_with_a_clear_message(tmp_path):
    code, out = launch(tmp_path, ["--np", "4", "--min-np", "4", "--hang-timeout", "20",
                                  "--fault", "3:2:kill"])
    assert code == 1, out
    assert "rank 3 killed by signal 9" in out and "--min-np" in out and "3 slot(s) left" in out
    assert "--resume" not in out.split("--min-np")[0]       # no checkpoint yet at step 2
    _, steps, events, final = merged(tmp_path)
    assert final["stopped"] and [r["step"] for r in steps] == [0, 1]
    assert_nothing_left(tmp_path)


@pytest.mark.slow     # a host lost and a job grown: the supervisor's other paths; sigkill and a hang run by default
def test_a_failed_host_leaves_the_job(tmp_path, oracle):
    """Two hosts of 2 slots: rank 3 (on localhost-b) exits with status 3; the host goes,
    2 slots are left on localhost-a."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost-a 2\nlocalhost-b 2\n")
    code, out = launch(tmp_path, ["--np", "4", "--hosts", str(hosts), "--hang-timeout", "20",
                                  "--fault", "3:6:exit"])
    assert code == 0, out
    _, steps, events, _ = merged(tmp_path)
    assert_same_curve(steps, oracle)
    (event,) = events
    assert event["ranks"] == [{"rank": 3, "how": "exited with status 3"}]
    assert event["hosts_removed"] == ["localhost-b"] and event["world_after"] == 2
    assert_nothing_left(tmp_path)


@pytest.mark.slow     # a host lost and a job grown: the supervisor's other paths; sigkill and a hang run by default
def test_more_slots_in_the_hosts_file_grow_the_job_from_2_to_4(tmp_path, oracle):
    """Rank 0 stalls after step 3 (``hold``) until the supervisor's Ctrl-C: the test adds
    a host meanwhile; the job saves step 3, and attempt 2 runs on 4 ranks from there."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost-a 2\n")
    proc = start(tmp_path, ["--np", "4", "--hosts", str(hosts), "--poll-hosts", "0.2",
                            "--hang-timeout", "60", "--fault", "0:3:hold"], ["--save-every", "4"])
    try:
        wait_for_step(tmp_path / "attempt-1" / "rank0", 3)
        hosts.write_text("localhost-a 2\nlocalhost-b 2\n")
    finally:
        code, out = finish(proc, tmp_path)
    assert code == 0, out
    _, steps, events, _ = merged(tmp_path)
    assert_same_curve(steps, oracle)
    (event,) = events
    assert event["kind"] == "scale_up" and (event["world_before"], event["world_after"]) == (2, 4)
    assert event["resume_step"] == 3 and event["steps_redone"] == 0
    assert [r["world_size"] for r in steps] == [2] * 3 + [4] * 9
    assert_nothing_left(tmp_path)


def test_max_restarts_zero_stops_at_the_first_failure(tmp_path):
    code, out = launch(tmp_path, ["--np", "2", "--max-restarts", "0", "--hang-timeout", "20",
                                  "--fault", "0:2:exit"])
    assert code == 1 and "rank 0 exited with status 3" in out and "--max-restarts 0" in out, out
    assert_nothing_left(tmp_path)


def test_a_terminated_supervisor_leaves_no_process(tmp_path):
    """SIGTERM to the supervisor while rank 1 stalls: it kills the attempt, then exits."""
    proc = start(tmp_path, ["--np", "2", "--hang-timeout", "60", "--fault", "1:2:hold"], [])
    try:
        wait_for_step(tmp_path / "attempt-1" / "rank1", 2)
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out = finish(proc, tmp_path)
    assert code == 128 + signal.SIGTERM, out
    assert_nothing_left(tmp_path)


def test_an_error_of_the_training_command_is_not_restarted(tmp_path):
    """Every rank refuses the same input: the job's own error, not a rank failure.  (A
    corpus too short for the sequence is found when the ranks open it; a missing one the
    supervisor refuses itself, before it starts anything.)"""
    short = tmp_path / "short.txt"
    short.write_text("abc")
    code, out = launch(tmp_path, ["--np", "2"], ["--data", str(short)])
    assert code == 1 and "not a rank failure, so no restart" in out, out
    assert "too short for --seq-len" in out and not (tmp_path / "attempt-2").exists()
    assert_nothing_left(tmp_path)


def test_a_missing_corpus_is_refused_before_any_attempt(tmp_path):
    code, out = launch(tmp_path, ["--np", "2"], ["--data", str(tmp_path / "missing")])
    assert code == 2 and "no such file or folder" in out, out
    assert not (tmp_path / "attempt-1").exists()
    assert_nothing_left(tmp_path)
