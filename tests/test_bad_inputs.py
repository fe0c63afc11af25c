"""Nothing lost, nothing silent: every bad input to train and sample gets one clear line
(no traceback), a non-zero exit, nothing trained, and the previous checkpoint untouched;
a hung rank ends the job; Ctrl-C saves a checkpoint that resumes exactly."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from minipar import checkpoint
from minipar.cli import build_parser
from minipar.cli.run_config import config_from_flags
from minipar.cli_checks import as_flags
from minipar.config import ConfigError, TrainConfig
from minipar.nn import GPTConfig
from minipar.observe.runlog import step_records
from tests.cli import write_full
from tests.mpirun import REPO, run_mpi

TINY = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "2", "--seq-len", "8"]
RUN = ["--steps", "4", "--batch-size", "4", "--quiet", "--eval-batches", "0", "--seed", "0"]


def minipar(*args, timeout=60):
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "minipar", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def digest(directory):
    """One hash of every file under ``directory`` (names and bytes)."""
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, directory).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A checkpoint at step 3 of a 4-step run (fp32), to resume and to keep intact."""
    d = tmp_path_factory.mktemp("good") / "ckpt"
    proc = minipar("train", *TINY, *RUN, "--stop-at", "3", "--save", d)
    assert proc.returncode == 0, proc.stderr
    return d


def _edited(tmp_path, good, edit):
    """A copy of the good checkpoint with a valid index but edited contents."""
    params, state, meta = checkpoint.load_full(good)
    edit(params, meta)
    out = tmp_path / "edited"
    write_full(out, params, state, meta)
    return out


def _nan_weight(params, meta):
    params["ln_f.weight"] = params["ln_f.weight"] * np.nan


BAD_TRAIN = [  # (flags, what the one line must say); {good} is the step-3 checkpoint
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    (["--lr", "-1"], "--lr must be a finite number > 0"),
    (["--grad-clip", "-1"], "--grad-clip must be a finite number >= 0"),
    (["--eval-batches", "-1"], "--eval-batches must be >= 0"),
    (["--warmup", "-5"], "--warmup must be >= 0"),
    (["--save-every", "-1"], "--save-every must be >= 0"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--n-head", "0"], "--n-head must be >= 1"),
    (["--stop-at", "-1"], "--stop-at must be in [1, steps = 4]"),
    (["--hang-timeout", "-1"], "--hang-timeout must be >= 0"),
    (["--data", "{missing}"], "no such file or folder"),
    (["--data", "{empty}"], "holds 0 bytes"),
    (["--data", "{ten}", "--seq-len", "16"], "corpus of 10 bytes is too short for --seq-len 16"),
    (["--save", "{file}/sub"], "--save"),
    (["--resume", "{good}", "--stop-at", "2", "--save", "{good}"], "--stop-at 2 is not after the resumed step 3"),
    (["--resume", "{good}", "--steps", "2", "--stop-at", "2", "--save", "{good}"], "past --steps 2"),
    (["--resume", "{good}", "--precision", "fp64", "--save", "{good}"], "written by a fp32 run"),
    (["--resume", "{nan}", "--save", "{good}"], "ln_f.weight holds non-finite values"),
    (["--resume", "{deleted}", "--save", "{good}"], "missing ['ln_f.bias']"),
    (["--resume", "{reshaped}", "--save", "{good}"], "wpe.weight has shape (4, 16)"),
    (["--resume", "{corrupt}", "--save", "{good}"], "corrupt or unreadable"),
    (["--resume", "{good}", "--d-model", "32", "--save", "{good}"], "another model"),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory, good):
    t = tmp_path_factory.mktemp("inputs")
    (t / "empty.txt").write_bytes(b"")
    (t / "ten.txt").write_bytes(b"0123456789")
    (t / "afile").write_text("not a folder")
    corrupt = t / "corrupt"
    corrupt.mkdir()
    (corrupt / "index.json").write_text('{"format": "minipar-checkpoint-2", "tens')

    def drop(params, meta):
        del params["ln_f.bias"]

    def reshape(params, meta):
        params["wpe.weight"] = params["wpe.weight"][:4]
    return {"missing": t / "nope.txt", "empty": t / "empty.txt", "ten": t / "ten.txt",
            "file": t / "afile", "good": good, "corrupt": corrupt,
            "nan": _edited(t / "n", good, _nan_weight), "deleted": _edited(t / "d", good, drop),
            "reshaped": _edited(t / "r", good, reshape)}


@pytest.mark.parametrize("flags,message", BAD_TRAIN, ids=[" ".join(f) for f, _ in BAD_TRAIN])
def test_bad_train_input_is_one_clear_line(paths, flags, message):
    before = digest(paths["good"])
    flags = [f.format(**paths) for f in flags]
    proc = minipar("train", *TINY, *RUN, *flags)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipar train: "), proc.stderr
    assert message in lines[0] and "Traceback" not in proc.stderr
    assert digest(paths["good"]) == before                  # nothing trained over it


BAD_SAMPLE = [
    (["--tokens", "-1"], "--tokens must be >= 1"),
    (["--temperature", "-1"], "--temperature must be a finite number > 0"),
    (["--top-k", "0"], "--top-k must be >= 1"),
    (["--resume", "{corrupt}"], "corrupt or unreadable"),
    (["--resume", "{nan}"], "non-finite"),
    (["--resume", "{missing}"], "no checkpoint"),
]


@pytest.mark.parametrize("flags,message", BAD_SAMPLE, ids=[" ".join(f) for f, _ in BAD_SAMPLE])
def test_bad_sample_input_is_one_clear_line(paths, flags, message):
    flags = [f.format(**paths) for f in flags]
    if "--resume" not in flags:
        flags += ["--resume", paths["good"]]
    proc = minipar("sample", *flags)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipar sample: ") and message in lines[0], proc.stderr


def test_layout_error_printed_once_under_mpiexec():
    proc = run_mpi(2, ["-m", "minipar", "train", *TINY, *RUN, "--tp", "3"], check=False, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("minipar train: world size 2 != dp·tp·pp = ?·3·1") == 1, proc.stderr


# What a library class would refuse only once it is built (ZeRO-3's synchroniser, the
# watchdog, the model's layers), and model sizes no model runs with: the config checks
# refuse each first, from the flags and the world size alone.
LIBRARY_REFUSALS = [  # (world size, flags, what the one line must say)
    (1, ["--arch", "llama", "--d-ff", "0"], "--d-ff must be >= 1, got 0"),
    (1, ["--arch", "llama", "--d-ff", "-4"], "--d-ff must be >= 1, got -4"),
    (1, ["--arch", "llama", "--n-kv-head", "0"], "--n-kv-head must be >= 1, got 0"),
    (1, ["--arch", "llama", "--rope-theta", "nan"], "--rope-theta must be a finite number > 0, got nan"),
    (1, ["--arch", "llama", "--rope-theta", "0"], "--rope-theta must be a finite number > 0, got 0"),
    (1, ["--arch", "llama", "--d-model", "16", "--n-head", "16"], "head size d_model/n_head = 1 must be even"),
    (1, ["--n-layer", "0"], "--n-layer must be >= 1, got 0"),
    (1, ["--d-model", "0"], "--d-model must be >= 1, got 0"),
    (1, ["--seq-len", "0"], "--seq-len must be >= 1, got 0"),
    (1, ["--d-model", "18", "--n-head", "4"], "--d-model 18 must be divisible by --n-head 4"),
    (1, ["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
    (1, ["--zero", "3", "--tie-weights"], "--zero 3 with --tie-weights is not supported"),
    (2, ["--zero", "3", "--tie-weights"], "--zero 3 with --tie-weights is not supported"),
    (2, ["--hang-timeout", "nan"], "--hang-timeout must be >= 0, got nan"),
]


@pytest.mark.parametrize("size,flags,message", LIBRARY_REFUSALS,
                         ids=[f"{n} {' '.join(f)}" for n, f, _ in LIBRARY_REFUSALS])
def test_library_refusals_come_first_from_the_config_checks(size, flags, message):
    """config_from_flags runs on the flags and the world size alone: no communicator
    exists yet, so nothing can have been sent."""
    args = build_parser().parse_args(["train", *TINY, *RUN, *flags])
    with pytest.raises(ConfigError) as refused:
        config_from_flags(args, rank_and_size=(0, size))
    assert message in as_flags(refused.value)


@pytest.mark.parametrize("n,flags,message", [
    (1, ["--arch", "llama", "--d-ff", "0"], "--d-ff must be >= 1, got 0"),
    (2, ["--zero", "3", "--tie-weights"], "--zero 3 with --tie-weights is not supported"),
], ids=["d-ff 0", "zero 3 tie-weights under mpiexec"])
def test_library_refusals_through_the_command_line(n, flags, message):
    """The real command: exit 2, the one line once, no traceback, nothing trained."""
    proc = run_mpi(n, ["-m", "minipar", "train", *TINY, *RUN, "--steps", "1", *flags],
                   check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipar train: ") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip()


PYTHON_CONFIGS = [  # TrainConfig fields from Python, where no argparse choice guards them
    ({"zero": 4}, "`zero` must be one of 0, 1, 2, 3, got 4"),
    ({"precision": "fp8"}, "`precision`: unknown precision 'fp8'"),
    ({"recompute": "layers"}, "`recompute` must be one of none, full, selective"),
    ({"pp": 2, "schedule": "gpipe"}, "`schedule` must be one of afab, 1f1b, interleaved, zb-h1"),
    ({"comm_algorithm": "butterfly"}, "`comm_algorithm`: unknown all-reduce algorithm 'butterfly'"),
    ({"backend": "torch"}, "`backend` must be one of numpy, cupy"),
    ({"n_layer": 2.5}, "`n_layer` must be a whole number, got 2.5"),
    ({"microbatches": 2.0, "pp": 2}, "`microbatches` must be a whole number, got 2.0"),
]


@pytest.mark.parametrize("fields,message", PYTHON_CONFIGS, ids=[str(f) for f, _ in PYTHON_CONFIGS])
def test_python_configs_are_refused_by_resolve(fields, message):
    config = TrainConfig(model="tiny", n_layer=2, d_model=16, n_head=2, seq_len=8, batch_size=4,
                         data="stdlib-bytes", quiet=True)
    world_size = fields.get("pp", 1)
    with pytest.raises(ConfigError, match=re.escape(message)):
        replace(config, **fields).resolve(world_size)


def test_the_model_config_refuses_a_zero_size_itself():
    """GPTConfig keeps its own checks for Python callers: a 0 is refused, never taken
    for "the default" (None is the default)."""
    llama = GPTConfig(arch="llama", n_head=4, n_kv_head=2)
    assert llama.validate() is llama
    for field, value in (("d_ff", 0), ("n_kv_head", 0), ("rope_theta", float("inf"))):
        with pytest.raises(ValueError, match=f"`{field}` must be"):
            replace(llama, **{field: value}).validate()


def test_non_finite_training_stops_before_saving(tmp_path, good):
    before = digest(good)
    proc = minipar("train", *TINY, *RUN[2:], "--steps", "30", "--lr", "1e4", "--grad-clip", "0",
                   "--resume", good, "--save", good, "--save-every", "1")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ("is nan" in lines[0] or "is inf" in lines[0]), proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr
    params, _, meta = checkpoint.load_full(good)   # saved every step while finite, never after
    assert all(np.isfinite(a).all() for a in params.values())
    stopped_at = int(lines[0].split("step ")[1].split(":")[0])
    assert meta["step"] == stopped_at and (meta["step"] > 3 or digest(good) == before)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    params, state = {"w": np.ones(3)}, {"step": 1, "m": {"w": np.zeros(3)}, "v": {"w": np.zeros(3)}}
    write_full(tmp_path, params, state, {"step": 1})
    (tmp_path / "step-0000002.tmp-99-1").mkdir()           # left by a crash
    (tmp_path / "step-0000002.tmp-99-1" / "rank-00000.bin").write_bytes(b"half")
    before = digest(tmp_path / "step-0000001")

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint.write, "write_pieces", full_disk)
    failure = checkpoint.save(None, tmp_path, 2, {"step": 2}, [])
    assert "No space left on device" in failure and "previous checkpoint is unchanged" in failure
    assert digest(tmp_path / "step-0000001") == before
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-0000001"]   # its tmp and the crash's: gone
    assert checkpoint.latest(tmp_path).endswith("step-0000001")


HANG_S = 120   # a guard, not a speed: a job that never gets there fails instead of hanging


def _two_ranks(*flags):
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "minipar", "train", *map(str, flags)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _ranks_of(marker):
    """PIDs of the Python ranks whose command line holds ``marker`` (not mpiexec's)."""
    pattern = f"^{re.escape(sys.executable)} -m minipar train .*{re.escape(str(marker))}"
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def _wait_until(condition, what):
    """Wait for ``condition()``; HANG_S only turns "never" into a failure."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _wait_for_lines(path, n):
    _wait_until(lambda: os.path.exists(path) and sum(1 for _ in open(path)) >= n,
                f"{path} never reached {n} lines")


def test_a_stopped_rank_ends_the_job(tmp_path):
    log = tmp_path / "log.json"
    proc = _two_ranks(*TINY, "--steps", "100000", "--batch-size", "4", "--quiet",
                      "--hang-timeout", "8", "--log-json", log)
    try:
        _wait_for_lines(log, 4)
        ranks = _ranks_of(log)
        assert len(ranks) == 2, ranks
        victim = ranks[-1]
        os.kill(victim, signal.SIGSTOP)
        _, err = proc.communicate(timeout=HANG_S)     # only the 8 s hang timeout can end it
        assert proc.returncode != 0
        assert "waited 8" in err and "ending the job (hang timeout 8 s)" in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.poll() is not None
    _wait_until(lambda: _ranks_of(log) == [], "a rank was left behind")   # no process left


def test_ctrl_c_saves_a_checkpoint_that_resumes_exactly(tmp_path):
    flags = [*TINY, "--steps", "5000", "--batch-size", "4", "--quiet", "--precision", "fp64",
             "--eval-batches", "0"]
    log, ckpt = tmp_path / "first.json", tmp_path / "ckpt"
    proc = _two_ranks(*flags, "--save", ckpt, "--log-json", log)
    _wait_for_lines(log, 4)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, err
    lines = [l for l in err.strip().splitlines() if l.startswith("minipar train")]
    assert len(lines) == 1 and "interrupted after step" in lines[0] and "Traceback" not in err
    done = checkpoint.load_full(ckpt)[2]["step"]
    first = [r["loss"] for r in step_records(log)]
    assert len(first) == done
    resumed_log = tmp_path / "resumed.json"
    run_mpi(2, ["-m", "minipar", "train", *flags, "--resume", ckpt, "--stop-at", done + 2,
                "--log-json", resumed_log], timeout=120)
    straight_log = tmp_path / "straight.json"
    run_mpi(2, ["-m", "minipar", "train", *flags, "--stop-at", done + 2, "--log-json", straight_log],
            timeout=120)
    straight = [r["loss"] for r in step_records(straight_log)]
    resumed = [r["loss"] for r in step_records(resumed_log)]
    np.testing.assert_allclose(first + resumed, straight, rtol=1e-12)
