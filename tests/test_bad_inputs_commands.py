"""Every command besides train's own table (tests/test_bad_inputs.py) answers a bad input —
a number out of range, a nonsensical count, a missing or corrupt file, an output path it
cannot write — with one line and exit 2, before any work; and train refuses a run the
memory model says cannot fit."""
import json
import os
import re
import subprocess
import sys

import pytest

from minipar import cli, paths
from minipar.config import ConfigError, TrainConfig
from minipar.config.probes import check_outputs
from tests.mpirun import REPO

TINY = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "2", "--seq-len", "8"]
RUN = ["--steps", "3", "--batch-size", "4", "--quiet", "--eval-batches", "0"]

# (argv, what the one line must say); {name} is a path from the `inputs` fixture
CASES = [
    (["plan", "--ranks", "0"], "--ranks must be >= 1, got 0"),
    (["plan", "--ranks", "2", "--nodes", "3"], "--nodes 3 is more than --ranks 2"),
    (["plan", "--ranks", "2", "--nodes", "0"], "--nodes must be >= 1"),
    (["plan", "--ranks", "2", "--top", "0"], "--top must be >= 1"),
    (["plan", "--ranks", "2", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["plan", "--ranks", "2", "--vocab", "-3"], "--vocab must be >= 1"),
    (["plan", "--ranks", "2", "--mem-per-rank", "nan"], "--mem-per-rank must be a finite number > 0"),
    (["plan", "--ranks", "2", "--model", "huge"], "unknown --model 'huge'"),
    (["plan", "--ranks", "2", "--model", "tiny", "--n-head", "3"], "--d-model 64 must be divisible by --n-head 3"),
    (["plan", "--ranks", "2", "--profile", "{missing}"], "no profile"),
    (["plan", "--ranks", "2", "--profile", "{garbage}"], "not a readable profile JSON"),
    (["plan", "--ranks", "2", "--json", "{file}/x.json"], "--json {file}/x.json: its folder"),
    (["plan", "--ranks", "x"], "argument --ranks: invalid int value: 'x'"),
    (["plan", "--ranks", "2", "--precision", "fp8"], "argument --precision: invalid choice"),
    (["report", "{missing}", "--out", "{fresh}"], "no such file"),
    (["report", "{folder}", "--out", "{fresh}"], "is a directory, not a file"),
    (["report", "{garbage}", "--out", "{fresh}"], "line 1 is not a log record"),
    (["report", "{number}", "--out", "{fresh}"], "not a JSON object"),
    (["report", "{header_only}", "--out", "{fresh}"], "no step records"),
    (["report", "{log}", "--out", "{file}"], "--out {file}: exists and is not a directory"),
    (["report", "{log}", "--out", "{file}/sub"], "--out {file}/sub: cannot write there"),
    (["report", "{log}", "--out", "{fresh}", "--label", "a", "--label", "b"], "2 --label for 1 logs"),
    (["report", "{log}"], "the following arguments are required: --out"),
    (["calibrate", "--repeat", "0"], "--repeat must be >= 1"),
    (["calibrate", "--seq-len", "0"], "--seq-len must be >= 1"),
    (["calibrate", "--model", "nope"], "unknown --model 'nope'"),
    (["calibrate", "--n-head", "5"], "must be divisible by --n-head 5"),
    (["calibrate", "--out", "{folder}"], "is a directory; give a file name"),
    (["calibrate", "--out", "{file}/p.json"], "does not exist"),
    (["launch", "--np", "0", "--", "train"], "--np must be >= 1, got 0"),
    (["launch", "--np", "2", "--min-np", "3", "--", "train"], "need 1 <= --min-np (3) <= --np (2)"),
    (["launch", "--np", "2"], "give the training command after '--'"),
    (["launch", "--np", "2", "--max-restarts", "-1", "--", "train"], "--max-restarts must be >= 0"),
    (["launch", "--np", "2", "--hang-timeout", "0", "--", "train"], "--hang-timeout must be a finite number > 0"),
    (["launch", "--np", "2", "--poll-hosts", "nan", "--", "train"], "--poll-hosts must be a finite number > 0"),
    (["launch", "--np", "2", "--mtbf", "-1", "--", "train"], "--mtbf must be a finite number > 0"),
    (["launch", "--np", "2", "--hosts", "{missing}", "--", "train"], "--hosts {missing}: no such file"),
    (["launch", "--np", "2", "--run-dir", "{file}/run", "--", "train"], "--run-dir {file}/run: cannot write there"),
    (["bench", "comm", "--factor", "1"], "--factor must be >= 2, got 1"),
    (["bench", "comm", "--min-size", "abc"], "--min-size 'abc' is not a size"),
    (["bench", "comm", "--min-size", "1M", "--max-size", "1K"], "--min-size 1M is larger than --max-size 1K"),
    (["bench", "comm", "--max-size", "1000G"], "GiB per rank"),
    (["bench", "comm", "--algorithms", "ring,nope"], "--algorithms: unknown 'nope'"),
    (["bench", "comm", "--algorithms", ","], "--algorithms is empty"),
    (["bench", "comm", "--dtype", "bool"], "--dtype 'bool' is not a numeric dtype"),
    (["bench", "comm", "--budget", "0"], "--budget must be a finite number > 0"),
    (["bench", "comm", "--max-iters", "0"], "--max-iters must be >= 1"),
    (["bench", "comm", "--ranks-per-node", "0"], "--ranks-per-node must be >= 1"),
    (["bench", "comm", "--json", "{file}/b.json"], "--json {file}/b.json: its folder"),
    (["bench", "attention", "--cpu-sizes", "0"], "--cpu-sizes must be >= 1"),
    (["bench", "attention", "--cpu-sizes", "1000000"], "dense attention needs about"),
    (["bench", "attention", "--tokens", "0"], "--tokens must be >= 1"),
    (["bench", "attention", "--head-dims", "48"], "--head-dims 48 does not divide --width 2048"),
    (["bench", "attention", "--cpu-repeats", "0"], "--cpu-repeats must be >= 1"),
    (["bench", "attention", "--sizes", "1,x"], "argument --sizes: invalid int_list value"),
    (["profile", *TINY, "--json", "{file}/p.json"], "--json {file}/p.json: its folder"),
    (["profile", *TINY, "--top", "0"], "--steps and --top must be >= 1"),
    (["profile", *TINY, "--data", "stdlib-bytes", "--tp", "3"], "world size 1 != dp·tp·pp = ?·3·1"),
    (["sample", "--resume", "{file}"], "--resume {file}"),
    (["checkpoint", "inspect", "{missing}"], "no checkpoint in {missing}"),
    (["checkpoint", "consolidate", "{missing}"], "consolidate needs OUT"),
    (["checkpoint", "upgrade", "{file}", "{fresh}"], "no checkpoint in {file}"),
    (["sample", "--resume", "{missing}", "--seed", "-1"], "--seed must be >= 0"),
    (["cluster", "up", "--nodes", "0", "--ranks-per-node", "1", "--inter-gbps", "1"], "--nodes must be between 1"),
    (["cluster", "up", "--nodes", "2", "--ranks-per-node", "0", "--inter-gbps", "1"], "--ranks-per-node must be >= 1"),
    (["cluster", "up", "--nodes", "2", "--ranks-per-node", "1", "--inter-gbps", "nan"], "--inter-gbps must be a number"),
    (["cluster", "up", "--nodes", "x", "--ranks-per-node", "1", "--inter-gbps", "1"], "invalid int value: 'x'"),
    (["cluster", "status", "--prefix", "BAD!"], "--prefix must be 1-8 lowercase letters"),
    (["cluster", "frob"], "invalid choice: 'frob'"),
    (["cluster", "run", "--placement", "diagonal", "--", "train"], "invalid choice: 'diagonal'"),
    (["cluster", "fail-node", "x"], "invalid int value: 'x'"),
    (["tokenize", "--vocab", "100", "--out", "{fresh}"], "--vocab must be in [257,"),
    (["tokenize", "--vocab", "x", "--out", "{fresh}"], "argument --vocab: invalid int value: 'x'"),
    (["tokenize", "--val-fraction", "0", "--out", "{fresh}"], "--val-fraction must be in (0, 1)"),
    (["tokenize", "--workers", "0", "--out", "{fresh}"], "--shard-tokens and --workers must be >= 1"),
    (["tokenize", "--out", "{file}"], "exists and is not a folder"),
    (["tokenize", "--out", "{file}/sub"], "--out {file}/sub: cannot write there"),
    (["tokenize", "--data", "{missing}", "--out", "{fresh}"], "no such file or folder"),
    (["plan", "--ranks", "4", "--placements", "diagonal"], "--placements must be block, cyclic"),
]


def _ids(cases):
    return [" ".join(argv)[:70] for argv, _ in cases]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    t = tmp_path_factory.mktemp("inputs")
    (t / "afile").write_text("not a folder")
    (t / "garbage.json").write_bytes(b"{not json\n")
    (t / "number.json").write_text("5\n")
    (t / "header.json").write_text(json.dumps({"header": {"layout": "single"}}) + "\n")
    (t / "log.json").write_text(json.dumps({"step": 0, "loss": 5.0, "step_time_s": 0.1}) + "\n")
    return {"missing": t / "nope.json", "file": t / "afile", "folder": t,
            "garbage": t / "garbage.json", "number": t / "number.json",
            "header_only": t / "header.json", "log": t / "log.json", "fresh": t / "out"}


def one_line(err, command):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"minipar {command}"), err
    return lines[0]


@pytest.mark.parametrize("argv,message", CASES, ids=_ids(CASES))
def test_bad_input_is_one_line_and_exit_2(inputs, argv, message, capsys):
    argv = [a.format(**inputs) for a in argv]
    try:
        code = cli.main(argv)           # a command that returns its status ...
    except SystemExit as stop:          # ... or one stopped by the CLI's one line
        code = stop.code
    assert code == 2
    command = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    line = one_line(capsys.readouterr().err, command)
    assert message.format(**inputs) in line
    assert not os.path.exists(inputs["fresh"])              # nothing written before refusing


# Four representative refusals through the real command line (a fresh process each)
def minipar(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "minipar", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


COMMAND_LINE_ROWS = [
    (["train", "--data", "stdlib-bytes", "--model", "tiny", "--seq-len", "100000"], "it would fit with --attention flash"),
    (["train", *TINY, *RUN, "--log-json", "/proc/nope/x.json"], "--log-json /proc/nope/x.json: its folder"),
    (["report", "missing.json", "--out", "{tmp}/out"], "LOG missing.json: no such file"),
    (["plan", "--ranks", "0"], "--ranks must be >= 1, got 0"),
]


@pytest.mark.parametrize("argv,message", COMMAND_LINE_ROWS, ids=_ids(COMMAND_LINE_ROWS))
def test_command_line_refusals_are_one_line(tmp_path, argv, message):
    proc = minipar(*[a.format(tmp=tmp_path) for a in argv])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in one_line(proc.stderr, argv[0])
    assert not os.path.exists(tmp_path / "out")


BAD_TRAIN_FLAGS = [
    (["--mem-per-rank", "0"], "--mem-per-rank must be a finite number > 0"),
    (["--mem-per-rank", "nan"], "--mem-per-rank must be a finite number > 0"),
    (["--mem-per-rank", "4", "--skip-memory-check"], "drop one"),
    (["--log-json", "{tmp}"], "--log-json {tmp}: is a directory"),
    (["--save", "/proc/nope/ckpt"], "--save /proc/nope/ckpt: cannot write there"),
]


@pytest.mark.parametrize("flags,message", BAD_TRAIN_FLAGS, ids=_ids(BAD_TRAIN_FLAGS))
def test_new_train_flags_and_outputs(tmp_path, flags, message):
    proc = minipar("train", *TINY, *RUN, *[f.format(tmp=tmp_path) for f in flags])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message.format(tmp=tmp_path) in one_line(proc.stderr, "train")


def test_trace_is_probed_with_the_other_outputs(tmp_path):
    config = TrainConfig(pp=2, trace=str(tmp_path / "no" / "t.json"))
    with pytest.raises(ConfigError, match="`trace` .*its folder .* does not exist"):
        check_outputs(config)


def test_the_readmes_outputs_pass_in_a_fresh_checkout(tmp_path):
    """`--save runs/stdlib --log-json runs/stdlib.json` with no runs/ yet: the save folder
    is made first, so the log's folder exists when it is probed (the README's command)."""
    runs = tmp_path / "runs"
    check_outputs(TrainConfig(model="tiny", save=str(runs / "stdlib"), log_json=str(runs / "stdlib.json")))
    assert os.path.isdir(runs / "stdlib") and not os.path.exists(runs / "stdlib.json")


def test_probes_leave_what_they_find(tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_text("earlier run\n")
    paths.probe_output_file(kept)
    assert kept.read_text() == "earlier run\n"                 # appended to nothing, not truncated
    paths.probe_output_file(tmp_path / "new.json")
    paths.probe_output_dir(tmp_path / "d" / "e")
    assert sorted(os.listdir(tmp_path)) == ["d", "kept.json"]  # no probe file left behind
    assert os.listdir(tmp_path / "d" / "e") == []
    with pytest.raises(paths.PathError, match="needs about"):
        paths.probe_output_file(tmp_path / "big", need_bytes=2 ** 62)


PEAK = re.compile(r"predicts a peak of ([0-9.]+) (KiB|MiB|GiB)")


def _predicted(flags):
    """The predicted peak, from train's refusal under a 1 MiB limit."""
    proc = minipar("train", *flags, "--mem-per-rank", 2 ** -10)
    value, unit = PEAK.search(one_line(proc.stderr, "train")).groups()
    return float(value) * {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}[unit]


def test_refused_at_110_percent_runs_at_90(tmp_path):
    """The same run: refused when its predicted peak is 110% of --mem-per-rank, run at 90%;
    the log keeps the prediction, the limit and the measured peak RSS side by side.  On the
    byte corpus: with the BPE default the check leaves out ~55 MiB the first steps add
    (peak RSS / check 1.49 for this model; the byte corpus's count covered it)."""
    flags = [*TINY, *RUN, "--data", "stdlib-bytes"]
    predicted = _predicted(flags)
    over = minipar("train", *flags, "--mem-per-rank", predicted / 1.1 / 2 ** 30)
    assert over.returncode == 2 and "but a rank may use" in one_line(over.stderr, "train")
    log = tmp_path / "log.json"
    ran = minipar("train", *flags, "--mem-per-rank", predicted / 0.9 / 2 ** 30, "--log-json", log)
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in open(log)]
    header, final = lines[0]["header"], lines[-1]["final"]
    assert header["mem_limit_bytes"] == pytest.approx(predicted / 0.9, rel=1e-3)
    assert header["predicted_peak_bytes"] == pytest.approx(0.9 * header["mem_limit_bytes"], rel=0.02)
    rss = final["peak_rss_bytes_per_rank"][0]         # what the process really held
    assert 0.75 < header["predicted_peak_bytes"] / rss < 1.25, (header, final)
